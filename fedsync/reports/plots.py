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


def plot_run(
    evaluations: Sequence[Mapping[str, float]],
    folder: Path,
    name: str,
    *,
    target: float | None = None,
    time_label: str = "simulated time (s)",
) -> list[Path]:
    """The three PNGs every strategy's run writes, from its evaluation entries.

    ``accuracy.png`` (against model version / round), ``accuracy_vs_time.png`` and
    ``accuracy_vs_bytes.png`` (cumulative bytes up + down, and up only). Each entry
    needs ``version``, ``accuracy``, ``sim_time``, ``cumulative_bytes_up`` and
    ``cumulative_bytes_down``.
    """
    if not evaluations:
        return []
    accuracy = [e["accuracy"] for e in evaluations]
    return [
        plot_accuracy(
            {name: ([e["version"] for e in evaluations], accuracy)},
            folder / "accuracy.png",
            xlabel="aggregations (model version)",
            title=f"{name}: test accuracy",
            target=target,
        ),
        plot_accuracy(
            {name: ([e["sim_time"] for e in evaluations], accuracy)},
            folder / "accuracy_vs_time.png",
            xlabel=time_label,
            title=f"{name}: accuracy vs time",
            target=target,
        ),
        plot_accuracy(
            {
                f"{name} (up + down)": (
                    [e["cumulative_bytes_up"] + e["cumulative_bytes_down"] for e in evaluations],
                    accuracy,
                ),
                f"{name} (up only)": ([e["cumulative_bytes_up"] for e in evaluations], accuracy),
            },
            folder / "accuracy_vs_bytes.png",
            xlabel="cumulative bytes",
            title=f"{name}: accuracy vs bytes",
            target=target,
        ),
    ]
