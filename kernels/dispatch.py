"""One dispatch point from a tensor's device to the kernels that serve it.

Compressors never branch on the device themselves: they call
``backend_for(x).threshold_select(x, t, limit)`` and friends. The registry is keyed by
``torch.device.type``:

* ``"cpu"`` -> :class:`NumbaCpuBackend` (the numba kernels of :mod:`fedsync.kernels.select`
  and :mod:`fedsync.kernels.quantize`, zero-copy through ``Tensor.numpy()``);
* anything else (``"cuda"``, ``"mps"``, ...) -> :class:`TorchBackend`, plain torch ops
  that run wherever the tensor lives.

This is the seam for GPU kernels: a Triton backend implements :class:`KernelBackend`
and is installed with ``register_backend("cuda", TritonBackend())``; nothing above
this module changes. Every backend must return exactly what :class:`TorchBackend`
returns (same positions, same codes), which the unit tests check on CPU by running
both; that is what makes the same spec produce the same bytes on every device.

Where results live: a backend whose ``host`` is true (numba) hands back numpy arrays,
which on the CPU are the tensors' own memory; every other backend leaves positions,
uniform codes and their params as tensors on the input's device, and packs codes there
(``pack_bits``), so a sender's update crosses to the host once, as the frame's bytes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsync.kernels import bitpack as _bitpack
from fedsync.kernels import ordered_sums as _ordered
from fedsync.kernels import quantize as _quantize
from fedsync.kernels import select as _select

Array = np.ndarray | torch.Tensor
"""A host array or a device tensor (see the module docstring)."""

__all__ = [
    "KernelBackend",
    "NumbaCpuBackend",
    "Selection",
    "TorchBackend",
    "backend_for",
    "register_backend",
    "registered_backends",
]


@dataclass
class Selection:
    """Entries kept by a threshold, as torch tensors on the input's device.

    Attributes
    ----------
    count : int
        Exact number of entries with ``not |x| <= threshold`` (``NaN`` counts).
    indices : torch.Tensor or None
        int64 positions, increasing; ``None`` when ``count`` exceeded the limit.
    values : torch.Tensor or None
        float32 values at ``indices``; ``None`` likewise.
    """

    count: int
    indices: torch.Tensor | None
    values: torch.Tensor | None


class KernelBackend(Protocol):
    """What a device's kernels provide; inputs are 1-d contiguous float32 tensors."""

    name: str
    host: bool
    """Whether results come back as numpy arrays (else: tensors on the input's device)."""

    def threshold_select(
        self, x: torch.Tensor, threshold: float, limit: int | None = None
    ) -> Selection:
        """Entries with ``not |x| <= float32(threshold)``, in index order."""
        ...

    def exact_topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Increasing positions of the ``k`` largest ``|x|``; ties to lower positions."""
        ...

    def sample_abs(self, x: torch.Tensor, s: int, seed: int) -> np.ndarray:
        """``|x|`` at :func:`fedsync.kernels.select.sample_positions` ``(len(x), s, seed)``,
        as a float32 numpy array on the host."""
        ...

    def all_finite(self, x: torch.Tensor) -> bool:
        """Whether every entry of ``x`` is finite."""
        ...

    def abs_moments(self, x: torch.Tensor) -> tuple[float, float]:
        """``(sum |x|, sum x**2)`` in float64 (non-finite iff some entry is)."""
        ...

    def uniform_quantize(
        self, values: torch.Tensor, bits: int, chunk: int
    ) -> tuple[Array, Array, Array]:
        """Per-chunk uniform codes (uint8), minima and scales (float32): numpy arrays
        for a ``host`` backend, tensors on the values' device otherwise."""
        ...

    def uniform_dequantize(
        self,
        codes: Array,
        mins: Array,
        scales: Array,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        """``code * scale + min`` per chunk, float32 on ``device``."""
        ...

    def pack_bits(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        """The bytes of :func:`fedsync.kernels.bitpack.pack_bits` as a uint8 tensor on the codes'
        device (integer codes of any dtype, read as unsigned)."""
        ...

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        """``(sum x, sum x**2)`` of float32 or float64 ``x`` in float64, in the fixed
        order of :mod:`fedsync.kernels.ordered_sums` (same bits on every backend)."""
        ...

    def qsgd_quantize(
        self, values: torch.Tensor, levels: int, chunk: int, seed: int
    ) -> tuple[Array, Array]:
        """QSGD codes and per-chunk norms; Philox uniforms from ``seed`` (the
        arithmetic of :func:`fedsync.kernels.quantize.qsgd_quantize`). A backend with no device
        kernel for them computes them on the host."""
        ...

    def ternary_quantize(self, values: torch.Tensor, seed: int) -> tuple[Array, np.float32]:
        """TernGrad codes and the scale ``max |v|`` (a host scalar)."""
        ...

    def sign_quantize(self, values: torch.Tensor) -> tuple[Array, np.float32]:
        """Sign codes and the fixed-order mean magnitude (a host scalar)."""
        ...


# --------------------------------------------------------------------------------------
# Torch: any device
# --------------------------------------------------------------------------------------


def _chunked(values: torch.Tensor, chunk: int) -> torch.Tensor:
    """View ``values`` as (chunks, chunk), padding the last chunk with its first value.

    Padding with a value of the chunk itself leaves the chunk's min and max unchanged.
    """
    n = values.numel()
    nchunks = -(-n // chunk)
    pad = nchunks * chunk - n
    if pad:
        fill = values[(nchunks - 1) * chunk].expand(pad)
        values = torch.cat([values, fill])
    return values.view(nchunks, chunk)


def _host_copy(x: torch.Tensor) -> np.ndarray:
    """``x`` as a contiguous numpy array on the host (copied off a device)."""
    return x.detach().cpu().contiguous().numpy()


def _tensor(a: Array, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``a`` as a ``dtype`` tensor on ``device`` (no copy when it already is one)."""
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device=device, dtype=dtype)


_ALIGNED = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_UNSIGNED_MASK = {torch.int8: 0xFF, torch.int16: 0xFFFF, torch.int32: 0xFFFFFFFF}
_PACK_BLOCK = 1 << 18
"""Values per step of the torch packer (a multiple of 8: each step fills whole bytes);
bounds its bit-expanded temporaries to a few MB per bit of width."""


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (flattened, row-major) as a 1-d uint8 tensor, on its device.

    A copy only when ``t`` is not densely laid out (an empty or one-element tensor may
    carry stride 0, which a byte view refuses).
    """
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    if flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def torch_pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`fedsync.kernels.bitpack.pack_bits` in torch ops, on the codes' device.

    Whole-byte widths are the codes' little-endian bytes; other widths expand each
    value into its bits and gather every eight into a byte.
    """
    if not 1 <= width <= _bitpack.MAX_WIDTH:
        raise ValueError(f"bit width must be in 1..{_bitpack.MAX_WIDTH}, got {width}")
    codes = codes.reshape(-1)
    aligned = _ALIGNED.get(width)
    if aligned is not None and sys.byteorder == "little":
        # Two's-complement narrowing keeps the low bits: the stream's bytes.
        return byte_view(codes.to(aligned))
    n = codes.numel()
    out = torch.empty(_bitpack.packed_nbytes(n, width), dtype=torch.uint8, device=codes.device)
    wide = codes.to(torch.int64)
    mask = _UNSIGNED_MASK.get(codes.dtype)
    if mask is not None:
        wide &= mask
    wide &= (1 << width) - 1
    shifts = torch.arange(width, device=codes.device)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8, device=codes.device)
    for lo in range(0, n, _PACK_BLOCK):
        block = wide[lo : lo + _PACK_BLOCK]
        bits = ((block[:, None] >> shifts) & 1).to(torch.uint8).reshape(-1)
        pad = -bits.numel() % 8  # only the last block: the stream's final byte
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        start = lo * width // 8
        packed = (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
        out[start : start + packed.numel()] = packed
    return out


class TorchBackend:
    """Plain torch ops: correct on every device, the reference for other backends."""

    name = "torch"
    host = False

    def threshold_select(
        self, x: torch.Tensor, threshold: float, limit: int | None = None
    ) -> Selection:
        t = float(np.float32(threshold))
        keep = ~(x.abs() <= t)
        count = int(keep.sum())
        if limit is not None and count > limit:
            return Selection(count, None, None)
        indices = keep.nonzero().view(-1)
        return Selection(count, indices, x[indices])

    def exact_topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        n = x.numel()
        k = max(0, min(int(k), n))
        if k == n:
            return torch.arange(n, device=x.device)
        if k == 0:
            return torch.zeros(0, dtype=torch.int64, device=x.device)
        # NaN ranks as +inf, as in the numba backend (see fedsync.kernels.select.keep_top_k).
        mags = torch.nan_to_num(x.abs(), nan=math.inf, posinf=math.inf)
        kth = torch.topk(mags, k, sorted=False).values.min()
        keep = mags > kth
        need = k - int(keep.sum())
        if need > 0:
            ties = mags == kth
            keep |= ties & (torch.cumsum(ties, 0) <= need)
        return keep.nonzero().view(-1)

    def sample_abs(self, x: torch.Tensor, s: int, seed: int) -> np.ndarray:
        index = torch.from_numpy(_select.sample_positions(x.numel(), s, seed)).to(x.device)
        return x[index].abs().cpu().numpy().astype(np.float32, copy=False)

    def all_finite(self, x: torch.Tensor) -> bool:
        return bool(torch.isfinite(x).all())

    def abs_moments(self, x: torch.Tensor) -> tuple[float, float]:
        x64 = x.double()
        return float(x64.abs().sum()), float((x64 * x64).sum())

    def uniform_quantize(
        self, values: torch.Tensor, bits: int, chunk: int
    ) -> tuple[Array, Array, Array]:
        n = values.numel()
        if n == 0:
            empty = values.new_zeros(0, dtype=torch.float32)
            return values.new_zeros(0, dtype=torch.uint8), empty, empty.clone()
        levels = (1 << bits) - 1
        table = _chunked(values, chunk)
        lo = table.amin(dim=1)
        hi = table.amax(dim=1)
        scale = ((hi.double() - lo.double()) / levels).float()
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = ((table - lo[:, None]) / safe[:, None]).round_().clamp_(0, levels)
        q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q))
        codes = q.to(torch.uint8).reshape(-1)[:n]
        return codes, lo.float(), scale

    def uniform_dequantize(
        self,
        codes: Array,
        mins: Array,
        scales: Array,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        n = codes.shape[0]
        c = _tensor(codes, device, torch.float32)
        lo = _tensor(mins, device, torch.float32)
        sc = _tensor(scales, device, torch.float32)
        owner = torch.arange(n, device=device) // chunk
        # Product and sum as two ops (never one FMA) to match the numba kernel.
        return c * sc[owner] + lo[owner]

    # The fixed-order sums and the stochastic and sign quantizers run their CPU twins
    # on a host copy (the values are the few kept ones): a device's own reduction
    # order or random generator would change the bytes.

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        return _ordered.ordered_moments(_host_copy(x))

    def qsgd_quantize(
        self, values: torch.Tensor, levels: int, chunk: int, seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return _quantize.qsgd_quantize(_host_copy(values), levels, chunk, seed)

    def ternary_quantize(self, values: torch.Tensor, seed: int) -> tuple[np.ndarray, np.float32]:
        return _quantize.ternary_quantize(_host_copy(values), seed)

    def sign_quantize(self, values: torch.Tensor) -> tuple[np.ndarray, np.float32]:
        return _quantize.sign_quantize(_host_copy(values))

    def pack_bits(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        return torch_pack_bits(codes, width)


# --------------------------------------------------------------------------------------
# Numba: CPU
# --------------------------------------------------------------------------------------


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().contiguous().numpy()


def _as_host(a: Array) -> np.ndarray:
    return _host(a.cpu()) if isinstance(a, torch.Tensor) else np.asarray(a)


class NumbaCpuBackend:
    """numba kernels on CPU tensors, zero-copy through ``Tensor.numpy()``."""

    name = "numba"
    host = True

    def threshold_select(
        self, x: torch.Tensor, threshold: float, limit: int | None = None
    ) -> Selection:
        sel = _select.threshold_select(_host(x), threshold, limit)
        if sel.indices is None or sel.values is None:
            return Selection(sel.count, None, None)
        return Selection(sel.count, torch.from_numpy(sel.indices), torch.from_numpy(sel.values))

    def exact_topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return torch.from_numpy(_select.exact_topk(_host(x), k))

    def sample_abs(self, x: torch.Tensor, s: int, seed: int) -> np.ndarray:
        return _select.sample_abs(_host(x), s, seed)

    def all_finite(self, x: torch.Tensor) -> bool:
        # numpy's check: torch's isfinite().all() costs ~0.2 ms of dispatch on 100k.
        return bool(np.isfinite(_host(x)).all())

    def abs_moments(self, x: torch.Tensor) -> tuple[float, float]:
        # The fixed order every backend shares (fedsync.kernels.ordered_sums), not the
        # thread-count-dependent chunked sum: SIDCo's threshold must not depend on
        # the device or the machine.
        return _ordered.ordered_abs_moments(_host(x))

    def uniform_quantize(
        self, values: torch.Tensor, bits: int, chunk: int
    ) -> tuple[Array, Array, Array]:
        return _quantize.uniform_quantize(_host(values), bits, chunk)

    def uniform_dequantize(
        self,
        codes: Array,
        mins: Array,
        scales: Array,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        args = (_as_host(codes), _as_host(mins), _as_host(scales))
        out = torch.from_numpy(_quantize.uniform_dequantize(*args, chunk))
        return out.to(device)

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        return _ordered.ordered_moments(_host(x))

    def qsgd_quantize(
        self, values: torch.Tensor, levels: int, chunk: int, seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return _quantize.qsgd_quantize(_host(values), levels, chunk, seed)

    def ternary_quantize(self, values: torch.Tensor, seed: int) -> tuple[np.ndarray, np.float32]:
        return _quantize.ternary_quantize(_host(values), seed)

    def sign_quantize(self, values: torch.Tensor) -> tuple[np.ndarray, np.float32]:
        return _quantize.sign_quantize(_host(values))

    def pack_bits(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        host = _host(codes.reshape(-1))
        if host.dtype.kind == "i":
            host = host.view(host.dtype.str.replace("i", "u"))
        return torch.from_numpy(_bitpack.pack_bits(host, width))


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

_DEFAULT: KernelBackend = TorchBackend()
_BACKENDS: dict[str, KernelBackend] = {"cpu": NumbaCpuBackend()}


def register_backend(device_type: str, backend: KernelBackend) -> KernelBackend | None:
    """Serve tensors on ``device_type`` (``"cuda"``, ``"cpu"``, ...) with ``backend``.

    Returns the backend it replaces (``None`` if the device used the torch default),
    so a test or a benchmark can put it back.
    """
    if not isinstance(device_type, str) or not device_type:
        raise ValueError(f"device_type must be a device type name, got {device_type!r}")
    previous = _BACKENDS.get(device_type)
    _BACKENDS[device_type] = backend
    return previous


def registered_backends() -> dict[str, str]:
    """Device type to backend name, for reports (``{"cpu": "numba", ...}``)."""
    return {device: backend.name for device, backend in _BACKENDS.items()}


_CUDA_PROBED = False


def _probe_cuda() -> KernelBackend | None:
    """On the first CUDA tensor, install the Triton backend if Triton is there."""
    global _CUDA_PROBED
    _CUDA_PROBED = True
    from fedsync.kernels import triton as _triton  # no Triton import unless it installs

    _triton.install()
    return _BACKENDS.get("cuda")


def backend_for(x: torch.Tensor | torch.device) -> KernelBackend:
    """The backend serving ``x``'s device type (torch ops when none is registered).

    CUDA tensors get the Triton kernels (:mod:`fedsync.kernels.triton`) when Triton is
    installed, unless ``FEDSYNC_TRITON=0``; the same bytes either way, see
    :mod:`fedsync.kernels.triton`.
    """
    device = x if isinstance(x, torch.device) else x.device
    backend = _BACKENDS.get(device.type)
    if backend is None and device.type == "cuda" and not _CUDA_PROBED:
        backend = _probe_cuda()
    return backend if backend is not None else _DEFAULT
