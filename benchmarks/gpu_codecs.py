"""GPU compressors (Triton) against ``torch.topk`` and against the copy bandwidth.

Run on a CUDA machine::

    python -m benchmarks.gpu_codecs                 # 10M and 100M, densities 0.1/0.01/0.001
    python -m benchmarks.gpu_codecs --sizes 1e7     # one size

It writes ``benchmarks/results/gpu_codecs-<device>.json`` (the device name is in
the file and its name). Without CUDA, ``--dry-run`` (alias ``--interpret``) runs
every stage at tiny sizes on CPU tensors under the Triton interpreter, to prove the
script executes; it prints its numbers, marks them ``"dry_run": true`` and writes
nothing unless ``--out`` is given (interpreter timings say nothing about a GPU).

What it measures, per size ``n`` and density ``d`` (``k = round(d n)`` kept), all on
the same standard-normal float32 tensor already on the device:

* ``copy``: ``dst.copy_(src)`` of ``n`` floats (``8 n`` bytes): the bandwidth floor;
* ``torch_topk``: ``torch.topk`` of ``|x|``, sort of the positions, gather, 8-bit
  uniform quantization with torch ops -- the baseline;
* ``fused``: our device pipeline: a stratified sample's order statistic as the
  threshold (DGC), the fused select-and-compact pass, per-chunk 8-bit uniform
  quantization, and the index section (Elias-Fano or Rice, whichever is smaller)
  built on the device; each stage is also timed on its own;
* ``exact_topk``: our exact top-k (sample-guided candidates + ``torch.topk`` on
  them) plus the same quantization -- the same set as ``torch.topk``'s, ties aside;
* ``aggregate``: decode + scatter-add of ``--updates`` (default 100) sparse updates
  of ``k`` entries (8-bit uniform codes, fused dequantization) into a dense
  ``n``-float buffer, against torch's dequantize + ``index_add_``; and a sweep at
  a fixed ``nnz`` over both model sizes, which shows the cost follows ``nnz``.

Bytes each stage must move are counted (reads plus writes, a scattered access as a
32-byte sector) and divided by its time; ``efficiency`` is that rate over the
measured copy rate. Times are CUDA-event medians over ``--reps`` runs after
``--warmup`` runs; host synchronisations a stage needs (a data-dependent count)
are inside its time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedsync.reports.provenance import provenance

RESULTS_DIR = Path(__file__).parent / "results"
SECTOR = 32
"""Bytes a scattered load or store costs (one DRAM sector)."""

TARGET = {"n": 100_000_000, "density": 0.01, "speedup_vs_topk": 10.0, "efficiency": 0.5}


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


@dataclass
class Timer:
    """Median wall time of a callable: CUDA events on a GPU, perf_counter elsewhere."""

    device: torch.device
    warmup: int = 3
    reps: int = 10

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        times = []
        for _ in range(self.reps):
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


@dataclass
class Stage:
    """One timed stage: seconds, and the bytes it has to move."""

    seconds: float
    bytes_moved: int
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self, copy_bps: float) -> dict[str, Any]:
        rate = self.bytes_moved / self.seconds if self.seconds > 0 else 0.0
        return {
            "seconds": self.seconds,
            "bytes_moved": self.bytes_moved,
            "GBps": rate / 1e9,
            "efficiency": rate / copy_bps if copy_bps else 0.0,
            **self.extra,
        }


# --------------------------------------------------------------------------------------
# The compress paths
# --------------------------------------------------------------------------------------


def torch_topk_compress(x: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Baseline: torch.topk selection, sorted positions, 8-bit uniform codes (torch)."""
    _, idx = torch.topk(x.abs(), k, sorted=False)
    idx, _ = torch.sort(idx)
    values = x[idx]
    return (idx, *torch_uniform8(values, 1024))


def torch_uniform8(values: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    n = values.numel()
    nchunks = -(-n // chunk)
    pad = nchunks * chunk - n
    table = torch.cat([values, values[-1:].expand(pad)]) if pad else values
    table = table.view(nchunks, chunk)
    lo, hi = table.amin(1), table.amax(1)
    scale = ((hi.double() - lo.double()) / 255).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((table - lo[:, None]) / safe[:, None]).round_().clamp_(0, 255).to(torch.uint8)
    return codes.view(-1)[:n], lo, scale


def sample_threshold(x: torch.Tensor, density: float, sample: float, seed: int) -> float:
    """DGC's estimate: the ``density``-quantile of a stratified sample of ``|x|``."""
    from fedsync.kernels.triton import select

    n = x.numel()
    s = min(n, max(math.ceil(sample * n), math.ceil(64 / density)))
    _, mags = select.sample_positions(x, s, seed)
    s = mags.numel()  # whole cache lines for a sparse sample
    k_s = max(1, min(s, round(density * s)))
    return float(torch.topk(mags, k_s, sorted=False).values.min())


def index_section(indices: torch.Tensor, numel: int) -> tuple[str, torch.Tensor]:
    """The smaller of Elias-Fano (closed-form size) and Rice (size from two sums)."""
    from fedsync.kernels.triton import pack

    n = indices.numel()
    if n == 0:
        return "empty", torch.zeros(0, dtype=torch.uint8, device=indices.device)
    mean_gap = max((numel - n) / n, 1e-9)
    k = max(0, round(math.log2(max(mean_gap * math.log(2), 1.0))))
    low = max(0, math.floor(math.log2(max(numel / n, 1.0))))
    ef_bytes = pack.packed_nbytes(n, low) + (n + ((numel - 1) >> low) + 7) // 8
    rice_bytes = (pack.rice_bits(indices, k) + 7) // 8
    if rice_bytes < ef_bytes:
        return f"rice:{k}", pack.rice_encode(indices, k)
    return f"elias_fano:{low}", pack.elias_fano_encode(indices, numel, low)


def fused_compress(x: torch.Tensor, density: float, sample: float) -> dict[str, Any]:
    """Our device pipeline, end to end (threshold, select, quantize, index section)."""
    from fedsync.kernels.triton import quantize, select

    k = max(1, round(density * x.numel()))
    t = sample_threshold(x, density, sample, seed=1)
    sel = select.threshold_select(x, t, limit=2 * k)
    if sel.indices is None or sel.values is None:  # a bad estimate: exact fallback
        sel = select.threshold_select(x, t, limit=None)
    assert sel.indices is not None and sel.values is not None
    codes, _, _ = quantize.uniform_quantize(sel.values, 8, 1024)
    coding, section = index_section(sel.indices, x.numel())
    return {"count": sel.count, "coding": coding, "payload": codes.numel() + section.numel()}


# --------------------------------------------------------------------------------------
# Bytes each stage must move
# --------------------------------------------------------------------------------------


def select_bytes(n: int, kept: int) -> int:
    """Read x; write survivors (8 + 4 bytes) to regions; move them into place."""
    return 4 * n + 12 * kept + 24 * kept + 4 * (n // 4096 + 1)


def quantize_bytes(kept: int) -> int:
    """Read the values twice (extremes, codes), write codes and params."""
    return 8 * kept + kept + 8 * (kept // 1024 + 1)


def index_bytes(kept: int, section: int) -> int:
    """Read positions a few times (gaps, lengths, scan), scatter the section's words."""
    return 8 * kept * 4 + SECTOR * kept // 8 + section


def aggregate_bytes(nnz: int) -> int:
    """Per update: read position and code, read-modify-write one sector per entry."""
    return nnz * (8 + 1) + 2 * SECTOR * nnz


# --------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------


def copy_rate(x: torch.Tensor, timer: Timer) -> float:
    dst = torch.empty_like(x)
    seconds = timer(lambda: dst.copy_(x))
    return 8 * x.numel() / seconds


def compress_run(x: torch.Tensor, density: float, sample: float, timer: Timer) -> dict[str, Any]:
    from fedsync.kernels.triton import quantize, select

    n = x.numel()
    k = max(1, round(density * n))
    copy_bps = copy_rate(x, timer)
    out: dict[str, Any] = {"n": n, "density": density, "k": k, "copy_GBps": copy_bps / 1e9}

    topk_s = timer(lambda: torch_topk_compress(x, k))
    out["torch_topk"] = Stage(topk_s, 4 * n + 13 * k).report(copy_bps)

    t = sample_threshold(x, density, sample, seed=1)
    sel = select.threshold_select(x, t, limit=None)
    assert sel.indices is not None and sel.values is not None
    indices, values = sel.indices, sel.values
    kept = sel.count
    s = min(n, max(math.ceil(sample * n), math.ceil(64 / density)))
    _, section = index_section(indices, n)
    stages = {
        "threshold": Stage(
            timer(lambda: sample_threshold(x, density, sample, seed=1)), s * (SECTOR + 12 + 4)
        ),
        "select": Stage(
            timer(lambda: select.threshold_select(x, t, limit=2 * k)), select_bytes(n, kept)
        ),
        "quantize": Stage(
            timer(lambda: quantize.uniform_quantize(values, 8, 1024)), quantize_bytes(kept)
        ),
        "index": Stage(
            timer(lambda: index_section(indices, n)), index_bytes(kept, section.numel())
        ),
    }
    out["fused_stages"] = {name: st.report(copy_bps) for name, st in stages.items()}
    fused_s = timer(lambda: fused_compress(x, density, sample))
    must = 4 * n + kept + section.numel()  # read x once, write the payload
    moved = sum(st.bytes_moved for st in stages.values())
    result = fused_compress(x, density, sample)
    out["fused"] = {
        **Stage(fused_s, moved).report(copy_bps),
        "kept": kept,
        "coding": result["coding"],
        "payload_bytes": result["payload"],
        "minimal_bytes": must,
        "efficiency_vs_minimal": must / fused_s / copy_bps,
        "speedup_vs_torch_topk": topk_s / fused_s,
    }
    exact_s = timer(lambda: quantize.uniform_quantize(x[select.exact_topk(x, k)], 8, 1024))
    out["exact_topk"] = {
        **Stage(exact_s, 4 * n + 13 * k).report(copy_bps),
        "speedup_vs_torch_topk": topk_s / exact_s,
    }
    return out


def _random_update(
    n: int, nnz: int, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, ...]:
    idx = torch.randperm(n, device=device, generator=gen)[:nnz].sort().values
    codes = torch.randint(0, 256, (nnz,), device=device, dtype=torch.uint8, generator=gen)
    chunks = -(-nnz // 1024)
    mins = torch.randn(chunks, device=device, generator=gen)
    scales = torch.rand(chunks, device=device, generator=gen) / 100
    return idx, codes, mins, scales


def aggregate_run(
    n: int, nnz: int, updates: int, timer: Timer, device: torch.device, distinct: int = 8
) -> dict[str, Any]:
    """Decode + scatter-add of ``updates`` updates (``distinct`` index sets, cycled)."""
    from fedsync.kernels.triton import scatter

    gen = torch.Generator(device=device).manual_seed(0)
    pool = [_random_update(n, nnz, device, gen) for _ in range(distinct)]
    acc = torch.zeros(n, device=device)

    def ours() -> None:
        for u in range(updates):
            idx, codes, mins, scales = pool[u % distinct]
            scatter.scatter_add_uniform_(acc, idx, codes, mins, scales, 1024, 0.5)

    def baseline() -> None:
        for u in range(updates):
            idx, codes, mins, scales = pool[u % distinct]
            owner = torch.arange(nnz, device=device) // 1024
            values = codes.float() * scales[owner] + mins[owner]
            acc.index_add_(0, idx, values, alpha=0.5)

    ours_s = timer(ours)
    base_s = timer(baseline)
    return {
        "n": n,
        "nnz": nnz,
        "updates": updates,
        "seconds": ours_s,
        "seconds_per_update": ours_s / updates,
        "nnz_per_second": nnz * updates / ours_s,
        "GBps": aggregate_bytes(nnz) * updates / ours_s / 1e9,
        "torch_seconds": base_s,
        "speedup_vs_torch": base_s / ours_s,
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}), Triton interpreter"


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    import triton

    if args.dry_run:
        device = torch.device("cpu")
        sizes = [20_000, 60_000]
        updates, warmup, reps = 3, 1, 1
    else:
        device = torch.device("cuda")
        sizes = [int(float(s)) for s in args.sizes]
        updates, warmup, reps = args.updates, args.warmup, args.reps
    timer = Timer(device, warmup, reps)
    from fedsync.kernels.ordered_sums import LANES

    report: dict[str, Any] = {
        "benchmark": "gpu_codecs",
        "provenance": provenance("python -m benchmarks.gpu_codecs", argv),
        "device": device_name(device),
        "dry_run": bool(args.dry_run),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "sample_fraction": args.sample,
        "lanes": LANES,
        "target": TARGET,
        "compress": [],
        "aggregate": [],
        "aggregate_fixed_nnz": [],
    }
    gen = torch.Generator(device=device).manual_seed(0)
    for n in sizes:
        x = torch.randn(n, device=device, generator=gen)
        for density in args.densities:
            row = compress_run(x, density, args.sample, timer)
            report["compress"].append(row)
            print(
                f"n={n:>11,} d={density:<6} topk {row['torch_topk']['seconds'] * 1e3:8.3f} ms"
                f"  fused {row['fused']['seconds'] * 1e3:8.3f} ms"
                f" ({row['fused']['speedup_vs_torch_topk']:6.1f}x,"
                f" {row['fused']['efficiency_vs_minimal']:.0%} of copy)",
                flush=True,
            )
            agg = aggregate_run(n, max(1, round(density * n)), updates, timer, device)
            report["aggregate"].append(agg)
            print(
                f"   aggregate {updates} x nnz={agg['nnz']:,}: {agg['seconds'] * 1e3:8.3f} ms"
                f" ({agg['speedup_vs_torch']:.1f}x torch)",
                flush=True,
            )
        del x
    fixed = max(1, min(sizes) // 100)
    for n in sizes:
        agg = aggregate_run(n, fixed, updates, timer, device)
        report["aggregate_fixed_nnz"].append(agg)
        print(f"fixed nnz={fixed:,} n={n:,}: {agg['seconds_per_update'] * 1e6:.1f} us/update")
    return report


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1e7", "1e8"])
    parser.add_argument("--densities", nargs="+", type=float, default=[0.1, 0.01, 0.001])
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--sample", type=float, default=0.001, help="DGC sample fraction")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dry-run", "--interpret", dest="dry_run", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default by device)")
    args = parser.parse_args(argv)
    if args.dry_run:
        # Must be set before the first kernel module is imported (triton.jit reads it).
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print("no CUDA device; use --dry-run to exercise the script on CPU", file=sys.stderr)
        return 2
    report = run(args, argv)
    if args.dry_run and args.out is None:
        print(json.dumps(report, indent=1)[:2000])
        return 0
    out = args.out or RESULTS_DIR / f"gpu_codecs-{_slug(report['device'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
