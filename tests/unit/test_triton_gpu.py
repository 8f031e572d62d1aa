"""The compiled Triton kernels on a real CUDA device against the CPU path.

The other ``test_triton_*`` modules run the kernels interpreted; this one runs what
the compiler made of them (FMA contraction, approximate division, atomics) in a
subprocess with ``TRITON_INTERPRET=0``, because a process decides once, when a kernel
is first decorated, whether it is interpreted. Skips cleanly without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_compiled_kernels_match_the_cpu_bit_for_bit() -> None:
    out = _run(["-m", "kernels.triton.selfcheck", "--device", "cuda", "--n", "4000003"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_codec_on_cuda_gives_the_cpu_bytes() -> None:
    code = """
import torch
from fedsync.codec import UpdateCodec
from kernels import dispatch
import kernels.triton as kt
assert kt.install()
specs = ["topk:0.01+uniform:8", "dgc:0.001+uniform:4", "sidco:0.01+fp16",
         "topk:0.05+qsgd:16", "topk:0.05+ternary", "topk:0.05+sign", "dgc:0.01+uniform:8+ef"]
g = torch.Generator().manual_seed(0)
update = {"w": torch.randn(2000, 1000, generator=g), "b": torch.randn(1000, generator=g)}
bad = []
for spec in specs:
    cpu = UpdateCodec(spec, seed=3)
    gpu = UpdateCodec(spec, seed=3)
    for _ in range(2):
        a = cpu.encode(update)
        b = gpu.encode({k: v.cuda() for k, v in update.items()})
        if a != b:
            bad.append(spec)
print("mismatch:", bad)
raise SystemExit(1 if bad else 0)
"""
    out = _run(["-c", code])
    assert out.returncode == 0, out.stdout + out.stderr
