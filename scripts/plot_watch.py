"""Renders what torch_monitor.watch logged in the demo to a PNG
(docs/watch_tensorboard.png).

Reads the demo's event files with TensorBoard's own reader, so the picture
shows exactly what TensorBoard would: per-layer curves of the watch's
statistics over training steps, and the distribution of a layer's gradients
from the histograms it wrote.

    python scripts/plot_watch.py runs/demo-YYYYmmdd-HHMMSS docs/watch_tensorboard.png
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

PARAMETERS = ["0.weight", "0.bias", "2.weight", "2.bias"]
PANELS = [
    ("gradient norm, per parameter", [f"{p}.grad.norm" for p in PARAMETERS], "log"),
    ("update ratio ||dW||/||W||", [f"{p}.update.ratio" for p in PARAMETERS], "log"),
    ("0.weight.grad: rms, abs_max, |mean|", ["0.weight.grad.rms", "0.weight.grad.abs_max", "0.weight.grad.mean"], "log"),
]
HISTOGRAM = "0.weight.grad"


def main(run_dir, out_path):
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    figure, axes = plt.subplots(1, len(PANELS) + 1, figsize=(18, 3.6))
    for axis, (title, tags, scale) in zip(axes, PANELS):
        for tag in tags:
            points = events.Scalars(tag)
            values = [abs(p.value) for p in points] if tag.endswith(".mean") else [p.value for p in points]
            axis.plot([p.step for p in points], values, label=tag + (" (abs)" if tag.endswith(".mean") else ""))
        axis.set_yscale(scale)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("training step")
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    axis = axes[-1]
    histograms = events.Histograms(HISTOGRAM)
    for point in histograms[:: max(1, len(histograms) // 4)]:
        h = point.histogram_value
        axis.step(h.bucket_limit[:-1], h.bucket[:-1], where="pre", label=f"step {point.step}")
    axis.set_xscale("symlog", linthresh=1e-5)
    axis.set_title(f"{HISTOGRAM} (histograms)", fontsize=10)
    axis.set_xlabel("gradient (bucket upper edge)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.suptitle("torch_monitor.watch in the demo, read back from its TensorBoard files")
    figure.tight_layout()
    figure.savefig(out_path, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
