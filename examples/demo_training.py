"""The demo job: a short training run monitored with torch_monitor.

Trains a small MLP on synthetic regression data on the CPU, the way a
training loop logs: the step is set once per iteration (set_step), the loss
is added to a Stat as a tensor (no .item(): on a GPU nothing would wait for
the device), and torch_monitor.watch observes every layer's gradients and
weight updates around the optimizer's steps (their norms, extremes and the
update ratio ||dW|| / ||W||), all over windows of --window steps; every
--histogram-every steps the watch also writes a histogram of each layer's
gradient and weight update. Every closed window becomes a point at its
training step in TensorBoard files written by the native writer, and a
summary table is printed at the end.

    python examples/demo_training.py [--steps 1500] [--window 50] [--histogram-every 100] [--logdir runs]
"""

import argparse
import datetime
import os
import sys
import time

import torch

import torch_monitor as monitor


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--window", type=int, default=50, help="steps per Stat window")
    parser.add_argument("--histogram-every", type=int, default=100, help="steps")
    parser.add_argument("--logdir", default="runs")
    return parser.parse_args()


def make_data(n=4096, features=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    true_w = torch.randn(features, 1, generator=generator)
    y = torch.sin(x @ true_w) + 0.05 * torch.randn(n, 1, generator=generator)
    return x, y


def progress(step, total, loss_stat, width=30):
    # The mean of the last closed window (zeros before the first one closes):
    # reading it waits for nothing.
    mean = loss_stat.get()[monitor.MEAN]
    shown = f"{mean:.4f}" if mean else "(first window open)"
    done = int(width * step / total)
    sys.stdout.write(f"\r  [{'#' * done}{'.' * (width - done)}] step {step}/{total}  window loss {shown}")
    sys.stdout.flush()


# The rows of the summary table: the loss Stat, and for the first layer's
# weight what the watch logs (of its 72 tags, those a reader looks at first).
SUMMARY_TAGS = [
    "loss.mean", "loss.min", "loss.max",
    "0.weight.grad.norm", "0.weight.grad.abs_max", "0.weight.update.ratio", "2.weight.update.ratio",
]


def summary_table(events):
    """One row per tag: points, the steps they lie at, first, last, min, max."""
    series = {}
    for event in events:
        for tag, value in event.data.items():
            series.setdefault(tag, []).append((event.step, value))
    header = f"{'tag':<24}{'points':>7}{'at steps':>14}{'first':>10}{'last':>10}{'min':>10}{'max':>10}"
    lines = [header, "-" * len(header)]
    for tag in SUMMARY_TAGS:
        steps = [s for s, _ in series[tag]]
        values = [v for _, v in series[tag]]
        lines.append(
            f"{tag:<24}{len(values):>7}{f'{steps[0]}..{steps[-1]}':>14}{values[0]:>10.4f}"
            f"{values[-1]:>10.4f}{min(values):>10.4f}{max(values):>10.4f}"
        )
    return "\n".join(lines)


def main():
    args = parse_args()
    torch.manual_seed(0)
    run_dir = os.path.join(args.logdir, "demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    writer = monitor.TensorBoardWriter(run_dir)

    received = []
    handles = [
        monitor.register_event_handler(writer),
        monitor.register_event_handler(received.append),
    ]
    # Windows of args.window training steps: [0, 50), [50, 100), ...
    loss_stat = monitor.Stat("loss", [monitor.MEAN, monitor.MIN, monitor.MAX], window_steps=args.window)

    x, y = make_data()
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # Every layer's gradient (as the optimizer step uses it) and weight update
    # (its change across the step): "0.weight.grad.norm",
    # "0.weight.update.ratio", ... one event per window, and a histogram of
    # each of them every args.histogram_every steps.
    watch = monitor.watch(
        model, optimizer, what=("grad", "update"), window_steps=args.window,
        histograms_every=args.histogram_every, writer=writer,
    )

    print(f"torch_monitor demo: {args.steps} steps, TensorBoard files in {run_dir}")
    start = time.perf_counter()
    for step in range(args.steps):
        monitor.set_step(step)  # every Stat and watch window, event and point follows it
        batch = torch.randint(0, x.shape[0], (512,))
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the watch observes around it
        loss_stat.add(loss)  # a tensor: every element is one sample, detached
        if (step + 1) % 20 == 0 or step + 1 == args.steps:
            progress(step + 1, args.steps, loss_stat)
    elapsed = time.perf_counter() - start
    print()

    watch.remove()  # logs the last window, removes the hooks
    del loss_stat  # logs its last, partly filled window
    for handle in handles:
        monitor.unregister_event_handler(handle)
    writer.close()

    windows = [e for e in received if e.name in (monitor.STAT_EVENT, monitor.WATCH_EVENT)]
    print(f"\nTrained {args.steps} steps in {elapsed:.1f} s; {len(windows)} windows logged.\n")
    print(summary_table(windows))
    histograms = (args.steps - 1) // args.histogram_every + 1
    print(
        f"\nhistograms: {len(watch.keys)} tensors ({', '.join(watch.keys[:2])}, ...), "
        f"{histograms} of each, one every {args.histogram_every} steps"
    )
    print(f"\nSee the curves with:  tensorboard --logdir {args.logdir}")


if __name__ == "__main__":
    main()
