"""Renders the demo's TensorBoard curves to a PNG (the README's picture).

Reads the event files with TensorBoard's own reader, so the picture shows
exactly what TensorBoard would.

    python scripts/plot_demo.py runs/demo-YYYYmmdd-HHMMSS docs/demo_curves.png
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

PANELS = [
    ("loss", ["loss.mean", "loss.min", "loss.max"]),
    ("gradient norm (watch)", ["0.weight.grad.norm", "2.weight.grad.norm"]),
    ("update ratio ||dW||/||W|| (watch)", ["0.weight.update.ratio", "2.weight.update.ratio"]),
]


HISTOGRAM = "0.weight.update"


def plot_histograms(axis, events):
    """A few of the weight-update histograms, as TensorBoard's distribution
    of bucket counts over each bucket's upper edge."""
    histograms = events.Histograms(HISTOGRAM)
    for point in histograms[:: max(1, len(histograms) // 4)]:
        h = point.histogram_value
        axis.step(h.bucket_limit[:-1], h.bucket[:-1], where="pre", label=f"step {point.step}")
    axis.set_xscale("symlog", linthresh=1e-4)
    axis.set_title("layer 0 weight updates (histograms)")
    axis.set_xlabel("dW (bucket upper edge)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)


def main(run_dir, out_path):
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    figure, axes = plt.subplots(1, len(PANELS) + 1, figsize=(17, 3.4))
    for axis, (title, tags) in zip(axes, PANELS):
        for tag in tags:
            points = events.Scalars(tag)
            axis.plot([p.step for p in points], [p.value for p in points], label=tag)
        axis.set_title(title)
        axis.set_xlabel("training step")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    plot_histograms(axes[-1], events)
    figure.suptitle("torch_monitor demo, read back from its TensorBoard files")
    figure.tight_layout()
    figure.savefig(out_path, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
