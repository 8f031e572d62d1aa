"""Scale of the simulation path: many simulated nodes, many updates, one machine.

::

    python -m benchmarks.sim_scale                          # 1,000 nodes, 10,000 updates
    python -m benchmarks.sim_scale --updates 1000           # a quick iteration
    python -m benchmarks.sim_scale --nodes 10000 --updates 200 \
        --out benchmarks/results/sim_scale_10k.json

The real Flower app runs with ``flwr run`` on a ``flower-superlink --simulation``
(Flower's simulation engine on Ray): fedsync's asynchronous mode (TEASQ, compression
both ways) on Fashion-MNIST (or digits) split over ``--nodes`` simulated SuperNodes,
until ``--updates`` train tasks were dispatched and answered.

What it reports (JSON under ``benchmarks/results/`` and a PNG of RSS over time):

* **wall time** of the whole ``flwr run`` (start to status), and of the asynchronous
  loop alone (first dispatch to last arrival, from the run's ``events.jsonl``);
  **updates per second** over the loop.
* **the simulator's own share** of the loop's wall time. Client work per update is the
  ClientApp's training time (``compute-seconds``, each reply's metric, measured inside
  the ClientApp) plus one downlink decode and one uplink encode, timed in this process
  on the same model with the codec specs the run used (the median of repeated calls; the
  ClientApp does not report them). With ``P`` ClientApp actors working in parallel the
  loop would take ``sum(client work) / P`` if the engine cost nothing;
  ``overhead_share = 1 - sum(client work) / (P * loop wall)`` is the rest: message
  passing through the SuperLink, the Ray actor pool, the ServerApp's scheduling,
  aggregation and evaluation, and any time the actors sat idle. ``P`` is the number of
  ``ray::ClientAppActor`` processes the sampler saw.
* **the same tasks with no Flower** (``--plain-tasks``, after the run): the ClientApp's
  work for a task -- the node's partition, the downlink decoded, the model built and
  loaded, local training, ``trained - start``, the uplink encoded with error feedback per
  node -- in a plain loop on as many worker processes as the run had ClientApp actors,
  one thread each, nodes drawn across the run's partitions. Its updates per second is
  the physical limit of this machine for these tasks; ``plain_overhead_share = 1 -
  run updates/s / plain updates/s`` is the simulator's share measured against it.
* **RSS of every process** of the SuperLink's tree (SuperLink, ServerApp, simulation
  process, Ray's daemons and workers), sampled from ``/proc`` every ``--interval``
  seconds with the number of updates so far: peak, and the slope in MB per 1,000
  updates after warm-up (the first ``--warmup`` fraction of the updates).

``--ray-cluster N`` runs the simulation on a Ray cluster of ``N`` nodes started on this
machine (:class:`fedsync.deploy.ray_cluster.LocalRayCluster`, one CPU each): Flower's
simulation joins it through ``RAY_ADDRESS`` instead of starting its own Ray, and its
ClientApp actors run on every node. RSS is then sampled under the cluster's node
processes too.

``--against-nodes A.json B.json ... --out nodes.json`` runs nothing: it reads earlier
results and writes, per number of nodes, updates per second, start-up seconds and the
peak RSS of the whole process tree, with a PNG of them against nodes beside the JSON.

With ``--baseline-tree DIR`` (a checkout of an earlier commit, e.g. ``git worktree add
/tmp/base <commit>``) the same command first runs that tree's own ``benchmarks.sim_scale``
with the same nodes, updates and settings, its code on ``PYTHONPATH``, and the JSON keeps
its figures as ``baseline`` with the ratios of this run's to them: old and new side by
side on the same machine in one command.

The machine may be shared: ``compute-seconds`` is wall-clock time inside the actor,
so CPU taken by other processes inflates both client work and the loop; the share is
still the engine's cost on this machine under this load, not a clean-room figure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_task_profile import run_task
from benchmarks.proc_sampler import TreeSampler, rss_report
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.config import RunConfig
from fedsync.deploy import DeploymentError, LocalSuperLink
from fedsync.deploy.ray_cluster import LocalRayCluster, RayNodeSpec
from fedsync.models.registry import build_model
from fedsync.recipe import model_for, model_state
from fedsync.reports.provenance import git_commit, provenance
from fedsync.updates import densify

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT_ROOT / "benchmarks" / "results"
INPUT_SHAPES = {"fashion-mnist": (1, 28, 28), "mnist": (1, 28, 28), "digits": (64,)}


def run_config(args: argparse.Namespace, results_dir: Path) -> dict[str, Any]:
    """The run config of the scale run: TEASQ until ``updates`` tasks were sent."""
    return {
        "strategy": "teasq",
        "dataset": args.dataset,
        "model": args.model,
        "data-dir": str((PROJECT_ROOT / args.data_dir).resolve()),
        "partitioning": "iid",
        "local-epochs": 1,
        "batch-size": 32,
        "concurrency": args.concurrency,
        "buffer-size": args.buffer_size,
        "max-tasks": args.updates,
        # Tasks decide the end; aggregations never do.
        "max-aggregations": args.updates,
        "eval-every": max(1, args.updates // args.buffer_size // 4),
        "fraction-evaluate": 0.0,
        "plots": False,
        "probe-timeout": args.probe_timeout,
        "node-wait": 600.0,
        "results-dir": str(results_dir),
        "run-name": "scale",
        "seed": 0,
        **dict(args.set),
    }


def setting(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set`` as a run-config entry: the value a TOML literal (as
    ``flwr run --run-config`` reads it), else the text as a string."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {item!r}")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key.strip(), value


def node_state_files(folder: Path) -> dict[str, Any]:
    """What ``node-state = "disk"`` left under ``folder`` (its ``state-dir``): files,
    bytes, nodes (scratch files ``<job>/n<node>-<kind>.npz`` name the node, the
    crash-safe ``codec-<job>-p<partition>.npz`` its partition)."""
    files = [path for path in folder.rglob("*.npz") if path.is_file()]
    sizes = [path.stat().st_size for path in files]
    scratch = {path.name.split("-", 1)[0] for path in files if path.parent != folder}
    durable = {path.stem.rsplit("-", 1)[-1] for path in files if path.parent == folder}
    return {
        "files": len(files),
        "bytes": sum(sizes),
        "largest_file_bytes": max(sizes, default=0),
        "nodes": max(len(scratch), len(durable)),
    }


class EventCounter:
    """Counts ``arrival`` events in a growing ``events.jsonl`` (read incrementally)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.count = 0

    def __call__(self) -> int:
        if not self.path.is_file():
            return self.count
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1  # only whole lines
        self._offset += end
        self.count += chunk[:end].count(b'"event": "arrival"')
        return self.count


def read_events(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def codec_seconds(
    model_name: str, dataset: str, uplink_spec: str, downlink_spec: str, repeats: int = 30
) -> dict[str, float]:
    """Median seconds of one downlink decode and one uplink encode on the run's model.

    Timed on one thread, as in a ClientApp actor with one CPU (Ray sets
    ``OMP_NUM_THREADS=1`` there): on a busy machine torch's default thread pool makes
    the same calls many times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _codec_seconds(model_name, dataset, uplink_spec, downlink_spec, repeats)
    finally:
        torch.set_num_threads(threads)


def _codec_seconds(
    model_name: str, dataset: str, uplink_spec: str, downlink_spec: str, repeats: int
) -> dict[str, float]:
    model = build_model(model_name, 10, INPUT_SHAPES[dataset], dataset=dataset, seed=0)
    state = model_state(model)
    specs = tensor_specs(state)
    downlink = UpdateCodec(downlink_spec).encode(state)
    generator = torch.Generator().manual_seed(0)
    delta = {name: 0.01 * torch.randn(t.shape, generator=generator) for name, t in state.items()}
    decode, encode = [], []
    encoder = UpdateCodec(uplink_spec, seed=1)  # error feedback state carries across calls
    for _ in range(repeats):
        started = time.perf_counter()
        densify(UpdateCodec().decode(downlink, expected=specs))
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        encoder.encode(delta)
        encode.append(time.perf_counter() - started)
    return {
        "decode_downlink_s": statistics.median(decode),
        "encode_uplink_s": statistics.median(encode),
        "downlink_bytes": len(downlink),
        "parameters": sum(t.numel() for t in state.values()),
    }


def loop_figures(
    events: list[dict[str, Any]], codec: dict[str, float], actors: int
) -> dict[str, Any]:
    """Updates, loop wall time, throughput and the simulator's share (module docstring)."""
    dispatches = [e for e in events if e["event"] == "dispatch"]
    arrivals = [e for e in events if e["event"] == "arrival"]
    if not dispatches or not arrivals:
        raise RuntimeError("the run wrote no dispatch/arrival events")
    loop_start = min(e["wall_time"] for e in dispatches)
    loop_wall = max(e["wall_time"] for e in arrivals) - loop_start
    compute = [float(e["wall_compute_s"] or 0.0) for e in arrivals]
    per_update_codec = codec["decode_downlink_s"] + codec["encode_uplink_s"]
    client_work = sum(compute) + len(arrivals) * per_update_codec
    ideal = client_work / max(actors, 1)
    start_event = next((e for e in events if e["event"] == "async_start"), {})
    return {
        "nodes_seen_by_server": start_event.get("nodes"),
        "nodes_trained": len({e.get("node") for e in arrivals}),
        "updates": len(arrivals),
        "dispatched": len(dispatches),
        "drops": sum(1 for e in events if e["event"] == "drop"),
        "aggregations": max((int(e.get("version", 0)) for e in arrivals), default=0),
        "probe_and_setup_s": round(loop_start, 3),
        "loop_wall_s": round(loop_wall, 3),
        "updates_per_s": round(len(arrivals) / loop_wall, 2) if loop_wall > 0 else None,
        "clientapp_actors": actors,
        "compute_s_total": round(sum(compute), 3),
        "compute_s_per_update_median": round(statistics.median(compute), 5),
        "codec_s_per_update": round(per_update_codec, 5),
        "client_work_s": round(client_work, 3),
        "overhead_share": round(1.0 - ideal / loop_wall, 4) if loop_wall > 0 else None,
    }


def _plain_worker(
    run_config: dict[str, Any], nodes: int, partitions: list[int], uplink: str, downlink: str
) -> tuple[float, int]:
    """One worker of :func:`plain_tasks`: its tasks' seconds (after one warm-up task) and
    count. One thread, as a ClientApp actor with one CPU."""
    torch.set_num_threads(1)
    config = RunConfig.from_run_config(run_config)
    device = torch.device("cpu")
    initial = model_state(model_for(config.training))
    specs = tensor_specs(initial)
    frame = UpdateCodec(downlink, specs=specs).encode(initial)  # the task's start model
    encoders: dict[int, UpdateCodec] = {}  # error feedback per node, as each node keeps it

    def task(partition: int) -> None:
        # the downlink decoded, then what the task profile runs: data, model, train, encode
        start = densify(UpdateCodec().decode(frame, expected=specs))
        encoder = encoders.setdefault(partition, UpdateCodec(uplink, seed=partition, specs=specs))
        run_task(
            device,
            config,
            encoder,
            specs,
            None,
            0,
            partition=partition,
            partitions=nodes,
            start_state=start,
        )

    task(partitions[0])  # imports, the dataset file, first-call costs
    started = time.perf_counter()
    for partition in partitions[1:]:
        task(partition)
    return time.perf_counter() - started, len(partitions) - 1


def plain_tasks(
    run_config: dict[str, Any], nodes: int, tasks: int, workers: int, uplink: str, downlink: str
) -> dict[str, Any]:
    """The run's tasks with no Flower, on ``workers`` processes at once (module docstring):
    ``tasks`` of them over partitions spread across the ``nodes``."""
    workers = max(1, workers)
    per_worker = max(2, tasks // workers + 1)  # + the warm-up task
    step = max(1, nodes // (per_worker * workers))
    plans = [
        [((w * per_worker + i) * step) % nodes for i in range(per_worker)] for w in range(workers)
    ]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [
            pool.submit(_plain_worker, run_config, nodes, plan, uplink, downlink) for plan in plans
        ]
        done = [f.result() for f in futures]
    seconds = max(s for s, _ in done)  # the workers ran side by side
    count = sum(n for _, n in done)
    return {
        "workers": workers,
        "tasks": count,
        "wall_s": round(seconds, 3),
        "updates_per_s": round(count / seconds, 2),
        "s_per_update_per_worker": round(sum(s for s, _ in done) / count, 5),
        "uplink_codec": uplink,
        "downlink_codec": downlink,
    }


SHARED_ARGS = (
    "nodes",
    "updates",
    "dataset",
    "model",
    "concurrency",
    "buffer_size",
    "cpus_per_client",
    "probe_timeout",
    "interval",
    "warmup",
    "timeout",
)
"""The options a baseline tree's run gets from this one (every sim_scale so far has them)."""


def run_baseline(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``tree``'s own ``benchmarks.sim_scale`` with this run's settings: its result JSON,
    with the tree's commit (module docstring)."""
    tree = tree.resolve()
    options = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in SHARED_ARGS]
    data_dir = (PROJECT_ROOT / args.data_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="sim-scale-baseline-") as tmp:
        out = Path(tmp) / "baseline.json"
        command = [sys.executable, "-m", "benchmarks.sim_scale", *options]
        command += [f"--data-dir={data_dir}", f"--out={out}"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(command, cwd=tree, env=env, check=False)
        if not out.is_file():
            raise RuntimeError(
                f"the baseline run in {tree} wrote no result (exit {done.returncode})"
            )
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    result["tree_commit"] = git_commit(tree)
    if "loop" in result:
        result["loop"]["code"] = result["tree_commit"]
    result.pop("rss_series", None)  # its figure is not kept; its peaks are
    return result


def baseline_ratios(result: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """This run's updates/s, loop and set-up time against the baseline's."""
    new, old = result.get("loop", {}), baseline.get("loop", {})

    def ratio(key: str) -> float | None:
        if new.get(key) and old.get(key):
            return round(float(new[key]) / float(old[key]), 3)
        return None

    return {
        "updates_per_s": ratio("updates_per_s"),
        "loop_wall_s": ratio("loop_wall_s"),
        "probe_and_setup_s": ratio("probe_and_setup_s"),
    }


def rss_series(samples: list[Any], report: dict[str, Any], top: int = 6) -> dict[str, Any]:
    """The samples themselves (MB): the tree's total and the ``top`` largest processes."""
    mb = 1024.0 * 1024.0
    big = sorted(report["processes"], key=lambda p: -p["peak_mb"])[:top]
    return {
        "t_s": [s.t for s in samples],
        "updates": [s.progress for s in samples],
        "tree_mb": [round(sum(s.rss.values()) / mb, 1) for s in samples],
        "processes": {
            f"{p['name']} {p['pid']}": [
                round(s.rss[p["pid"]] / mb, 1) if p["pid"] in s.rss else None for s in samples
            ]
            for p in big
        },
    }


def plot_rss(report: dict[str, Any], samples: list[Any], path: Path, title: str) -> None:
    """RSS of each process (and the tree) over time, with updates on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = 1024.0 * 1024.0
    fig, ax = plt.subplots(figsize=(9, 5))
    times = [s.t for s in samples]
    ax.plot(times, [sum(s.rss.values()) / mb for s in samples], "k-", lw=2, label="whole tree")
    big = sorted(report["processes"], key=lambda p: -p["peak_mb"])[:8]
    for proc in big:
        pid = proc["pid"]
        xs = [s.t for s in samples if pid in s.rss]
        ys = [s.rss[pid] / mb for s in samples if pid in s.rss]
        ax.plot(xs, ys, lw=1, label=f"{proc['name']} ({pid})")
    ax.set_xlabel("seconds since the SuperLink started")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(title)
    twin = ax.twinx()
    twin.plot(times, [s.progress for s in samples], "c:", lw=1)
    twin.set_ylabel("updates so far (dotted)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def against_nodes(paths: Sequence[Path], out: Path) -> dict[str, Any]:
    """Updates/s, start-up and peak tree RSS of earlier results, by nodes (module doc)."""
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        loop = data.get("loop", {})
        tree = data.get("rss_series", {}).get("tree_mb") or [0.0]
        rows.append(
            {
                "result": str(path),
                "nodes": data["args"]["nodes"],
                "updates": loop.get("updates"),
                "updates_per_s": loop.get("updates_per_s"),
                "plain_updates_per_s": data.get("plain", {}).get("updates_per_s"),
                "probe_and_setup_s": loop.get("probe_and_setup_s"),
                "peak_tree_rss_mb": max(tree),
                "commit": data.get("provenance", {}).get("commit"),
            }
        )
    rows.sort(key=lambda row: row["nodes"])
    result = {
        "benchmark": "sim_scale",
        "provenance": provenance("python -m benchmarks.sim_scale"),
        "against_nodes": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [row["nodes"] for row in rows]
    fig, (rate, memory) = plt.subplots(1, 2, figsize=(10, 4))
    rate.plot(nodes, [row["updates_per_s"] for row in rows], "o-", label="simulation")
    rate.plot(nodes, [row["plain_updates_per_s"] for row in rows], "s--", label="no Flower")
    rate.set_xscale("log")
    rate.set_xlabel("simulated nodes")
    rate.set_ylabel("updates / s")
    rate.set_ylim(bottom=0)
    rate.legend()
    memory.plot(nodes, [row["peak_tree_rss_mb"] / 1024.0 for row in rows], "o-")
    memory.set_xscale("log")
    memory.set_xlabel("simulated nodes")
    memory.set_ylabel("peak RSS of the whole tree (GB)")
    memory.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--dataset", default="fashion-mnist", choices=sorted(INPUT_SHAPES))
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--buffer-size", type=int, default=10)
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument(
        "--ray-cpus",
        type=int,
        default=0,
        help="CPUs Ray may hand out (federation init-args-num-cpus; 0: the machine's): "
        "more than the cores runs more ClientApp actors than cores",
    )
    parser.add_argument(
        "--ray-cluster",
        type=int,
        default=0,
        help="start a Ray cluster of this many nodes here (one CPU each) and run the "
        "simulation on it (0: Flower starts its own Ray)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=900.0,
        help="seconds the server asks nodes for their partition ids before it starts; "
        "nodes that have not answered by then are ordered by node id",
    )
    parser.add_argument(
        "--plain-tasks",
        type=int,
        default=200,
        help="tasks of the plain loop with no Flower, after the run (0: none)",
    )
    parser.add_argument(
        "--baseline-tree",
        default="",
        help="a checkout of earlier code: run its sim_scale first with these settings",
    )
    parser.add_argument(
        "--set",
        action="append",
        type=setting,
        default=[],
        metavar="KEY=VALUE",
        help="a run-config entry on top of the scale run's (repeatable), e.g. "
        "--set node-state=disk or --set concurrency=8",
    )
    parser.add_argument(
        "--keep-node-state",
        action="store_true",
        help='keep the files of node-state = "disk" (default: count them, then delete)',
    )
    parser.add_argument("--interval", type=float, default=1.0, help="RSS sampling seconds")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the updates")
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument("--run-dir", default="", help="SuperLink folder (default: a temp dir)")
    parser.add_argument("--out", default=str(RESULTS / "sim_scale.json"))
    parser.add_argument(
        "--against-nodes",
        nargs="+",
        type=Path,
        default=[],
        help="earlier result JSONs: write their figures against nodes to --out (no run)",
    )
    args = parser.parse_args(argv)
    if args.against_nodes:
        summary = against_nodes(args.against_nodes, Path(args.out))
        for row in summary["against_nodes"]:
            print(f"[sim_scale] {row}")
        return 0
    baseline = run_baseline(Path(args.baseline_tree), args) if args.baseline_tree else None

    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="sim-scale-")).resolve()
    results_dir = run_dir / "results"
    config = run_config(args, results_dir)
    state_dir: Path | None = None
    if config.get("node-state") == "disk":
        if not config.get("state-dir"):
            config["state-dir"] = str(run_dir / "node-state")
        state_dir = Path(str(config["state-dir"]))
    # A model or dataset named by import path (benchmarks.models:mlp_11m) must import in
    # the ServerApp and every Ray actor: they inherit this environment.
    paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray_tmpdir = ""
    cluster: LocalRayCluster | None = None
    if args.ray_cluster > 0:
        workers = (RayNodeSpec(f"worker{i}") for i in range(1, args.ray_cluster))
        specs = [RayNodeSpec("head"), *workers]
        cluster = LocalRayCluster(run_dir / "ray", nodes=specs).start()
        os.environ.update(cluster.env())
    elif not os.environ.get("RAY_ADDRESS"):
        # Without an address ray.init() joins the cluster the last `ray start` on this
        # machine wrote into <ray temp>/ray_current_cluster (anyone's, even a dead one):
        # a private temp root makes the simulation start its own Ray.
        ray_tmpdir = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="fsray-", dir="/tmp")
    link = LocalSuperLink(run_dir / "superlink", simulation=True)
    counter = EventCounter(results_dir / "scale" / "events.jsonl")
    started = time.monotonic()
    link.start()
    assert link.process is not None
    sampler = TreeSampler(
        link.process.pid,
        extra_roots=[process.pid for process in cluster.processes] if cluster else [],
        interval=args.interval,
        progress=counter,
    ).start()
    error = ""
    try:
        outcome = link.run_app(
            PROJECT_ROOT,
            config,
            federation_config={
                "num-supernodes": args.nodes,
                "client-resources-num-cpus": args.cpus_per_client,
                **({"init-args-num-cpus": args.ray_cpus} if args.ray_cpus > 0 else {}),
            },
            timeout=args.timeout,
        )
        status, details = outcome.status, outcome.details
        if not outcome.completed:
            error = outcome.output[-4000:]
    except DeploymentError as err:
        status, details, error = "error", str(err), str(err)
    finally:
        wall = time.monotonic() - started
        sampler.stop()
        link.stop()
        if cluster is not None:
            cluster.stop()
            os.environ.pop("RAY_ADDRESS", None)
        if ray_tmpdir:
            shutil.rmtree(ray_tmpdir, ignore_errors=True)
    print(f"[sim_scale] {args.nodes} nodes: {status} in {wall:.1f} s ({details})", flush=True)

    events_path = results_dir / "scale" / "events.jsonl"
    events = read_events(events_path) if events_path.is_file() else []
    actors = sum(1 for name in sampler.names.values() if name == "ray::ClientAppActor")
    dispatch = next((e for e in events if e["event"] == "dispatch"), None)
    result: dict[str, Any] = {
        "benchmark": "sim_scale",
        "provenance": provenance("python -m benchmarks.sim_scale", argv),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": _cpu_count()},
        "args": {
            k: v for k, v in vars(args).items() if k not in ("out", "run_dir", "baseline_tree")
        },
        "run_config": {k: v for k, v in config.items() if k != "results-dir"},
        "status": status,
        "details": details,
        "wall_s": round(wall, 2),
        "error_tail": error,
    }
    if state_dir is not None:
        result["node_state"] = node_state_files(state_dir)
        if not args.keep_node_state:
            shutil.rmtree(state_dir, ignore_errors=True)
    if dispatch is not None and any(e["event"] == "arrival" for e in events):
        codec = codec_seconds(args.model, args.dataset, str(dispatch["uplink_codec"]), "none+fp16")
        result["codec"] = codec
        result["loop"] = loop_figures(events, codec, actors)
        result["loop"]["code"] = git_commit(PROJECT_ROOT)
        if args.plain_tasks > 0:
            plain = plain_tasks(
                config,
                args.nodes,
                args.plain_tasks,
                actors,
                str(dispatch["uplink_codec"]),
                "none+fp16",
            )
            rate = result["loop"]["updates_per_s"]
            plain["plain_overhead_share"] = (
                round(1.0 - rate / plain["updates_per_s"], 4) if rate else None
            )
            result["plain"] = plain
    if baseline is not None:
        result["baseline"] = baseline
        result["vs_baseline"] = baseline_ratios(result, baseline)
    warmup = int(args.warmup * args.updates)
    result["rss"] = rss_report(sampler.samples, sampler.names, warmup_progress=warmup)
    result["rss_series"] = rss_series(sampler.samples, result["rss"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if sampler.samples:
        plot_rss(
            result["rss"],
            sampler.samples,
            out.with_suffix(".png"),
            f"sim_scale: {args.nodes} nodes, {args.updates} updates ({status})",
        )
    _print_summary(result)
    print(f"[sim_scale] wrote {out} (run folder {run_dir})")
    return 0 if status == "finished:completed" else 1


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def _print_summary(result: dict[str, Any]) -> None:
    loop = result.get("loop", {})
    if loop:
        print(
            f"[sim_scale] {loop['updates']} updates in a {loop['loop_wall_s']:.1f} s loop "
            f"({loop['updates_per_s']} updates/s), setup {loop['probe_and_setup_s']:.1f} s, "
            f"{loop['clientapp_actors']} actors, overhead share {loop['overhead_share']:.1%}"
        )
    if "baseline" in result:
        old = result["baseline"].get("loop", {})
        print(
            f"[sim_scale] baseline {result['baseline']['tree_commit']}: "
            f"{old.get('updates_per_s')} updates/s, setup {old.get('probe_and_setup_s')} s; "
            f"ratios {result['vs_baseline']}"
        )
    if "node_state" in result:
        files = result["node_state"]
        print(
            f"[sim_scale] node state on disk: {files['files']} files of {files['nodes']} "
            f"nodes, {files['bytes'] / 1e9:.2f} GB"
        )
    plain = result.get("plain")
    if plain:
        print(
            f"[sim_scale] no Flower: {plain['updates_per_s']} updates/s on {plain['workers']} "
            f"workers; the simulator's share {plain['plain_overhead_share']:.1%}"
        )
    for proc in sorted(result["rss"]["processes"], key=lambda p: -p["peak_mb"])[:10]:
        print(
            f"[sim_scale]   {proc['name']:<28} pid {proc['pid']:>7}: peak {proc['peak_mb']:7.1f} MB"
            f", {proc['mb_per_1k_updates']} MB/1k updates after warm-up"
        )


if __name__ == "__main__":
    sys.exit(main())
