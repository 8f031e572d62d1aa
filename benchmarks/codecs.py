"""Codec throughput, payload size and index-coding efficiency, side by side.

Run ``python -m benchmarks.codecs`` (full: 1M and 10M float32, densities 0.1, 0.01,
0.001; writes ``benchmarks/results/codecs.json``) or ``--quick`` (CI-sized arrays,
prints only). Every number is a median over repetitions after warm-up runs (numba
JIT), and the methods are interleaved within each repetition, so a neighbour's load
on the machine hits all of them alike.

For each size and density it measures, on the same standard-normal array:

* ``stream``: a plain streaming read of the array, ``torch.sum`` (vectorised, all
  threads) and ``numpy.sum`` (one thread) -- the bandwidth ceiling;
* ``torch.topk``: compression built on ``torch.topk`` (select, sort positions,
  gather, 8-bit uniform quantization, frame encoding);
* our codecs through :class:`fedsync.codec.UpdateCodec` (sparsify + quantize +
  encode to bytes, and decode back to a sparse update): the DGC sampled threshold
  (``dgc``), exact top-k (``topk``), SIDCo (``sidco``), each with ``uniform:8``, and
  ``dgc`` with error feedback;
* payload bytes against dense float32 bytes;
* index bits per kept value (the coding the frame picks, as
  :func:`fedsync.wire.index_bits_for` sizes it and as the frame's length confirms)
  against the entropy bound ``H(rho) / rho`` for a random support of density ``rho``.

* the index section's share of the codec's time (``index_section_cost``): choosing,
  encoding and decoding the section with and without the context coder on offer,
  on the benchmark's support and on a clustered one of the same count
  (``--index-cost`` runs only this, at 10M values and 1 %).

Throughputs are GB/s of float32 input (``4 * numel / seconds``).

Two clocks (``--clock wall|cpu|both``, default both): ``wall`` is wall time with the
default threads, what a user sees on an idle machine; ``cpu`` is the calling
thread's CPU time with numba and torch on one thread each, a per-core cost that a
busy shared machine barely moves. The JSON holds one run per clock, each with its
machine info (load averages included) and the target evaluation. ``--gate S`` lets
every repetition round wait up to ``S`` seconds for the machine to be idle.

Cache state (``--cache cold|warm``, default cold): interleaving methods would hand
each one whatever cache state the previous left (``torch.topk``'s temporaries evict
the 40 MB input, a streaming read leaves it resident), so every timed call starts
from the same state: ``cold`` reads a 256 MiB buffer first (the input comes from
DRAM, as for an update that has left the cache), ``warm`` runs the call once first
(the input is as resident as the cache allows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch

from fedsync.codec import UpdateCodec
from fedsync.compression.base import target_count
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import encode_frame, index_bits_for
from fedsync.wire.index_coding import choose_index_coding, decode_indices, encode_indices
from kernels.dispatch import TorchBackend, registered_backends

RESULTS = Path(__file__).parent / "results" / "codecs.json"
TARGET_N = 10_000_000
TARGET_DENSITY = 0.01
TARGET_METHOD = "dgc+uniform8"

_TORCH = TorchBackend()


def entropy_bits_per_value(rho: float) -> float:
    """``H(rho) / rho``: bits per kept position of a random support of density rho."""
    if rho >= 1:
        return 0.0
    h = -rho * math.log2(rho) - (1 - rho) * math.log2(1 - rho)
    return h / rho


def log2_binomial_per_value(n: int, k: int) -> float:
    """``log2 C(n, k) / k``: the exact bound for a uniformly random k-subset."""
    if k in (0, n):
        return 0.0
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2) / k


def torch_topk_compress(x: torch.Tensor, k: int, spec: str) -> bytes:
    """The baseline: torch.topk selection, then the same 8-bit quantizer and frame."""
    _, idx = torch.topk(x.abs(), k, sorted=False)
    idx, _ = torch.sort(idx)
    values = x[idx]
    codes, mins, scales = _TORCH.uniform_quantize(values, 8, 1024)
    q = QuantizedValues("uniform", 8, codes, {"min": mins, "scale": scales})
    tensor = CompressedTensor(TensorSpec("w", (x.numel(),)), "explicit", idx.numpy(), q)
    return encode_frame(spec, [tensor])


def runnable_elsewhere() -> int:
    """Runnable tasks on the machine besides the one asking (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return max(0, int(line.split()[1]) - 1)
    except OSError:
        pass
    return 0


def wait_for_idle(timeout: float) -> bool:
    """Wait until nothing else is runnable for ~60 ms (at most ``timeout`` seconds).

    On a shared 2-core machine a neighbour's process holding one core makes every
    parallel region (ours and ``torch.sum``'s alike) wait for a scheduler time slice,
    so each repetition round starts in an idle moment when there is one.
    """
    deadline = time.monotonic() + timeout
    idle_checks = 0
    while idle_checks < 3:
        if time.monotonic() >= deadline:
            return False
        idle_checks = idle_checks + 1 if runnable_elsewhere() == 0 else 0
        time.sleep(0.02)
    return True


CACHE = "cold"
"""``cold``: evict the caches before every timed call; ``warm``: run it once first."""

_EVICT = np.ones(1, dtype=np.float32)


def evict_caches() -> None:
    """Read a buffer several times the last-level cache (256 MiB; 300 MiB L3 here,
    shared with the host), so the next call finds its input in DRAM."""
    global _EVICT
    if _EVICT.size == 1:
        _EVICT = np.ones(1 << 26, dtype=np.float32)
    float(_EVICT.sum())


GATE_SECONDS = 0.0
"""How long each repetition round may wait for an idle machine (``--gate``)."""
CLOCK: Callable[[], float] = time.perf_counter
"""Wall clock by default; ``--clock cpu`` uses the calling thread's CPU time."""
IDLE_ROUNDS = 0
ROUNDS = 0


def timed(
    methods: dict[str, Callable[[], Any]], reps: int, warmup: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median and minimum seconds per method, interleaved within each repetition.

    The median is the reported number; the minimum is kept beside it because on a
    shared machine a neighbour's process can hold a core for a scheduler time slice,
    which inflates the median of multi-threaded code (``torch.sum`` included) and
    leaves the minimum as the best estimate of the unloaded cost.
    """
    for _ in range(warmup):
        for fn in methods.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in methods}
    global IDLE_ROUNDS, ROUNDS
    for _ in range(reps):
        if GATE_SECONDS > 0:
            IDLE_ROUNDS += wait_for_idle(GATE_SECONDS)
        ROUNDS += 1
        for name, fn in methods.items():
            # Every call starts from the same cache state, whatever ran before it
            # (torch.topk's temporaries evict the input; a streaming read leaves it in).
            if CACHE == "cold":
                evict_caches()
            else:
                fn()
            start = CLOCK()
            fn()
            samples[name].append(CLOCK() - start)
    return (
        {name: statistics.median(values) for name, values in samples.items()},
        {name: min(values) for name, values in samples.items()},
    )


def index_bits(n: int, density: float, seed: int = 0) -> dict[str, Any]:
    """Bits per kept position of a random support, as the frame would code it."""
    k = target_count(n, density)
    rng = np.random.default_rng(seed)
    support = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
    sizes = index_bits_for(support, n)
    coding = min(sizes, key=sizes.__getitem__)
    # Cross-check against real frames: the same codes with and without positions.
    q = QuantizedValues("fp32", 32, np.zeros(k, dtype=np.uint32))
    with_positions = encode_frame(
        "x", [CompressedTensor(TensorSpec("w", (n,)), "explicit", support, q)]
    )
    without = encode_frame("x", [CompressedTensor(TensorSpec("w", (n,)), "mask", None, q)])
    bound = entropy_bits_per_value(k / n)
    return {
        "coding": coding,
        "bits_per_value": sizes[coding] / k,
        "frame_bits_per_value": 8 * (len(with_positions) - len(without)) / k,
        "entropy_bound": bound,
        "log2_binomial_bound": log2_binomial_per_value(n, k),
        "ratio_to_entropy": sizes[coding] / k / bound if bound else float("nan"),
        "all_codings": {name: bits / k for name, bits in sizes.items()},
    }


def _section_round_trip(
    support: np.ndarray, n: int, shape: tuple[int, ...], **choice: Any
) -> Callable[[], object]:
    """Choose, encode and decode one index section (what the frame spends on it)."""

    def run() -> object:
        plan = choose_index_coding(support, n, shape=shape, **choice)
        section = np.frombuffer(encode_indices(support, n, plan), dtype=np.uint8)
        return decode_indices(
            section, plan.coding, plan.param, len(support), n, tensor="w", shape=shape
        )

    return run


def clustered_support(n: int, k: int, rows: int, seed: int = 0) -> np.ndarray:
    """``k`` positions of a ``rows x (n // rows)`` tensor, clustered like a real top-k
    support (hot rows and columns), for timing the context coder where it runs."""
    rng = np.random.default_rng(seed)
    width = n // rows
    row_weight = rng.pareto(1.5, rows) + 0.05
    col_weight = rng.pareto(1.5, width) + 0.05
    score = np.outer(row_weight, col_weight).reshape(-1) * rng.exponential(1.0, rows * width)
    return np.sort(np.argpartition(score, -k)[-k:]).astype(np.int64)


def index_section_cost(n: int, density: float, reps: int, warmup: int) -> dict[str, Any]:
    """What the context-coded section adds to the codec's time, measured side by side.

    ``codec`` is ``topk:<density>+uniform:8`` encode plus decode of the benchmark's
    standard-normal array; ``auto`` / ``without_context`` choose, encode and decode its
    index section with and without the context coder on offer (it is skipped there:
    the support is not clustered); ``context`` / ``rice`` do the same on a clustered
    support of the same count, where the context coder runs.
    """
    g = torch.Generator().manual_seed(n)
    update = {"w": torch.randn(n, generator=g)}
    codec = UpdateCodec(f"topk:{density}+uniform:8")
    payload = codec.encode(update, seed=0)
    decoder = UpdateCodec()
    support = decoder.decode(payload)["w"].indices.numpy()
    rows = 2500 if n % 2500 == 0 else 1
    shape = (rows, n // rows)
    clustered = clustered_support(n, len(support), rows)
    methods: dict[str, Callable[[], Any]] = {
        "codec_encode": _encoder(codec, update),
        "codec_decode": _decoder(decoder, payload),
        "auto": _section_round_trip(support, n, shape),
        "without_context": _section_round_trip(support, n, shape, allow_context=False),
        "clustered_context": _section_round_trip(clustered, n, shape, coding="context"),
        "clustered_rice": _section_round_trip(clustered, n, shape, coding="rice"),
    }
    seconds, best = timed(methods, reps, warmup)
    codec_s = seconds["codec_encode"] + seconds["codec_decode"]
    bits = index_bits_for(clustered, n, shape=shape)
    return {
        "numel": n,
        "density": density,
        "k": len(support),
        "shape": list(shape),
        "ms": {name: 1e3 * value for name, value in seconds.items()},
        "best_ms": {name: 1e3 * value for name, value in best.items()},
        "random_support_added_of_codec": (seconds["auto"] - seconds["without_context"]) / codec_s,
        "clustered_context_added_of_codec": (
            seconds["clustered_context"] - seconds["clustered_rice"]
        )
        / codec_s,
        "clustered_bits_per_position": {name: b / len(clustered) for name, b in bits.items()},
    }


def _encoder(codec: UpdateCodec, update: dict[str, torch.Tensor]) -> Callable[[], bytes]:
    return lambda: codec.encode(update, seed=0)


def _decoder(codec: UpdateCodec, payload: bytes) -> Callable[[], object]:
    return lambda: codec.decode(payload)


def bench_case(n: int, density: float, reps: int, warmup: int) -> dict[str, Any]:
    """Every method on one standard-normal array of ``n`` float32 at ``density``."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    array = x.numpy()
    update = {"w": x}
    k = target_count(n, density)
    codecs = {
        "dgc+uniform8": UpdateCodec(f"dgc:{density}+uniform:8"),
        "topk+uniform8": UpdateCodec(f"topk:{density}+uniform:8"),
        "sidco+uniform8": UpdateCodec(f"sidco:{density}+uniform:8"),
        "dgc+uniform8+ef": UpdateCodec(f"dgc:{density}+uniform:8+ef"),
    }
    payloads = {name: codec.encode(update, seed=0) for name, codec in codecs.items()}
    payloads["torch.topk+uniform8"] = torch_topk_compress(x, k, f"topk:{density}+uniform:8")
    decoder = UpdateCodec()

    compress: dict[str, Callable[[], Any]] = {
        "stream(torch.sum)": lambda: float(x.sum()),
        "stream(numpy.sum)": lambda: float(array.sum()),
        "torch.topk+uniform8": lambda: torch_topk_compress(x, k, f"topk:{density}+uniform:8"),
    }
    for name, codec in codecs.items():
        compress[name] = _encoder(codec, update)
    decompress: dict[str, Callable[[], Any]] = {
        f"decode:{name}": _decoder(decoder, payloads[name])
        for name in ("dgc+uniform8", "torch.topk+uniform8")
    }
    decompress["decode+densify:dgc+uniform8"] = lambda: decoder.decode(payloads["dgc+uniform8"])[
        "w"
    ].to_dense()
    # torch.topk is slow: fewer repetitions of everything at the largest k.
    case_reps = max(3, reps if n * density <= 200_000 else reps // 2)
    seconds, best = timed({**compress, **decompress}, case_reps, warmup)

    gbps = {name: 4 * n / s / 1e9 for name, s in seconds.items()}
    best_gbps = {name: 4 * n / s / 1e9 for name, s in best.items()}
    stream = max(gbps["stream(torch.sum)"], gbps["stream(numpy.sum)"])
    methods = {}
    for name in [*codecs, "torch.topk+uniform8"]:
        decoded = decoder.decode(payloads[name])["w"]
        methods[name] = {
            "compress_ms": 1e3 * seconds[name],
            "compress_gbps": gbps[name],
            "x_torch_topk": seconds["torch.topk+uniform8"] / seconds[name],
            "of_stream_torch_sum": gbps[name] / gbps["stream(torch.sum)"],
            "of_stream_numpy_sum": gbps[name] / gbps["stream(numpy.sum)"],
            "best": {
                "compress_ms": 1e3 * best[name],
                "x_torch_topk": best["torch.topk+uniform8"] / best[name],
                "of_stream_torch_sum": best_gbps[name] / best_gbps["stream(torch.sum)"],
                "of_stream_numpy_sum": best_gbps[name] / best_gbps["stream(numpy.sum)"],
            },
            "payload_bytes": len(payloads[name]),
            "payload_of_dense": len(payloads[name]) / (4 * n),
            "kept": decoded.nnz,
        }
    return {
        "numel": n,
        "density": density,
        "k": k,
        "dense_bytes": 4 * n,
        "reps": case_reps,
        "stream_gbps": {
            "torch.sum": gbps["stream(torch.sum)"],
            "numpy.sum": gbps["stream(numpy.sum)"],
            "faster": stream,
            "best_of_reps": {
                "torch.sum": best_gbps["stream(torch.sum)"],
                "numpy.sum": best_gbps["stream(numpy.sum)"],
            },
        },
        "methods": methods,
        "decompress": {
            name.split(":", 1)[1] + (" (densify)" if "densify" in name else ""): {
                "ms": 1e3 * s,
                "gbps": 4 * n / s / 1e9,
            }
            for name, s in seconds.items()
            if name.startswith("decode")
        },
        "index_bits": index_bits(n, density),
        "index_section_cost": index_section_cost(n, density, max(3, case_reps // 2), warmup),
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "backends": registered_backends(),
        "load_average_start": os.getloadavg(),
    }


def targets(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets at 10M values, 1% density, threshold sparsifier + 8 bits."""
    case = next(
        (c for c in cases if c["numel"] == TARGET_N and c["density"] == TARGET_DENSITY), None
    )
    if case is None:
        return {"evaluated": False, "why": "no 10M / 1% case in this run"}
    m = case["methods"][TARGET_METHOD]
    bits = case["index_bits"]

    def at_least(key: str, target: float) -> dict[str, Any]:
        return {
            "value": m[key],
            "best_of_reps": m["best"][key],
            "target": target,
            "met": m[key] >= target,
        }

    return {
        "evaluated": True,
        "method": TARGET_METHOD,
        "x_torch_topk": at_least("x_torch_topk", 50),
        "of_stream_torch_sum": at_least("of_stream_torch_sum", 0.5),
        "of_stream_numpy_sum": at_least("of_stream_numpy_sum", 0.5),
        "index_bits_vs_entropy": {
            "value": bits["ratio_to_entropy"],
            "target": 1.10,
            "met": bits["ratio_to_entropy"] <= 1.10,
        },
    }


def print_table(cases: list[dict[str, Any]]) -> None:
    head = (
        f"{'numel':>10} {'dens':>6} {'method':<20} {'ms':>8} {'GB/s':>7} {'x topk':>7} "
        f"{'%torch.sum':>10} {'%np.sum':>8} {'bytes':>9} {'of dense':>8}"
    )
    print(head)
    print("-" * len(head))
    for c in cases:
        for name, m in c["methods"].items():
            print(
                f"{c['numel']:>10} {c['density']:>6} {name:<20} {m['compress_ms']:>8.2f} "
                f"{m['compress_gbps']:>7.2f} {m['x_torch_topk']:>7.1f} "
                f"{100 * m['of_stream_torch_sum']:>9.1f}% {100 * m['of_stream_numpy_sum']:>7.1f}% "
                f"{m['payload_bytes']:>9} {m['payload_of_dense']:>8.4f}"
            )
        s = c["stream_gbps"]
        print(
            f"{'':>10} {'':>6} {'stream':<20} torch.sum {s['torch.sum']:.1f} GB/s, "
            f"numpy.sum {s['numpy.sum']:.1f} GB/s"
        )
        for name, d in c["decompress"].items():
            print(
                f"{'':>10} {'':>6} {'decode ' + name:<30} {d['ms']:>8.2f} ms {d['gbps']:>7.2f} GB/s"
            )
        b = c["index_bits"]
        print(
            f"{'':>10} {'':>6} index bits/value {b['bits_per_value']:.3f} ({b['coding']}), "
            f"frame {b['frame_bits_per_value']:.3f}, H(rho)/rho {b['entropy_bound']:.3f}, "
            f"ratio {b['ratio_to_entropy']:.3f}"
        )
        print()


def run(clock: str, sizes: list[int], reps: int, warmup: int) -> dict[str, Any]:
    """Every case under one clock.

    ``wall``: wall-clock time with the default threads (2 numba, 2 torch): what a user
    sees on an idle machine. ``cpu``: CPU time of the calling thread with numba and
    torch both on one thread, so every method runs on the calling thread and the
    number is its CPU cost, which a neighbour's load barely moves (a shared machine
    stretches wall time, not CPU time) -- a per-core comparison.
    """
    global CLOCK, IDLE_ROUNDS, ROUNDS
    numba_threads, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    IDLE_ROUNDS = ROUNDS = 0
    if clock == "cpu":
        numba.set_num_threads(1)
        torch.set_num_threads(1)
        CLOCK = time.thread_time
    else:
        CLOCK = time.perf_counter
    try:
        info = machine()
        info["clock"] = clock
        info["cache"] = CACHE
        cases = []
        for n in sizes:
            for density in (0.1, 0.01, 0.001):
                cases.append(bench_case(n, density, reps, warmup))
                print(f"done: {clock} {n} @ {density}", file=sys.stderr)
        info["load_average_end"] = os.getloadavg()
        info["gate_seconds"] = GATE_SECONDS
        info["rounds_started_idle"] = f"{IDLE_ROUNDS}/{ROUNDS}"
        info["numba_threading_layer"] = numba.threading_layer()  # known once a kernel ran
    finally:
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(torch_threads)
        CLOCK = time.perf_counter
    return {"machine": info, "cases": cases, "targets": targets(cases)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized arrays, print only")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (full run: results/)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per measurement")
    parser.add_argument(
        "--gate",
        type=float,
        default=0.0,
        help="seconds each repetition round may wait for the machine to be idle",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu", "both"],
        default="both",
        help="wall time (2 threads), CPU time of one thread, or both (see run())",
    )
    parser.add_argument("--note", default="", help="free text stored in the JSON")
    parser.add_argument(
        "--index-cost",
        action="store_true",
        help="only the index-section cost at 10M values and 1 %% (index_section_cost), "
        "both clocks, to results/index_cost.json",
    )
    parser.add_argument(
        "--cache",
        choices=["cold", "warm"],
        default="cold",
        help="input in DRAM (evict before each call) or in cache (run once before)",
    )
    args = parser.parse_args(argv)
    global GATE_SECONDS, CACHE
    GATE_SECONDS = args.gate
    CACHE = args.cache

    if args.index_cost:
        return _index_cost_only(args.reps or 9, args.out)
    sizes = [100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000]
    reps = args.reps or (5 if args.quick else 11)
    warmup = 1 if args.quick else 2
    clocks = ["wall", "cpu"] if args.clock == "both" else [args.clock]
    report: dict[str, Any] = {
        "benchmark": "codecs",
        "quick": args.quick,
        "note": args.note,
        "runs": {},
    }
    for clock in clocks:
        report["runs"][clock] = run(clock, sizes, reps, warmup)
        print(f"== clock: {clock} ==")
        print_table(report["runs"][clock]["cases"])
        print(json.dumps(report["runs"][clock]["targets"], indent=2))
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _index_cost_only(reps: int, out: Path | None) -> int:
    """``--index-cost``: :func:`index_section_cost` at 10M and 1 % under both clocks."""
    global CLOCK
    report: dict[str, Any] = {"benchmark": "codecs --index-cost", "runs": {}}
    for clock in ("wall", "cpu"):
        threads = numba.get_num_threads(), torch.get_num_threads()
        if clock == "cpu":
            numba.set_num_threads(1)
            torch.set_num_threads(1)
            CLOCK = time.thread_time
        try:
            info = machine()
            result = index_section_cost(10_000_000, 0.01, reps, 1)
            info["load_average_end"] = os.getloadavg()
        finally:
            numba.set_num_threads(threads[0])
            torch.set_num_threads(threads[1])
            CLOCK = time.perf_counter
        report["runs"][clock] = {"machine": info, "result": result}
        print(f"== clock: {clock} ==")
        print(json.dumps(result, indent=2))
    path = out if out is not None else RESULTS.parent / "index_cost.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
