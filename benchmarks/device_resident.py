"""Encode and decode time of a sender that keeps its update on the device, before vs after.

Run ``python -m benchmarks.device_resident --baseline DIR`` where ``DIR`` holds the
code before the change (for example ``git archive <commit> | tar -x -C DIR``). Two
worker processes, one importing ``DIR``'s fedsync and one this tree's, get the same
inputs and the same sequence of calls, interleaved call by call so the machine's load
hits both alike; each reports its time and the SHA-256 of the frame it wrote, and
the run checks that both trees wrote the same bytes. Writes
``benchmarks/results/device_resident.json`` and a plot next to it.

Cases (``spec`` on ``input``, per ``backend``):

* a 10M-value float32 tensor (standard normal), ``topk:0.01+uniform:8+ef``;
* real LeNet-5 updates (Fashion-MNIST, 20 SGD steps each, ``--data-dir``),
  ``topk:0.01+uniform:8+ef`` and ``none+fp16``;

``backend`` is ``numba`` (the CPU's host backend: the path a CPU node runs, whose
arrays were host memory before and after) or ``torch`` (the torch backend serving CPU
tensors: the device path a GPU without Triton runs, here on CPU memory, so it shows
the work the device path does, not the PCIe copies it saves). With ``--cuda`` and a
CUDA device, ``cuda`` rows run the update on the GPU (Triton when installed).

``encode`` is :meth:`UpdateCodec.encode` (compress, error feedback, frame);
``decode`` is :meth:`UpdateCodec.decode` of that frame to a sparse update on the
update's device. Times are medians over ``--reps`` calls after ``--warmup`` calls,
with min and max, on two clocks: wall time and the calling thread's CPU time (torch
and numba on one thread, so that is the call's whole cost; on a shared machine it
moves far less than wall time). The plot shows the CPU clock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent.parent

CASES = [
    ("big-10M", "topk:0.01+uniform:8+ef"),
    ("lenet5", "topk:0.01+uniform:8+ef"),
    ("lenet5", "none+fp16"),
]


# --------------------------------------------------------------------------------------
# Worker: one tree's fedsync, commands on stdin, one JSON line per call on stdout
# --------------------------------------------------------------------------------------


def worker(inputs: Path) -> None:
    """Serve ``<case> <spec> <backend>`` lines: one encode + decode each."""
    import torch

    from fedsync.codecs import UpdateCodec, tensor_specs
    from fedsync.kernels import dispatch

    torch.set_num_threads(1)
    data: dict[str, list[dict[str, torch.Tensor]]] = torch.load(inputs)
    codecs: dict[tuple[str, str, str], Any] = {}
    calls: dict[tuple[str, str, str], int] = {}
    host = dispatch._BACKENDS["cpu"]
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case, spec, backend = line.split()
        key = (case, spec, backend)
        device = "cuda" if backend == "cuda" else "cpu"
        dispatch._BACKENDS["cpu"] = dispatch.TorchBackend() if backend == "torch" else host
        updates = data[case]
        n = calls.get(key, 0)
        calls[key] = n + 1
        update = {k: v.to(device) for k, v in updates[n % len(updates)].items()}
        if key not in codecs:
            codecs[key] = UpdateCodec(spec, seed=3, specs=tensor_specs(update))
        codec = codecs[key]
        if device == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
        payload = codec.encode(update)
        t1, c1 = time.perf_counter(), time.thread_time()
        decoded = codec.decode(payload, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        t2, c2 = time.perf_counter(), time.thread_time()
        assert sorted(decoded) == sorted(update)
        out = {
            "encode_s": t1 - t0,
            "decode_s": t2 - t1,
            "encode_cpu_s": c1 - c0,
            "decode_cpu_s": c2 - c1,
            "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def make_inputs(path: Path, data_dir: str | None, updates: int) -> None:
    """The inputs both workers read: a 10M tensor and real LeNet-5 updates."""
    import torch

    from benchmarks.codecs import cnn_updates

    g = torch.Generator().manual_seed(0)
    big = [{"w": torch.randn(10_000_000, generator=g)} for _ in range(2)]
    lenet = cnn_updates(data_dir, rounds=updates)
    torch.save({"big-10M": big, "lenet5": lenet}, path)


class Worker:
    """A worker process for one tree."""

    def __init__(self, tree: Path, inputs: Path) -> None:
        # One thread each (torch, numba): the calling thread's CPU time is then the
        # whole cost of a call, which a loaded machine barely moves.
        env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(inputs)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self.read())["ready"]

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker for {self.tree} died (exit {self.proc.wait()})")
        return line

    def call(self, case: str, spec: str, backend: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{case} {spec} {backend}\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.read()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "median_ms": 1e3 * statistics.median(xs),
        "min_ms": 1e3 * min(xs),
        "max_ms": 1e3 * max(xs),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = ["numba", "torch"] + (["cuda"] if args.cuda else [])
    trees = {"before": Path(args.baseline).resolve(), "after": HERE}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "inputs.pt"
        make_inputs(inputs, args.data_dir, args.updates)
        workers = {name: Worker(tree, inputs) for name, tree in trees.items()}
        try:
            rows = []
            for case, spec in CASES:
                for backend in backends:
                    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in workers}
                    for rep in range(args.warmup + args.reps):
                        order = list(workers) if rep % 2 == 0 else list(workers)[::-1]
                        for name in order:
                            result = workers[name].call(case, spec, backend)
                            if rep >= args.warmup:
                                samples[name].append(result)
                    same = [
                        a["sha256"] == b["sha256"]
                        for a, b in zip(samples["before"], samples["after"], strict=True)
                    ]
                    row: dict[str, Any] = {
                        "case": case,
                        "spec": spec,
                        "backend": backend,
                        "same_bytes": all(same),
                        "bytes": samples["after"][0]["bytes"],
                    }
                    for name, runs in samples.items():
                        row[name] = {
                            f"{op}{clock}": _summary([r[f"{op}{clock}_s"] for r in runs])
                            for op in ("encode", "decode")
                            for clock in ("", "_cpu")
                        }
                    for op in ("encode", "decode", "encode_cpu", "decode_cpu"):
                        row[f"{op}_after_over_before"] = (
                            row["after"][op]["median_ms"] / row["before"][op]["median_ms"]
                        )
                    print(
                        f"{case:8s} {spec:24s} {backend:6s} cpu ms: encode "
                        f"{row['before']['encode_cpu']['median_ms']:8.1f} -> "
                        f"{row['after']['encode_cpu']['median_ms']:8.1f}, decode "
                        f"{row['before']['decode_cpu']['median_ms']:7.1f} -> "
                        f"{row['after']['decode_cpu']['median_ms']:7.1f}; same bytes {all(same)}",
                        flush=True,
                    )
                    rows.append(row)
        finally:
            for w in workers.values():
                w.close()
    return {
        "benchmark": "device_resident",
        "reps": args.reps,
        "warmup": args.warmup,
        "threads": 1,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
        },
        "note": (
            "shared, loaded 2-core machine: medians with min/max; before and after "
            "interleaved call by call; '<op>' is wall time, '<op>_cpu' the calling "
            "thread's CPU time (torch and numba on one thread)"
        ),
        "rows": rows,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 6))
    for ax, op in zip(axes, ("encode_cpu", "decode_cpu"), strict=True):
        labels = [f"{r['case']}\n{r['spec']}\n{r['backend']}" for r in rows]
        x = range(len(rows))
        for shift, name in ((-0.2, "before"), (0.2, "after")):
            med = [r[name][op]["median_ms"] for r in rows]
            lo = [m - r[name][op]["min_ms"] for m, r in zip(med, rows, strict=True)]
            hi = [r[name][op]["max_ms"] - m for m, r in zip(med, rows, strict=True)]
            ax.bar([i + shift for i in x], med, 0.4, yerr=[lo, hi], label=name, capsize=3)
        ax.set_xticks(list(x), labels, fontsize=7, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("ms (median, min-max)")
        ax.set_title(f"{op.removesuffix('_cpu')}: thread CPU time, one thread")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="INPUTS", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", help="a tree with the code before the change")
    parser.add_argument("--data-dir", default="../shared/data", help="where the datasets live")
    parser.add_argument("--updates", type=int, default=4, help="LeNet-5 updates to cycle")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cuda", action="store_true", help="also run on the CUDA device")
    parser.add_argument("--out", default=str(RESULTS / "device_resident.json"))
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker))
        return
    if not args.baseline:
        parser.error("--baseline DIR is required (the code before the change)")
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
