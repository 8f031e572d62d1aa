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
    out = _run(["-m", "fedsync.kernels.triton.selfcheck", "--device", "cuda", "--n", "4000003"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_codec_on_cuda_gives_the_cpu_bytes() -> None:
    code = """
import torch
from fedsync.codecs import UpdateCodec
from fedsync.kernels import dispatch
import fedsync.kernels.triton as kt
assert kt.install()
specs = ["topk:0.01+uniform:8", "dgc:0.001+uniform:4", "sidco:0.01+fp16",
         "topk:0.05+qsgd:16", "topk:0.05+ternary", "topk:0.05+sign", "dgc:0.01+uniform:8+ef",
         "chunktopk:128+binmean:2+demo:0.95"]
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


def test_cuda_tensors_select_triton_without_asking() -> None:
    """No ``install()`` call: the first CUDA tensor puts the Triton backend to work, for
    a client's codec and for the server's aggregation buffer alike."""
    code = """
import torch
from fedsync.kernels import dispatch
from fedsync.aggregation.buffer import UpdateBuffer
from fedsync.aggregation.validation import validate_update
from fedsync.codecs import UpdateCodec
from fedsync.updates import TensorSpec
x = torch.randn(1_000_003, device="cuda")
assert dispatch.backend_for(x).name == "triton", dispatch.backend_for(x).name
assert dispatch.backend_for(x.cpu()).name != "triton"
codec = UpdateCodec("dgc:0.01+uniform:8", seed=1)
payload = UpdateCodec("dgc:0.01+uniform:8", seed=1).encode({"w": x.cpu()})
assert codec.encode({"w": x}) == payload
sparse = codec.decode(payload)
specs = {"w": TensorSpec("w", (1_000_003,), "float32")}
sums = []
for device in ("cpu", "cuda"):
    buffer = UpdateBuffer(specs, capacity=2, normalization="weight", device=device)
    buffer.add(validate_update(sparse, specs), 0.25)
    buffer.add(validate_update(sparse, specs), 0.75)
    sums.append(buffer.take().update["w"].cpu())
assert torch.equal(sums[0], sums[1])
print("ok")
"""
    out = _run(["-c", code])
    assert out.returncode == 0, out.stdout + out.stderr


def test_sparse_and_dense_accumulators_on_cuda_match_the_cpu() -> None:
    """The buffer's sparse sums (unique, searchsorted, the Triton scatter on compact
    slots) and its dense slots give the CPU's bits on a CUDA device, at a union density
    below and above the switch."""
    code = """
import torch
from fedsync.aggregation.buffer import UpdateBuffer
from fedsync.aggregation.validation import validate_update
from fedsync.updates import SparseTensor, TensorSpec
spec = TensorSpec("w", (1_000_003,), "float32")
gen = torch.Generator().manual_seed(7)
for keep in (300, 60_000):
    updates = []
    for _ in range(3):
        idx = torch.randperm(spec.numel, generator=gen)[:keep].sort().values
        updates.append({"w": SparseTensor(spec, idx, torch.randn(keep, generator=gen))})
    want = None
    for device in ("cpu", "cuda"):
        for kind in ("dense", "sparse", "auto"):
            buffer = UpdateBuffer({"w": spec}, capacity=3, device=device, accumulator=kind)
            for weight, update in zip((0.25, 0.5, 1.0), updates):
                moved = {"w": SparseTensor(spec, update["w"].indices.to(device),
                                           update["w"].values.to(device))}
                buffer.add(validate_update(moved, {"w": spec}), weight)
            got = buffer.take().update["w"].cpu().view(torch.int32)
            want = got if want is None else want
            assert torch.equal(got, want), (keep, device, kind)
print("ok")
"""
    out = _run(["-c", code])
    assert out.returncode == 0, out.stdout + out.stderr
