"""The GPU check's dry run: every step of ``benchmarks/gpu_check.sh`` on the CPU.

The GPU machine is lent for minutes at a time, so the script that spends them is run
here first, whole, at small sizes: Triton interpreted, the GPU tests skipped, the
loopback deployment (real SuperLink and SuperNode over gRPC) on the CPU, its frames
replayed, one task profiled. It must pass every step and leave at most the eight
files the GPU machine sends back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("triton")  # the self-check step needs it (Linux x86-64 only)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def test_every_step_of_the_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHON=sys.executable,
        FEDSYNC_GPU_WHEELS=str(tmp_path / "no-wheels"),  # this machine's Flower, not wheels
    )
    done = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--device", "cpu", "--budget", "600"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    result = json.loads((out / "gpu_check.json").read_text())
    steps = {s["name"]: s["status"] for s in result["steps"]}
    assert steps == dict.fromkeys(
        ["selfcheck", "gpu-tests", "codecs", "deploy", "frames", "profile"], "passed"
    )
    assert result["environment"]["device"] == "cpu"
    frames = json.loads((out / "frames.json").read_text())
    assert frames["records"] == 4 and frames["equal"] == 4
    assert {r["spec"] for r in frames["results"]} == {"dgc:0.05+uniform:8+ef"}
    deploy = json.loads((out / "deploy.json").read_text())
    tasks = deploy["runs"]["exec-poll"]["tasks"]
    assert len(tasks) == 4 and {t["device"] for t in tasks} == {"cpu"}
    assert deploy["settings"]["server-device"] == "cpu"
    profile = json.loads((out / "task_profile.json").read_text())
    assert set(profile["phases"]) == {"data", "model", "train", "delta", "encode"}
    assert profile["frame_bytes"] > 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "deploy.json",
            "frames.json",
            "gpu_check.json",
            "gpu_check.png",
            "gpu_codecs.json",
            "logs.tar.gz",
            "task_profile.json",
        ]
    )
