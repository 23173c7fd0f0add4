"""Runs a short training loop with capture_pytorch_counters and renders what
TensorBoard shows of it (docs/pytorch_counters.md's picture).

The loop compiles its model with torch.compile (input shapes that change,
so it compiles again) and talks to a TCPStore every step, as a
checkpointing or elastic agent would; the capture writes each key's window
of 5 steps to a TensorBoardWriter, which TensorBoard's own reader reads back.

    python scripts/plot_pytorch_counters.py docs/pytorch_counters.png
"""

import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

import torch_monitor  # noqa: E402

PREFIX = "pytorch.wait_counter."
# (title, [(key, statistic)], scale, line style): a rarely timed key's
# windows are points, not a curve (each is logged when the key is next timed).
PANELS = [
    ("compilation per window (ms)", [("dynamo_compile", "sum"), ("entire_forward_compile", "sum")], 1e-3, "none"),
    ("TCPStore latency (µs)", [("TCPStore__set", "mean"), ("TCPStore__get", "mean"), ("TCPStore__set", "max")], 1.0, "-"),
]


def train(log_dir):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    writer = torch_monitor.TensorBoardWriter(log_dir)
    writer.register()
    with torch_monitor.capture_pytorch_counters(window_steps=5):
        for step in range(60):
            torch_monitor.set_step(step)
            batch = 8 if step < 20 else (16 if step < 40 else 7 + step % 3)
            loss = compiled(torch.randn(batch, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            store.set(f"progress/{step % 4}", str(step))
            store.get(f"progress/{step % 4}")
    writer.close()


def main(out):
    with tempfile.TemporaryDirectory() as log_dir:
        train(log_dir)
        events = EventAccumulator(log_dir)
        events.Reload()
        tags = set(events.Tags()["scalars"])
        fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 3.6))
        for axis, (title, series, scale, line) in zip(axes, PANELS):
            for key, statistic in series:
                tag = f"{PREFIX}{key}.{statistic}"
                if tag not in tags:
                    continue
                points = events.Scalars(tag)
                axis.plot([p.step for p in points], [p.value * scale for p in points], marker="o", linestyle=line, label=f"{key}.{statistic}")
            axis.set_title(title)
            axis.set_xlabel("training step")
            axis.legend(fontsize=8)
            axis.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1])
