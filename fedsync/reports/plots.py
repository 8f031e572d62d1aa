"""PNG plots of a run's accuracy (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: runs in CI, in Ray workers and over SSH
import matplotlib.pyplot as plt


def plot_accuracy(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    *,
    xlabel: str = "round",
    title: str = "test accuracy",
    target: float | None = None,
) -> Path:
    """Plot accuracy curves, one line per named series, and save a PNG.

    Parameters
    ----------
    series : mapping of str to (x values, accuracies)
        One curve per label (a strategy, a run).
    path : pathlib.Path
        Where to write the PNG; its folder is created.
    xlabel : str
        The x axis (round, simulated seconds, cumulative bytes ...).
    title : str
        The figure title.
    target : float, optional
        Draws a dashed horizontal line at this accuracy.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", markersize=3, label=label)
    if target is not None:
        ax.axhline(target, linestyle="--", color="grey", linewidth=1, label=f"target {target:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
