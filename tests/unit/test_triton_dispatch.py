"""How the Triton backend is chosen, and the same bytes through the whole codec.

The codec test registers the Triton backend for ``"cpu"`` (kernels interpreted) and
encodes the same update as the numba backend does: every spec must give the same
frame, byte for byte.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedsync.kernels import dispatch
from fedsync.kernels import triton as kt

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_package_imports_and_falls_back_without_triton() -> None:
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton blocked for this test")
sys.meta_path.insert(0, Block())
import torch
import fedsync.kernels.triton as kt
assert not kt.AVAILABLE and "blocked" in kt.TRITON_ERROR
assert "triton" not in sys.modules
assert kt.install() is False and not kt.runs_on(torch.zeros(1))
acc = torch.zeros(5)
kt.scatter_add_(acc, torch.tensor([1, 3]), torch.tensor([2.0, 4.0]), 0.5)
assert acc.tolist() == [0.0, 1.0, 0.0, 2.0, 0.0]
from fedsync.kernels import dispatch, ordered_sums, philox, quantize  # the CPU twins need no triton
from fedsync.aggregation.buffer import UpdateBuffer
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cpu_kernels_and_codecs_do_not_import_the_triton_package() -> None:
    # The layering: fedsync.kernels.triton imports the CPU twins from kernels, never the
    # reverse; a CPU encode runs without fedsync.kernels.triton being loaded at all.
    code = """
import sys
import torch
from fedsync.compression import build_pipeline, parse_spec
from fedsync.kernels import dispatch, ordered_sums, philox, quantize
for spec in ("sidco:0.01+qsgd:4", "topk:0.05+ternary", "randomk:0.1+sign"):
    build_pipeline(parse_spec(spec)).compress_update({"w": torch.randn(4096)}, seed=3)
loaded = sorted(m for m in sys.modules if m.startswith("fedsync.kernels.triton"))
assert not loaded, loaded
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")
def test_install_is_a_no_op_without_cuda() -> None:
    before = dispatch.registered_backends()
    assert kt.install() is False
    assert dispatch.registered_backends() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")
def test_first_cuda_lookup_probes_once_and_falls_back_without_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The automatic selection: the first CUDA lookup tries to install Triton; without
    a device it leaves the torch backend serving CUDA and never probes again."""
    calls = []
    monkeypatch.setattr(dispatch, "_CUDA_PROBED", False)
    monkeypatch.setattr(kt, "install", lambda **_: calls.append(1) or False)
    before = dispatch.registered_backends()
    for _ in range(3):
        backend = dispatch.backend_for(torch.device("cuda"))
        assert backend.name == dispatch.backend_for(torch.device("meta")).name
    assert calls == [1]
    assert dispatch.registered_backends() == before


@pytest.mark.skipif(not kt.AVAILABLE, reason="needs triton")
def test_install_registers_for_cuda() -> None:
    previous = dispatch.registered_backends().get("cuda")
    saved = dispatch._BACKENDS.get("cuda")
    try:
        assert kt.install(force=True)
        assert dispatch.registered_backends()["cuda"] == "triton"
        assert dispatch.backend_for(torch.device("cuda")) is kt.get_backend()
    finally:
        if saved is None:
            dispatch._BACKENDS.pop("cuda", None)
        else:
            dispatch._BACKENDS["cuda"] = saved
    assert dispatch.registered_backends().get("cuda") == previous


def test_scatter_helper_on_cpu_is_index_add() -> None:
    rng = np.random.default_rng(0)
    idx = torch.from_numpy(np.sort(rng.choice(1000, 100, replace=False)))
    vals = torch.from_numpy(rng.standard_normal(100).astype(np.float32))
    acc = torch.from_numpy(rng.standard_normal(1000).astype(np.float32))
    want = acc.clone().index_add_(0, idx, vals, alpha=0.3)
    assert torch.equal(kt.scatter_add_(acc, idx, vals, 0.3), want)


# --------------------------------------------------------------------------------------
# The same bytes through the codec
# --------------------------------------------------------------------------------------

needs_interpreter = pytest.mark.skipif(
    not (kt.AVAILABLE and kt._runtime.kernels_interpreted()),
    reason="needs the Triton interpreter on CPU tensors",
)


@pytest.fixture
def triton_on_cpu() -> Iterator[None]:
    """Serve CPU tensors with the (interpreted) Triton backend for one test."""
    previous = dispatch.register_backend("cpu", kt.get_backend())
    try:
        yield
    finally:
        assert previous is not None
        dispatch.register_backend("cpu", previous)


def _update(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(300, 500, generator=g) * torch.rand(300, 1, generator=g)
    w[0, :50] = 0.0
    w[1, :50] = -0.0
    return {"w": w, "b": torch.randn(37, generator=g), "e": torch.zeros(3)}


SPECS = [
    "topk:0.01+uniform:8",
    "topk:0.2+uniform:3,chunk=100",
    "dgc:0.01+uniform:8",
    "dgc:0.001,sample=0.02+fp32",
    "sidco:0.01+uniform:4",
    "sidco:0.01,dist=gpd,stages=2+fp16",
    "sidco:0.01,sample=1.0+uniform:4",  # stage 1 from the full fixed-order pass
    "sidco:0.003,dist=gamma-gpd,sample=0.05+fp32",
    "randomk:0.05+qsgd:16",
    "topk:0.05+qsgd:300,chunk=64",
    "topk:0.05+ternary",
    "topk:0.05+sign",
    "none+uniform:8",
    "mask:0.1,seed=3+uniform:2",
    "dgc:0.01+uniform:8+ef",
]


def _frames(spec: str) -> list[bytes]:
    from fedsync.codecs import UpdateCodec

    codec = UpdateCodec(spec, seed=11)
    return [codec.encode(_update(step)) for step in range(2)]


@needs_interpreter
@pytest.mark.parametrize("spec", SPECS)
def test_codec_bytes_match_numba_backend(spec: str, request: pytest.FixtureRequest) -> None:
    want = _frames(spec)
    request.getfixturevalue("triton_on_cpu")
    got = _frames(spec)
    assert got == want
