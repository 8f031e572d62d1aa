"""The server buffer's two accumulators side by side, by union density.

Run ``python -m benchmarks.buffer_accumulators`` (writes
``benchmarks/results/buffer_accumulators.json`` and ``.png``; ``--quick`` for a short
run that only prints).

One aggregation is ``K`` calls of :meth:`~fedsync.aggregation.UpdateBuffer.add` with
sparse updates of one tensor and one :meth:`~fedsync.aggregation.UpdateBuffer.take`.
Each update keeps a uniformly random ``rho`` of the positions, chosen so that the
union of the ``K`` supports has the requested density (``1 - (1 - rho)^K``). The
``sparse`` and ``dense`` accumulators (and ``auto``, which picks by
:data:`~fedsync.aggregation.buffer.DENSE_ABOVE`) run on the same updates, interleaved
repeat by repeat, so machine noise falls on all of them alike; the table reports the
median time per aggregation, its interquartile range, and the sparse/dense ratio. The
aggregates of the three are checked equal bit for bit on every point.

Time is measured twice: the CPU time of the calling thread (``time.thread_time``; torch
runs one thread here, so every operation runs on it), which a loaded machine's
preemption does not inflate, and the wall clock. The ratios and the crossover use the
CPU time: on the shared machine these numbers were taken on (load average 30-50 on 2
cores) the wall clock mostly measures the scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedsync.aggregation import validate_update
from fedsync.aggregation.buffer import DENSE_ABOVE, Accumulator, UpdateBuffer
from fedsync.reports.progress_bar import track
from fedsync.updates import SparseTensor, TensorSpec

RESULTS = Path(__file__).resolve().parent / "results"
UNION_DENSITIES = (0.0003, 0.001, 0.003, 0.01, 0.02, 0.03, 0.1, 0.3)
KINDS: tuple[Accumulator, ...] = ("sparse", "dense", "auto")


def updates_for(
    numel: int, union: float, k: int, seed: int
) -> tuple[TensorSpec, list[dict[str, SparseTensor]]]:
    """``k`` random sparse updates of one ``numel`` tensor whose union has density about
    ``union``."""
    spec = TensorSpec("w", (numel,))
    rho = 1.0 - (1.0 - union) ** (1.0 / k)
    gen = torch.Generator().manual_seed(seed)
    keep = max(1, round(rho * numel))
    out = []
    for _ in range(k):
        positions = torch.randperm(numel, generator=gen)[:keep].sort().values
        out.append({"w": SparseTensor(spec, positions, torch.randn(keep, generator=gen))})
    return spec, out


def aggregate(
    spec: TensorSpec, updates: list[dict[str, SparseTensor]], kind: Accumulator
) -> tuple[float, float, torch.Tensor, str]:
    """CPU and wall seconds for one aggregation (``K`` adds and the take) with a warm
    buffer, the aggregate, and the kind that held the tensor at the take."""
    buffer = UpdateBuffer({"w": spec}, capacity=len(updates), accumulator=kind)
    valid = [validate_update(update, {"w": spec}) for update in updates]  # not timed
    for update in valid:  # warm-up aggregation: allocations, first-touch pages
        buffer.add(update, 0.5)
    buffer.take()
    cpu, wall = time.thread_time(), time.perf_counter()
    for update in valid:
        buffer.add(update, 0.5)
    result = buffer.take()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    return cpu, wall, result.update["w"], buffer.last_kinds["w"]


def measure(numel: int, k: int, union: float, repeats: int) -> dict[str, Any]:
    """One row: every accumulator on the same updates, ``repeats`` times interleaved."""
    spec, updates = updates_for(numel, union, k, seed=k * 1000 + round(union * 1e6))
    held = torch.unique(torch.cat([u["w"].indices for u in updates])).numel()
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    walls: dict[str, list[float]] = {kind: [] for kind in KINDS}
    results: dict[str, torch.Tensor] = {}
    chosen = ""
    for _ in range(repeats):
        for kind in KINDS:
            cpu, wall, aggregate_w, held_as = aggregate(spec, updates, kind)
            times[kind].append(cpu)
            walls[kind].append(wall)
            results[kind] = aggregate_w
            if kind == "auto":
                chosen = held_as
    bits = {kind: results[kind].view(torch.int32) for kind in KINDS}
    identical = all(torch.equal(bits["dense"], bits[kind]) for kind in KINDS)
    row: dict[str, Any] = {
        "numel": numel,
        "k": k,
        "union_density": held / numel,
        "update_density": updates[0]["w"].nnz / numel,
        "auto_chose": chosen,
        "identical": identical,
    }
    for kind in KINDS:
        q = statistics.quantiles(times[kind], n=4)
        row[f"{kind}_ms"] = 1e3 * statistics.median(times[kind])
        row[f"{kind}_iqr_ms"] = [1e3 * q[0], 1e3 * q[2]]
        row[f"{kind}_wall_ms"] = 1e3 * statistics.median(walls[kind])
    row["sparse_over_dense"] = row["sparse_ms"] / row["dense_ms"]
    row["auto_over_best"] = row["auto_ms"] / min(row["sparse_ms"], row["dense_ms"])
    return row


def crossover(rows: list[dict[str, Any]]) -> float | None:
    """The lowest union density from which on the dense accumulator is always faster."""
    ordered = sorted(rows, key=lambda r: r["union_density"])
    for i, row in enumerate(ordered):
        if all(r["sparse_over_dense"] >= 1.0 for r in ordered[i:]):
            return float(row["union_density"])
    return None


def plot(report: dict[str, Any], path: Path) -> None:
    """Sparse/dense time ratio against union density, one line per size and K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for numel in report["numels"]:
        for k in report["ks"]:
            rows = [r for r in report["rows"] if r["k"] == k and r["numel"] == numel]
            ax.plot(
                [r["union_density"] for r in rows],
                [r["sparse_over_dense"] for r in rows],
                marker="o",
                label=f"{numel / 1e6:g}M elements, K = {k}",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(report["dense_above"], color="red", ls="--", lw=0.8, label="DENSE_ABOVE")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("union density of the K updates")
    ax.set_ylabel("sparse / dense time per aggregation")
    ax.set_title("buffer accumulators: sparse / dense time (CPU, 1 thread)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numels", default="1000000,4000000", help="tensor sizes")
    parser.add_argument("--ks", default="3,10", help="comma-separated K values")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small, print only")
    parser.add_argument("--out", default=str(RESULTS / "buffer_accumulators.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    numels = [200_000] if args.quick else [int(n) for n in args.numels.split(",")]
    repeats = 3 if args.quick else args.repeats
    ks = [int(k) for k in args.ks.split(",")]
    rows = []
    grid = [(n, k, union) for n in numels for k in ks for union in UNION_DENSITIES]
    for numel, k, union in track(grid, "accumulators"):
        rows.append(measure(numel, k, union, repeats))
        row = rows[-1]
        print(
            f"n={numel} K={k:3d} union={row['union_density']:.4f}  "
            f"sparse {row['sparse_ms']:8.3f} ms  "
            f"dense {row['dense_ms']:8.3f} ms  ratio {row['sparse_over_dense']:6.2f}  "
            f"auto {row['auto_ms']:8.3f} ms ({row['auto_chose']})  identical={row['identical']}"
        )
    report: dict[str, Any] = {
        "what": "one aggregation (K adds + take) of one tensor: median thread CPU time of "
        "interleaved repeats (wall clock alongside)",
        "numels": numels,
        "ks": ks,
        "repeats": repeats,
        "threads": 1,
        "dense_above": DENSE_ABOVE,
        "crossover": {
            f"{n}/K={k}": crossover([r for r in rows if r["k"] == k and r["numel"] == n])
            for n in numels
            for k in ks
        },
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "note": "shared, loaded CPU: compare the ratios and their spread",
        },
        "rows": rows,
    }
    print(json.dumps(report["crossover"]))
    if not all(row["identical"] for row in rows):
        print("error: the accumulators disagree")
        return 1
    if not args.quick:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        plot(report, out.with_suffix(".png"))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
