"""Data-parallel training across a shaped link: DDP's own paths against fedsync's.

Run as root: ``python -m benchmarks.ddp_links`` (writes
``benchmarks/results/ddp_links.json`` and ``ddp_links.png``); without root or network
namespaces it says why and exits 0 (``--loopback`` runs the same over plain loopback,
unshaped, to check the machinery; its numbers say nothing about links).

Topology. Two ranks are two sites joined by one link: rank 1 runs in its own network
namespace behind a veth pair shaped with ``tbf`` both ways at the rate under test
(:class:`fedsync.deploy.netns.ShapedNetwork`, the links SuperNodes use), rank 0 at the
host end of that link. Every byte between the ranks crosses the shaped link. (Ranks in
two namespaces would need the host to forward between veths; ``netns.py`` leaves the
host's sysctls alone, so the second site is the host end.)

Side by side, in one run per rate, the same model, data, seed and steps:

* ``dense``: DDP's built-in all-reduce;
* ``fp16``: torch's ``fp16_compress_hook``;
* ``powersgd``: torch's ``powerSGD_hook``, rank 4, error feedback and warm start on,
  compression from step 2 (earlier steps are DDP's warm-up, not timed);
* ``fedsync:<spec>``: :func:`fedsync.ddp.fedsync_hook` with each ``--spec``;
* ``demo``: :class:`fedsync.ddp.DeMo` (no DDP; the optimizer exchanges the DCT top-k
  of its momentum and applies the sign of the average).

The model is an MLP on Fashion-MNIST (784 -> 1536 -> 1024 -> 10, 2.78 M parameters,
11.1 MB of float32 gradients per step), batch 64 per rank, SGD with momentum 0.9 for
the DDP rows, one 64 MB bucket (so the whole gradient is one exchange). Per method:
time per step (median and 10th/90th percentiles of the timed steps: the machine is
shared, so the spread is reported, not hidden), bytes per step per rank that crossed
the link (the veth's own counters: TCP/IP headers included) and, for fedsync, the
frame bytes, test loss after the steps (2000 test images), and the share of the step
spent communicating: for fedsync the hook's measured all-gather time, for the others
``1 - compute / step`` with ``compute`` the median step of the same model without any
exchange, measured in the same run. Each rank runs torch, OpenMP and numba on one
thread (two ranks share a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from fedsync.reports.progress_bar import track

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
HIDDEN = (1536, 1024)
DEFAULT_SPECS = ("topk:0.1+uniform:8+ef", "topk:0.05+uniform:4+ef", "topk:0.01+uniform:4+ef")
DEMO = {"lr": 0.002, "beta": 0.9, "k": 8, "chunk": 64}
SGD = {"lr": 0.05, "momentum": 0.9}
BUCKET_MB = 64.0


# -- worker (one per rank) ---------------------------------------------------------------


def _model() -> torch.nn.Module:
    from fedsync.models import build_model

    return build_model("mlp", 10, (1, 28, 28), seed=0, hidden=HIDDEN)


def _link_bytes(interface: str | None) -> tuple[int, int]:
    if not interface:
        return 0, 0
    stats = Path("/sys/class/net", interface, "statistics")
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def _run_method(
    method: str, data: dict[str, torch.Tensor], args: argparse.Namespace, warmup: int
) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fedsync.ddp import DeMo, FedsyncHookState, fedsync_hook

    model = _model()
    state: Any = None
    if method == "demo":
        net: torch.nn.Module = model
        opt: torch.optim.Optimizer = DeMo(model.parameters(), **DEMO)  # type: ignore[arg-type]
    else:
        # One bucket for every row: torch's PowerSGD hook chains collectives from
        # future callbacks, and with two buckets on gloo their order can differ
        # between ranks (a collective mismatch); an explicit cap also sizes the
        # first bucket.
        net = DDP(model, bucket_cap_mb=BUCKET_MB)
        if method == "fp16":
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif method == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2
            )
            net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif method.startswith("fedsync:"):
            state = FedsyncHookState(spec=method.split(":", 1)[1], seed=1)
            net.register_comm_hook(state, fedsync_hook)
        opt = torch.optim.SGD(net.parameters(), **SGD)  # type: ignore[arg-type]
    x, y = data["x"], data["y"]
    times: list[float] = []
    exchange: list[float] = []
    encode: list[float] = []
    decode: list[float] = []
    payload: list[int] = []
    before = (0, 0)
    for step in range(warmup + args.steps):
        if step == warmup:
            dist.barrier()
            before = _link_bytes(args.interface)
        xb = x[step * args.batch : (step + 1) * args.batch]
        yb = y[step * args.batch : (step + 1) * args.batch]
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
            stats = None
            if isinstance(opt, DeMo):
                stats = opt.compression_stats()
            elif isinstance(state, FedsyncHookState):
                stats = state.compression_stats()
            if stats is not None:
                exchange.append(stats.exchange_s)
                encode.append(stats.encode_s)
                decode.append(stats.decode_s)
                payload.append(stats.payload_bytes)
    after = _link_bytes(args.interface)
    dist.barrier()
    with torch.no_grad():
        test_loss = float(F.cross_entropy(model(data["tx"]), data["ty"]))
    out: dict[str, Any] = {
        "method": method,
        "step_s": _spread(times),
        "test_loss": test_loss,
        "last_train_loss": float(loss.detach()),
        "link_tx_bytes_per_step": (after[0] - before[0]) / args.steps,
        "link_rx_bytes_per_step": (after[1] - before[1]) / args.steps,
    }
    if exchange:
        out.update(
            exchange_s=_spread(exchange),
            encode_s=_spread(encode),
            decode_s=_spread(decode),
            payload_bytes_per_step=statistics.mean(payload),
        )
    return out


def _spread(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(arr)),
        "p10": float(np.percentile(arr, 10)),
        "p90": float(np.percentile(arr, 90)),
        "mean": float(arr.mean()),
    }


def _compute_only(data: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, float]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), **SGD)  # type: ignore[arg-type]
    times = []
    for step in range(min(args.steps, 20)):
        xb = data["x"][step * args.batch : (step + 1) * args.batch]
        yb = data["y"][step * args.batch : (step + 1) * args.batch]
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return _spread(times[2:])


def worker(args: argparse.Namespace) -> None:
    """One rank: every method in turn, results to ``args.out``."""
    import faulthandler

    from fedsync.data import load_dataset

    faulthandler.dump_traceback_later(args.timeout, exit=True)  # a hang says where
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank, world_size=2
    )
    splits = load_dataset("fashion-mnist", args.data_dir)
    warmup = 3
    n = (warmup + args.steps) * args.batch
    lo = args.rank * n
    data = {
        "x": torch.from_numpy(np.asarray(splits.train.x[lo : lo + n]).copy()),
        "y": torch.from_numpy(np.asarray(splits.train.y[lo : lo + n]).copy()),
        "tx": torch.from_numpy(np.asarray(splits.test.x[:2000]).copy()),
        "ty": torch.from_numpy(np.asarray(splits.test.y[:2000]).copy()),
    }
    result: dict[str, Any] = {"rank": args.rank, "compute_s": _compute_only(data, args)}
    rows = []
    for method in args.methods.split(","):
        rows.append(_run_method(method, data, args, warmup))
        print(f"rank {args.rank} {method}: {rows[-1]['step_s']['median']:.3f} s/step", flush=True)
    result["rows"] = rows
    Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


# -- driver ------------------------------------------------------------------------------


def _launch(
    rank: int, wrap: list[str], ifname: str, interface: str | None, master: str, port: int,
    out: Path, args: argparse.Namespace, methods: str,
) -> subprocess.Popen[bytes]:  # fmt: skip
    command = [
        *wrap, sys.executable, "-m", "benchmarks.ddp_links", "--worker",
        "--rank", str(rank), "--master", master, "--port", str(port), "--ifname", ifname,
        "--out", str(out), "--steps", str(args.steps), "--batch", str(args.batch),
        "--methods", methods, "--data-dir", args.data_dir, "--timeout", str(args.timeout),
    ]  # fmt: skip
    if interface:
        command += ["--interface", interface]
    # One core per site: torch, OpenMP and numba each on one thread (two ranks share
    # this 2-core machine; numba's pool otherwise spins on the other rank's core).
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    return subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        raise RuntimeError(f"a rank failed (exit codes {bad})")


def run_rate(rate: float | None, args: argparse.Namespace, methods: str, tmp: Path) -> dict:
    """Both ranks over one link shaped at ``rate`` Mbit/s (``None``: loopback)."""
    from fedsync.deploy.netns import LinkShape, ShapedNetwork

    port = 29500 + int(time.time()) % 1000
    outs = [tmp / f"rate{rate}-rank{r}.json" for r in range(2)]
    if rate is None:
        procs = [
            _launch(r, [], "lo", None, "127.0.0.1", port, outs[r], args, methods) for r in range(2)
        ]
        _wait(procs, args.timeout)
        link = None
    else:
        with ShapedNetwork([LinkShape.symmetric(rate)]) as net:
            link = net.links[0]
            procs = [
                _launch(0, [], link.host_if, link.host_if, link.host_address, port, outs[0],
                        args, methods),
                _launch(1, link.wrap([]), link.node_if, None, link.host_address, port, outs[1],
                        args, methods),
            ]  # fmt: skip
            _wait(procs, args.timeout)
    ranks = [json.loads(o.read_text()) for o in outs]
    return {"rate_mbit": rate, "ranks": ranks, "rows": _merge(ranks)}


def _merge(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's row (its link counters) plus the slower rank's step time."""
    rows = []
    compute = max(r["compute_s"]["median"] for r in ranks)
    dense = None
    for i, row in enumerate(ranks[0]["rows"]):
        other = ranks[1]["rows"][i]
        step = max(row["step_s"]["median"], other["step_s"]["median"])
        merged = dict(row)
        merged["step_s_rank1"] = other["step_s"]
        merged["step_median_s"] = step
        merged["bytes_per_step_per_rank"] = (
            row["link_tx_bytes_per_step"] + row["link_rx_bytes_per_step"]
        ) / 2
        if "exchange_s" in row:
            merged["comm_share"] = row["exchange_s"]["median"] / row["step_s"]["median"]
        else:
            merged["comm_share"] = max(0.0, 1.0 - compute / step)
        if row["method"] == "dense":
            dense = merged
        rows.append(merged)
    if dense is not None:
        for merged in rows:
            merged["speedup_vs_dense"] = dense["step_median_s"] / merged["step_median_s"]
            merged["bytes_vs_dense"] = (
                merged["bytes_per_step_per_rank"] / dense["bytes_per_step_per_rank"]
                if dense["bytes_per_step_per_rank"]
                else None
            )
            merged["loss_vs_dense"] = merged["test_loss"] / dense["test_loss"] - 1.0
    return rows


def _targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets at 100 Mbit/s, evaluated on the measured rows."""
    rows = {r["method"]: r for r in result["rows"]}
    ours = [r for m, r in rows.items() if m.startswith("fedsync:") or m == "demo"]
    close = [r for r in ours if r["loss_vs_dense"] <= 0.02]
    best = max(close, key=lambda r: r["speedup_vs_dense"]) if close else None
    psgd = rows.get("powersgd")
    out: dict[str, Any] = {"best_within_2pct": best["method"] if best else None}
    if best is not None:
        out["best_speedup"] = best["speedup_vs_dense"]
        out["speedup_ge_5x"] = best["speedup_vs_dense"] >= 5.0
    if psgd is not None:
        beats = [
            r["method"]
            for r in ours
            if r["step_median_s"] < psgd["step_median_s"] and r["test_loss"] <= psgd["test_loss"]
        ]
        out["beat_powersgd_time_and_loss"] = beats
    return out


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 * len(results), figsize=(7 * len(results), 4.2))
    for j, res in enumerate(results):
        rows = res["rows"]
        names = [r["method"].replace("fedsync:", "") for r in rows]
        ax = axes[2 * j]
        med = [r["step_median_s"] for r in rows]
        lo = [r["step_median_s"] - r["step_s"]["p10"] for r in rows]
        hi = [r["step_s"]["p90"] - r["step_median_s"] for r in rows]
        ax.barh(names, med, xerr=[np.maximum(lo, 0), np.maximum(hi, 0)], color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("s per step (median, p10-p90)")
        ax.set_title(f"{res['rate_mbit']} Mbit/s: time per step")
        ax = axes[2 * j + 1]
        ax.barh(names, [r["test_loss"] for r in rows], color="tab:orange")
        ax.set_xlabel("test loss after the steps")
        ax.set_title(f"{res['rate_mbit']} Mbit/s: loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    parser.add_argument("--ifname", default="lo", help=argparse.SUPPRESS)
    parser.add_argument("--interface", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS / "ddp_links.json"))
    parser.add_argument("--rates", default="100,1000", help="Mbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per method")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--spec", action="append", help="fedsync hook spec (repeatable)")
    parser.add_argument("--methods", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--rows", default="dense,fp16,powersgd,fedsync,demo", help="which rows, in order"
    )
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--timeout", type=float, default=400.0, help="per rate, seconds")
    parser.add_argument("--loopback", action="store_true", help="unshaped loopback check")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from fedsync.deploy.netns import netns_unavailable_reason

    specs = args.spec or list(DEFAULT_SPECS)
    wanted = args.rows.split(",")
    unknown = set(wanted) - {"dense", "fp16", "powersgd", "fedsync", "demo"}
    if unknown or "dense" not in wanted:
        parser.error(f"--rows takes dense (always), fp16, powersgd, fedsync, demo; got {args.rows}")
    methods = ",".join(
        m
        for row in wanted
        for m in ([f"fedsync:{s}" for s in specs] if row == "fedsync" else [row])
    )
    rates: list[float | None]
    if args.loopback:
        rates = [None]
    else:
        reason = netns_unavailable_reason()
        if reason:
            print(f"skipped: shaped links need network namespaces: {reason}")
            return 0
        rates = [float(r) for r in args.rates.split(",")]
    tmp = Path(args.out).with_suffix(".parts")
    tmp.mkdir(parents=True, exist_ok=True)
    results = []
    started = time.time()
    load_before = os.getloadavg()
    for rate in track(rates, "link rates"):
        res = run_rate(rate, args, methods, tmp)
        for row in res["rows"]:
            print(
                f"{rate} Mbit/s {row['method']:34s} {row['step_median_s']:.3f} s/step "
                f"x{row.get('speedup_vs_dense', 0):.2f} "
                f"{row['bytes_per_step_per_rank'] / 1e6:.3f} MB/step "
                f"loss {row['test_loss']:.4f} ({100 * row.get('loss_vs_dense', 0):+.1f} %) "
                f"comm {100 * row['comm_share']:.0f} %",
                flush=True,
            )
        res["targets"] = _targets(res)
        results.append(res)
    report = {
        "command": "python -m benchmarks.ddp_links " + " ".join(argv or sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_before_after": [load_before, os.getloadavg()],
        },
        "setup": {
            "model": f"mlp {HIDDEN}",
            "parameters": sum(p.numel() for p in _model().parameters()),
            "steps": args.steps,
            "warmup_steps": 3,
            "batch_per_rank": args.batch,
            "world_size": 2,
            "sgd": SGD,
            "demo": DEMO,
            "specs": specs,
        },
        "wall_s": time.time() - started,
        "results": results,
    }
    for part in tmp.iterdir():
        part.unlink()
    tmp.rmdir()
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1))
    if not args.loopback:
        _plot(results, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
