"""Every GPU check of fedsync in one command, for a machine lent for a few minutes.

Run on the GPU machine (``benchmarks/gpu_check.sh`` installs the carried wheels first)::

    python -m benchmarks.gpu_check --out OUT

and here, on the CPU, as a dry run of the same steps at small sizes (Triton interpreted,
the deployment on the CPU)::

    python -m benchmarks.gpu_check --out OUT --device cpu

Steps, each a subprocess with its own time limit and log; a step that fails or times
out is recorded and the next one runs:

``env``
    what the machine has: ``nvidia-smi``, Python, torch, Triton, CUDA, the device;
``selfcheck``
    :mod:`fedsync.kernels.triton.selfcheck`: every compiled kernel against the CPU path,
    bit for bit;
``gpu-tests``
    ``pytest -m gpu`` over the test modules with CUDA tests (the codec, the device-resident
    encode, live state, rotations, the server device), kernels compiled
    (``TRITON_INTERPRET=0``); on the CPU they skip;
``codecs``
    :mod:`benchmarks.gpu_codecs`: encode, decode and aggregation at 10M and 100M values
    against ``torch.topk`` and the copy bandwidth;
``deploy``
    :mod:`benchmarks.deploy_overhead`: a loopback deployment (real ``flower-superlink`` and
    ``flower-supernode`` over gRPC, TLS, the warm executor) with one node on ``--device``
    and ``server-device`` on it too, every uplink recorded
    (:mod:`fedsync.clientapp.frame_audit`);
``frames``
    those records re-encoded on the CPU: each frame and error-feedback state byte-equal;
``profile``
    :mod:`benchmarks.gpu_task_profile`: one task's phases and the host copies each makes;
``rounding``
    :mod:`benchmarks.gpu_rounding`: which torch ops give the GPU other bits than the CPU;
``cpu-deploy``
    the same deployment with the node and server on the CPU, for the overhead side by side.

Writes ``OUT/gpu_check.json`` (each step's status, seconds, command and the tail of its
log), the steps' JSON, a plot ``OUT/gpu_check.png``, and ``OUT/logs.tar.gz`` (full logs,
frame records, traces). Exit status 0 when every step passed, 1 otherwise. A rerun with
``--only`` starts from a fresh ``OUT/work``: ``frames`` needs ``deploy`` in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fedsync.deploy.proctree import descendants, terminate_pids
from fedsync.reports.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent

GPU_TEST_MODULES = [
    "tests/unit/test_triton_gpu.py",
    "tests/unit/test_codecs_public.py",
    "tests/unit/test_device_resident.py",
    "tests/unit/test_live_state.py",
    "tests/unit/test_compression_rotation.py",
    "tests/unit/test_server_device.py",
]
"""The test modules holding tests marked ``gpu`` (``pytest -m gpu`` selects them)."""

# The codec the deployment runs: threshold selection, 8-bit values, error feedback. On a
# CUDA node every stage of it runs as a Triton kernel.
DEPLOY_CODEC = "dgc:0.05+uniform:8+ef"


@dataclass
class Step:
    """One step's command and limits, and what it did."""

    name: str
    command: list[str]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)
    status: str = "not run"
    seconds: float = 0.0
    returncode: int | None = None
    tail: str = ""


def plan(out: Path, device: str, quick: bool) -> list[Step]:
    """The steps for ``device`` (``quick``: the CPU dry run's sizes)."""
    py = sys.executable
    cuda = device.startswith("cuda")
    work = out / "work"
    audit = work / "frames"
    interpret = {"TRITON_INTERPRET": "0" if cuda else "1"}
    deploy_tasks = "4" if quick else "20"
    deploy = [
        py,
        "-m",
        "benchmarks.deploy_overhead",
        "--modes",
        "exec-poll",
        "--nodes",
        "1",
        "--tasks",
        deploy_tasks,
        "--device-classes",
        "",
        "--run-config",
        f'uplink-codec="{DEPLOY_CODEC}"',
        "--run-config",
        "seed=7",
    ]
    steps = [
        Step(
            "selfcheck",
            [py, "-m", "fedsync.kernels.triton.selfcheck", "--device", device]
            + (["--n", "100003"] if quick else ["--n", "4000003"]),
            120 if cuda else 300,
            interpret,
        ),
        Step(
            "gpu-tests",
            [
                py,
                "-m",
                "pytest",
                "-q",
                "-s",  # the tests' own lines (measured rounding errors) go to the log
                "-m",
                "gpu",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=-ra",
                "--timeout=170",
                *GPU_TEST_MODULES,
                "--deselect",
                "tests/unit/test_triton_gpu.py::test_compiled_kernels_match_the_cpu_bit_for_bit",
            ],
            180,
            interpret,
        ),
        Step(
            "codecs",
            [py, "-m", "benchmarks.gpu_codecs", "--out", str(out / "gpu_codecs.json")]
            + (["--dry-run"] if not cuda else []),
            150,
        ),
        Step(
            "deploy",
            [
                *deploy,
                "--device",
                device,
                "--run-config",
                f'server-device="{device}"',
                "--out",
                str(out / "deploy.json"),
            ],
            150,
            {"FEDSYNC_FRAME_AUDIT": str(audit), **interpret},
        ),
        Step(
            "frames",
            [
                py,
                "-m",
                "fedsync.clientapp.frame_audit",
                str(audit),
                "--json",
                str(out / "frames.json"),
            ],
            60,
            {"TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""},
        ),
        Step(
            "profile",
            [
                py,
                "-m",
                "benchmarks.gpu_task_profile",
                "--device",
                device,
                "--tasks",
                "3",
                "--traces",
                str(work / "traces"),
                "--out",
                str(out / "task_profile.json"),
            ],
            90,
            interpret,
        ),
    ]
    if cuda:
        steps.append(Step("rounding", [py, "-m", "benchmarks.gpu_rounding"], 60, interpret))
        steps.append(
            Step(
                "cpu-deploy",
                [
                    *deploy,
                    "--device",
                    "cpu",
                    "--run-config",
                    'server-device="cpu"',
                    "--out",
                    str(out / "deploy_cpu.json"),
                ],
                120,
            )
        )
    return steps


def run_step(step: Step, logs: Path, deadline: float) -> None:
    """Run ``step`` (never past ``deadline``); record its status and log tail."""
    left = deadline - time.monotonic()
    if left < 10:
        step.status = "skipped: no time left"
        return
    env = dict(os.environ, PYTHONUNBUFFERED="1", **step.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    log = logs / f"{step.name}.log"
    started = time.monotonic()
    print(f"== {step.name}: {' '.join(step.command)}", flush=True)
    with log.open("w") as handle:
        handle.write(f"$ {' '.join(step.command)}\n")
        handle.flush()
        process = subprocess.Popen(
            step.command,
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            step.returncode = process.wait(timeout=min(step.timeout, left))
            step.status = "passed" if step.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            # The step's Flower processes run in sessions of their own: stop every
            # descendant, politely first, so no SuperLink outlives its step.
            terminate_pids([process.pid, *descendants(process.pid)], grace=10.0)
            process.wait()
            step.status = "timed out"
    step.seconds = round(time.monotonic() - started, 1)
    text = log.read_text(errors="replace")
    step.tail = text[-3000:]
    print(f"   {step.status} in {step.seconds} s", flush=True)
    if step.status != "passed":
        print(text[-1500:], flush=True)


def environment(device: str) -> dict[str, Any]:
    """What the machine has (versions, the device, ``nvidia-smi``)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": git_commit(),
        "device": device,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
            }
    except Exception as err:
        info["torch_error"] = repr(err)
    for package in ("triton", "flwr", "numba", "numpy"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    return info


def plot(out: Path) -> None:
    """Compress time against ``torch.topk``, and a task's phases, in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    codecs = out / "gpu_codecs.json"
    profile = out / "task_profile.json"
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    if codecs.is_file():
        report = json.loads(codecs.read_text())
        rows = report["compress"]
        labels = [f"{r['n'] / 1e6:g}M\n{r['density']:.1%}" for r in rows]
        xs = range(len(rows))
        width = 0.27
        for k, (key, name) in enumerate(
            (
                ("torch_topk", "torch.topk + quantize"),
                ("exact_topk", "exact top-k (ours)"),
                ("fused", "threshold path (ours)"),
            )
        ):
            axes[0].bar(
                [x + (k - 1) * width for x in xs],
                [1e3 * r[key]["seconds"] for r in rows],
                width,
                label=name,
            )
        axes[0].set_xticks(list(xs), labels)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("ms per encode (median)")
        axes[0].set_title(f"Compress on {report['device']}")
        axes[0].legend(fontsize=8)
    if profile.is_file():
        report = json.loads(profile.read_text())
        phases = report["phases"]
        names = list(phases)
        axes[1].bar(names, [1e3 * phases[n]["seconds_median"] for n in names])
        for i, name in enumerate(names):
            d2h = phases[name]["copies"].get("DtoH", {}).get("count", 0)
            axes[1].annotate(
                f"{d2h} DtoH",
                (i, 1e3 * phases[name]["seconds_median"]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        axes[1].set_ylabel("ms (median of tasks)")
        axes[1].set_title(f"One task's phases on {report['device']} ({report['spec']})")
    runs = [(name, out / f"{name}.json") for name in ("deploy", "deploy_cpu")]
    runs = [(name, path) for name, path in runs if path.is_file()]
    phases = ("training", "encode", "overhead_s", "round_trip_s")
    for k, (name, path) in enumerate(runs):
        report = json.loads(path.read_text())
        steady = next(iter(report["summary"].values()))["steady"]
        label = f"node and server on {report.get('device', name)}"
        axes[2].bar(
            [i + 0.4 * k for i in range(len(phases))],
            [1e3 * steady.get(p, {}).get("median", 0.0) for p in phases],
            0.4,
            label=label,
        )
    if runs:
        axes[2].set_xticks([i + 0.2 for i in range(len(phases))], phases)
        axes[2].set_ylabel("ms per task (median after the first)")
        axes[2].set_title("Loopback deployment, warm executor")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_check.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (dry run)")
    parser.add_argument("--budget", type=float, default=500.0, help="seconds for all steps")
    parser.add_argument("--only", default="", help="comma-separated steps (a rerun)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget
    out = args.out
    logs = out / "work" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda")
    steps = plan(out, args.device, quick=not cuda)
    if args.only:
        wanted = set(args.only.split(","))
        steps = [s for s in steps if s.name in wanted]
    env = environment(args.device)
    print(json.dumps(env, indent=1), flush=True)
    if cuda and "gpu" not in env:
        print("no CUDA device visible: nothing to check on it", file=sys.stderr)
    for step in steps:
        run_step(step, logs, deadline)
    for extra in out.glob("*.png"):  # the steps' own plots travel in the logs
        extra.replace(out / "work" / extra.name)
    try:
        plot(out)
    except Exception as err:
        print(f"plot failed: {err!r}")
    result = {
        "benchmark": "gpu_check",
        "command": "python -m benchmarks.gpu_check " + " ".join(argv or sys.argv[1:]),
        "environment": env,
        "wall_s": round(time.monotonic() - started, 1),
        "steps": [asdict(s) for s in steps],
    }
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(out / "work", arcname="work")
    shutil.rmtree(out / "work", ignore_errors=True)
    print(f"\n{'step':12s} {'status':14s} {'s':>7s}")
    for step in steps:
        print(f"{step.name:12s} {step.status:14s} {step.seconds:7.1f}")
    return 0 if steps and all(s.status == "passed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
