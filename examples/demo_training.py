"""The demo job: a short training run monitored with torch_monitor.

Trains a small MLP on synthetic regression data on the CPU, the way a
training loop logs: the step is set once per iteration (set_step), and the
loss, the gradient norm and the first layer's weight-update ratio
||dW|| / ||W|| are added to Stats as tensors (no .item(): on a GPU nothing
would wait for the device) over windows of --window steps. The update ratio
comes from a DifferenceMonitor: the optimizer step runs inside an "updater"
module's forward(), and the monitor records how the layer's weight changed
across it; every --histogram-every steps that change is also written as a
histogram (the distribution of the layer's weight updates). Every closed
window becomes a point at its training step in TensorBoard files written by
the native writer, and a summary table is printed at the end.

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


class Updater(torch.nn.Module):
    """Runs one optimizer step in forward(), so a DifferenceMonitor on
    "model.<layer>.weight" sees the weight before and after the update."""

    def __init__(self, model, optimizer):
        super().__init__()
        self.model = model
        self.optimizer = optimizer

    def forward(self):
        self.optimizer.step()


def progress(step, total, loss_stat, width=30):
    # The mean of the last closed window (zeros before the first one closes):
    # reading it waits for nothing.
    mean = loss_stat.get()[monitor.MEAN]
    shown = f"{mean:.4f}" if mean else "(first window open)"
    done = int(width * step / total)
    sys.stdout.write(f"\r  [{'#' * done}{'.' * (width - done)}] step {step}/{total}  window loss {shown}")
    sys.stdout.flush()


def summary_table(events):
    """One row per tag: points, the steps they lie at, first, last, min, max."""
    series = {}
    for event in events:
        for tag, value in event.data.items():
            series.setdefault(tag, []).append((event.step, value))
    header = f"{'tag':<18}{'points':>7}{'at steps':>14}{'first':>10}{'last':>10}{'min':>10}{'max':>10}"
    lines = [header, "-" * len(header)]
    for tag in sorted(series):
        steps = [s for s, _ in series[tag]]
        values = [v for _, v in series[tag]]
        lines.append(
            f"{tag:<18}{len(values):>7}{f'{steps[0]}..{steps[-1]}':>14}{values[0]:>10.4f}"
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
    grad_stat = monitor.Stat("grad_norm", [monitor.MEAN, monitor.MAX], window_steps=args.window)
    ratio_stat = monitor.Stat("update_ratio", [monitor.MEAN, monitor.MAX], window_steps=args.window)

    x, y = make_data()
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    updater = Updater(model, optimizer)
    # PassthroughReducer keeps the last 10 weight differences (dt = 1 step).
    weight_change = monitor.DifferenceMonitor(
        monitor.PassthroughReducer(1.0, duration=9.0), "model.0.weight", updater
    )

    print(f"torch_monitor demo: {args.steps} steps, TensorBoard files in {run_dir}")
    histograms = 0
    start = time.perf_counter()
    for step in range(args.steps):
        monitor.set_step(step)  # every Stat window, event and point follows it
        batch = torch.randint(0, x.shape[0], (512,))
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        updater()  # optimizer.step(), watched by weight_change
        loss_stat.add(loss)  # tensors: every element is one sample, detached
        grad_stat.add(grad_norm)
        ratio_stat.add(weight_change.peek().norm() / model[0].weight.norm())
        if (step + 1) % args.histogram_every == 0:
            writer.add_histogram("update/layer0.weight", weight_change.peek(), step)
            histograms += 1
        if (step + 1) % 20 == 0 or step + 1 == args.steps:
            progress(step + 1, args.steps, loss_stat)
    elapsed = time.perf_counter() - start
    print()

    last_changes = weight_change.dump()  # newest first, one row per step
    weight_change.deregister()
    del loss_stat, grad_stat, ratio_stat  # flushes any partly filled window
    for handle in handles:
        monitor.unregister_event_handler(handle)
    writer.close()

    stat_events = [e for e in received if e.name == monitor.STAT_EVENT]
    print(f"\nTrained {args.steps} steps in {elapsed:.1f} s; {len(stat_events)} stat windows logged.\n")
    print(summary_table(stat_events))
    print(
        f"\nhistogram update/layer0.weight (layer 0's weight change per step): "
        f"{histograms} written, one every {args.histogram_every} steps"
    )
    norms = ", ".join(f"{v:.4f}" for v in last_changes.flatten(1).norm(dim=1).tolist()[:5])
    print(f"\n||dW|| of layer 0 over the last 5 steps (newest first): {norms}")
    print(f"\nSee the curves with:  tensorboard --logdir {args.logdir}")


if __name__ == "__main__":
    main()
