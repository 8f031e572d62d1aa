"""The sender keeps an update on its device up to the frame, and writes the same bytes.

Three checks:

* every registered stage writes the golden frames (``data/frame_golden.json``, written
  by the codec before positions and codes stayed on the device) on the numba backend,
  the torch backend (what a device without Triton runs) and the Triton backend
  (interpreted on CPU tensors);
* a host-transfer counter: with a device backend serving CPU tensors, no tensor data
  crosses to the host (``Tensor.numpy``, ``.cpu``, ``.tolist``; ``.to("cpu")`` off a
  real device) before the frame is written, and writing it takes one copy;
* the same two on a CUDA device, skipped without one.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import fedsync.codecs as codec_module
from fedsync.codecs import UpdateCodec
from fedsync.compression.pipeline import build_pipeline, flatten
from fedsync.compression.spec import parse_spec
from fedsync.kernels import dispatch
from fedsync.kernels import triton as kt
from fedsync.kernels.bitpack import pack_bits
from fedsync.updates import densify
from fedsync.wire import encode_frame
from tests.unit.frame_golden import (
    GOLDEN,
    GOLDEN_SPECS,
    STEPS,
    accepted,
    digest,
    golden_update,
)

WANT: dict[str, list[str]] = json.loads(GOLDEN.read_text())

interpreted = pytest.mark.skipif(
    not (kt.AVAILABLE and kt._runtime.kernels_interpreted()),
    reason="needs the Triton interpreter on CPU tensors",
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=["numba", "torch", pytest.param("triton", marks=interpreted)])
def cpu_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """CPU tensors served by one backend for the test."""
    backend: dispatch.KernelBackend | None = None
    if request.param == "torch":
        backend = dispatch.TorchBackend()
    elif request.param == "triton":
        backend = kt.get_backend()
    previous = dispatch.register_backend("cpu", backend) if backend is not None else None
    try:
        yield request.param
    finally:
        if previous is not None:
            dispatch.register_backend("cpu", previous)


# The interpreter runs a kernel launch in Python: its specs are the fast half.
TRITON_SPECS = [
    "topk:0.01+uniform:8",
    "randomk:0.02+uniform:8",
    "mask:0.1,seed=3+uniform:2",
    "powersgd:2+fp32",
    "topk:0.05+fp16",
    "topk:0.05+uniform:3,chunk=100",
    "topk:0.05+ternary",
    "topk:0.05+sign",
    "topk:0.01+uniform:8+ef",
    "dgc:0.01+uniform:8+ef:momentum=0.9",
    "dct:4,chunk=64+uniform:8+demo",
]


def _frames(spec: str, device: str = "cpu") -> list[bytes]:
    codec = UpdateCodec(spec, seed=7)
    out = []
    for step in range(STEPS):
        update = {k: v.to(device) for k, v in golden_update(step).items()}
        out.append(codec.encode(update))
    return out


@pytest.mark.parametrize("spec", GOLDEN_SPECS)
def test_every_stage_writes_the_golden_frames(spec: str, cpu_backend: str) -> None:
    if cpu_backend == "triton" and spec not in TRITON_SPECS:
        pytest.skip("interpreted Triton: covered by the faster specs")
    assert digest(_frames(spec)) in accepted(spec)


def test_golden_covers_every_registered_stage() -> None:
    from fedsync.compression.registry import REGISTRY

    used = {stage.name for spec in GOLDEN_SPECS for stage in parse_spec(spec).stages}
    for kind in ("sparsifier", "rotation", "quantizer", "feedback"):
        names = {REGISTRY.lookup(n, kind).name for n in REGISTRY.names(kind)}  # type: ignore[arg-type]
        assert names <= used, names - used


# --------------------------------------------------------------------------------------
# Counting what crosses to the host
# --------------------------------------------------------------------------------------


@dataclass
class HostTransfers:
    """Calls that put tensor data in host memory, by phase (``compress`` or ``frame``)."""

    phase: str = "compress"
    calls: list[tuple[str, str, int, str]] = field(default_factory=list)
    _host: set[int] = field(default_factory=set)

    def of(self, phase: str, *, besides: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        """``(kind, numel)`` of the phase's transfers, except those made by a module
        in ``besides``."""
        return [(k, n) for p, k, n, mod in self.calls if p == phase and mod not in besides]

    def record(self, kind: str, tensor: torch.Tensor, result: Any = None) -> None:
        caller = sys._getframe(2).f_globals.get("__name__", "?")
        self.calls.append((self.phase, kind, tensor.numel(), caller))
        if isinstance(result, torch.Tensor):
            self._host.add(id(result))


def _to_cpu(tensor: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``tensor.to(*args, **kwargs)`` moves it from a device to the host.

    With CPU tensors standing in for a device this never fires (the move is a no-op
    either way); what such a copy feeds -- ``.numpy()`` -- is counted instead.
    """
    if tensor.device.type == "cpu":
        return False
    for a in (*args, kwargs.get("device")):
        if isinstance(a, str | torch.device) and torch.device(a).type == "cpu":
            return True
        if isinstance(a, torch.Tensor) and a.device.type == "cpu":
            return True
    return False


@pytest.fixture
def transfers(monkeypatch: pytest.MonkeyPatch) -> HostTransfers:
    """Count host transfers; the frame writer's own are counted as ``frame``."""
    log = HostTransfers()
    numpy, cpu, tolist, to = (
        torch.Tensor.numpy,
        torch.Tensor.cpu,
        torch.Tensor.tolist,
        torch.Tensor.to,
    )

    def wrap_numpy(self: torch.Tensor, *a: Any, **k: Any) -> np.ndarray:
        if id(self) not in log._host:  # not the result of a transfer counted already
            log.record("numpy", self)
        return numpy(self, *a, **k)

    def wrap_cpu(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        out = cpu(self, *a, **k)
        log.record("cpu", self, out)
        return out

    def wrap_tolist(self: torch.Tensor) -> Any:
        log.record("tolist", self)
        return tolist(self)

    def wrap_to(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        out = to(self, *a, **k)
        if _to_cpu(self, a, k):
            log.record("to(cpu)", self, out)
        return out

    monkeypatch.setattr(torch.Tensor, "numpy", wrap_numpy)
    monkeypatch.setattr(torch.Tensor, "cpu", wrap_cpu)
    monkeypatch.setattr(torch.Tensor, "tolist", wrap_tolist)
    monkeypatch.setattr(torch.Tensor, "to", wrap_to)

    def framing(real: Callable[..., bytes]) -> Callable[..., bytes]:
        def write(*a: Any, **k: Any) -> bytes:
            log.phase = "frame"
            try:
                return real(*a, **k)
            finally:
                log.phase = "compress"

        return write

    monkeypatch.setattr(codec_module, "encode_frame", framing(codec_module.encode_frame))
    return log


# Specs whose whole path has device kernels: positions, codes, params and what error
# feedback subtracts stay on the device. (dgc and sidco also copy the few magnitudes a
# threshold estimate samples; qsgd, ternary and sign run on the host under the torch
# backend, whose device has no bit-exact generator or fixed-order sum.)
RESIDENT = [
    "topk:0.01+uniform:8+ef",
    "topk:0.05+uniform:3,chunk=100",
    "randomk:0.05+uniform:4+ef",
    "mask:0.1,seed=3+uniform:2",
    "none+uniform:8",
    "topk:0.05+fp16+ef",
    "topk:0.05+bf16",
    "none+fp32",
    "powersgd:2+fp32+ef",
    "none+rht+uniform:4+ef",  # the rotation: torch ops on the update's device
]
RESIDENT_TRITON = [
    "topk:0.01+uniform:8+ef",
    "randomk:0.05+uniform:4+ef",
    "topk:0.05+ternary+ef",
    "topk:0.05+sign",
]


def _reference(spec: str) -> list[bytes]:
    """The frames the host (numba) backend writes, for the same inputs."""
    saved = dispatch._BACKENDS["cpu"]
    dispatch._BACKENDS["cpu"] = dispatch.NumbaCpuBackend()
    try:
        return _frames(spec)
    finally:
        dispatch._BACKENDS["cpu"] = saved


def _check_resident(spec: str, transfers: HostTransfers, besides: tuple[str, ...] = ()) -> None:
    want = _reference(spec)
    transfers.calls.clear()
    got = _frames(spec)
    assert got == want
    assert transfers.of("compress", besides=besides) == [], transfers.of("compress")
    framed = transfers.of("frame")
    # One copy per frame (everything on one device), then views of it on the host.
    assert [kind for kind, _ in framed] == ["cpu"] * STEPS, framed


@pytest.mark.parametrize("spec", RESIDENT)
def test_torch_backend_keeps_the_update_on_the_device(
    spec: str, transfers: HostTransfers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(dispatch._BACKENDS, "cpu", dispatch.TorchBackend())
    _check_resident(spec, transfers)


@interpreted
@pytest.mark.parametrize("spec", RESIDENT_TRITON)
def test_triton_backend_keeps_the_update_on_the_device(
    spec: str, transfers: HostTransfers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(dispatch._BACKENDS, "cpu", kt.get_backend())
    # The fixed-order sums (sign's scale) finish on the host from at most 1024 float64
    # lane partials: a size set by the lane count, not by the update.
    _check_resident(spec, transfers, besides=("fedsync.kernels.triton.reduce",))
    assert all(n <= 1024 for _, n in transfers.of("compress"))


def test_the_counter_sees_a_host_round_trip(
    transfers: HostTransfers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check can fail: a backend that copies its codes to the host is caught."""

    class HostCodes(dispatch.TorchBackend):
        def uniform_quantize(self, values, bits, chunk):  # type: ignore[no-untyped-def]
            codes, mins, scales = super().uniform_quantize(values, bits, chunk)
            return codes.cpu().numpy(), mins, scales

    monkeypatch.setitem(dispatch._BACKENDS, "cpu", HostCodes())
    UpdateCodec("topk:0.1+uniform:8+ef").encode(golden_update(0))
    assert ("cpu", 3000) in transfers.of("compress")


def test_host_backend_hands_numpy_views_to_the_encoder() -> None:
    """On the numba backend nothing changes: numpy positions and codes, as before."""
    pipeline = build_pipeline(parse_spec("topk:0.1+uniform:4"))
    spec, flat = flatten("w", golden_update(0)["w"])
    tensor = pipeline.compress(spec, flat, 3).tensor
    assert isinstance(tensor.indices, np.ndarray) and isinstance(tensor.values.codes, np.ndarray)


def test_error_feedback_subtracts_device_codes_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """What error feedback subtracts (decoded from the device codes, never from the
    bytes) is what the receiver decodes: ``sent + residual == input`` to a float32
    rounding; the residual stays the same device tensor from encode to encode."""
    monkeypatch.setitem(dispatch._BACKENDS, "cpu", dispatch.TorchBackend())
    codec = UpdateCodec("topk:0.05+uniform:4+ef", seed=1)
    update = golden_update(0)
    payload = codec.encode(update)
    residual = codec.state.feedback.residuals["w"]
    decoded = UpdateCodec().decode(payload, expected=codec_module.tensor_specs(update))
    sent = decoded["w"].to_dense().reshape(-1)
    assert torch.allclose(sent + residual, update["w"].reshape(-1), atol=1e-6, rtol=0)
    assert not torch.equal(residual, torch.zeros_like(residual))
    codec.encode(golden_update(1))
    assert codec.state.feedback.residuals["w"] is residual


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_torch_packer_writes_the_host_packers_bytes(width: int, dtype: torch.dtype) -> None:
    bits = min(width, torch.iinfo(dtype).bits)
    g = torch.Generator().manual_seed(width)
    n = 2 * 8 * 1000 + 13  # several whole bytes' groups and a ragged tail
    values = torch.randint(0, 1 << min(bits, 30), (n,), generator=g, dtype=torch.int64)
    if bits > 30:
        values |= torch.randint(0, 2, (n,), generator=g) << (bits - 1)
    host = values.numpy().astype(np.uint64)
    codes = values.to(dtype)  # two's complement: the same low bits
    got = dispatch.torch_pack_bits(codes, bits).numpy()
    assert got.tobytes() == pack_bits(host, bits).tobytes()


def test_device_codes_that_break_the_contract_are_refused() -> None:
    pipeline = build_pipeline(parse_spec("none+uniform:4"))
    spec, flat = flatten("w", torch.randn(40))
    tensor = pipeline.compress(spec, flat, 0).tensor
    tensor.values.codes = torch.full((40,), 17, dtype=torch.uint8)  # > 4 bits
    with pytest.raises(ValueError, match="does not fit 4 bits"):
        encode_frame("none+uniform:4", [tensor])
    tensor.values.codes = torch.zeros(40, dtype=torch.float32)
    with pytest.raises(ValueError, match="integers"):
        encode_frame("none+uniform:4", [tensor])


# --------------------------------------------------------------------------------------
# On a CUDA device
# --------------------------------------------------------------------------------------


MATMUL_STAGES = ("powersgd", "dct")
"""Stages that multiply matrices: a GPU's matrix product sums in another order than the
CPU's, so their frames match the CPU's to rounding, not bit for bit (docs/gpu.md)."""


def _matmul(spec: str) -> bool:
    return spec.split(":")[0].split("+")[0] in MATMUL_STAGES


def _assert_close_to_the_cpu(spec: str, got: list[bytes], tolerance: float = 1e-3) -> None:
    """Every frame decodes to the CPU frame's update within ``tolerance`` (relative norm)."""
    want = _frames(spec)
    codec = UpdateCodec(spec, seed=7)
    errors = []
    for mine, theirs in zip(got, want, strict=True):
        a, b = densify(codec.decode(mine)), densify(codec.decode(theirs))
        num = sum(float((a[k] - b[k]).norm()) ** 2 for k in b) ** 0.5
        den = sum(float(b[k].norm()) ** 2 for k in b) ** 0.5
        errors.append(num / den)
    print(f"{spec}: relative error per step {[f'{e:.2e}' for e in errors]}")
    assert max(errors) <= tolerance, errors


@pytest.mark.parametrize("spec", [s for s in GOLDEN_SPECS if _matmul(s)])
def test_the_rounding_check_passes_the_cpus_frames_and_fails_others(spec: str) -> None:
    frames = _frames(spec)
    _assert_close_to_the_cpu(spec, frames)
    with pytest.raises(AssertionError):
        _assert_close_to_the_cpu(spec, frames[1:] + frames[:1])  # each step's another's


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("spec", GOLDEN_SPECS)
def test_cuda_writes_the_golden_frames(spec: str) -> None:
    got = _frames(spec, "cuda")
    if _matmul(spec):
        _assert_close_to_the_cpu(spec, got)
    else:
        assert digest(got) == WANT[spec]


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("spec", RESIDENT)
def test_cuda_update_stays_on_the_device_up_to_the_frame(
    spec: str, transfers: HostTransfers
) -> None:
    got = _frames(spec, "cuda")
    if _matmul(spec):
        _assert_close_to_the_cpu(spec, got)
    else:
        assert digest(got) == WANT.get(spec, digest(_reference(spec)))
    transfers.calls.clear()
    _frames(spec, "cuda")
    # As interpreted: only the fixed-order sums' lane partials may cross early.
    assert transfers.of("compress", besides=("fedsync.kernels.triton.reduce",)) == []
    assert all(n <= 1024 for _, n in transfers.of("compress"))
    assert [kind for kind, _ in transfers.of("frame")] == ["cpu"] * STEPS
