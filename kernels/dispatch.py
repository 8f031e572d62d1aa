"""One dispatch point from a tensor's device to the kernels that serve it.

Compressors never branch on the device themselves: they call
``backend_for(x).threshold_select(x, t, limit)`` and friends. The registry is keyed by
``torch.device.type``:

* ``"cpu"`` -> :class:`NumbaCpuBackend` (the numba kernels of :mod:`kernels.select`
  and :mod:`kernels.quantize`, zero-copy through ``Tensor.numpy()``);
* anything else (``"cuda"``, ``"mps"``, ...) -> :class:`TorchBackend`, plain torch ops
  that run wherever the tensor lives.

This is the seam for GPU kernels: a Triton backend implements :class:`KernelBackend`
and is installed with ``register_backend("cuda", TritonBackend())``; nothing above
this module changes. Every backend must return exactly what :class:`TorchBackend`
returns (same positions, same codes), which the unit tests check on CPU by running
both; that is what makes the same spec produce the same bytes on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from kernels import ordered_sums as _ordered
from kernels import quantize as _quantize
from kernels import select as _select

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

    def threshold_select(
        self, x: torch.Tensor, threshold: float, limit: int | None = None
    ) -> Selection:
        """Entries with ``not |x| <= float32(threshold)``, in index order."""
        ...

    def exact_topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Increasing positions of the ``k`` largest ``|x|``; ties to lower positions."""
        ...

    def sample_abs(self, x: torch.Tensor, s: int, seed: int) -> np.ndarray:
        """``|x|`` at :func:`kernels.select.sample_positions` ``(len(x), s, seed)``,
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
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-chunk uniform codes (uint8), minima and scales (float32), on the host."""
        ...

    def uniform_dequantize(
        self,
        codes: np.ndarray,
        mins: np.ndarray,
        scales: np.ndarray,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        """``code * scale + min`` per chunk, float32 on ``device``."""
        ...

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        """``(sum x, sum x**2)`` of float32 or float64 ``x`` in float64, in the fixed
        order of :mod:`kernels.ordered_sums` (same bits on every backend)."""
        ...

    def qsgd_quantize(
        self, values: torch.Tensor, levels: int, chunk: int, seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """QSGD codes and per-chunk norms on the host; Philox uniforms from ``seed``
        (the arithmetic of :func:`kernels.quantize.qsgd_quantize`)."""
        ...

    def ternary_quantize(self, values: torch.Tensor, seed: int) -> tuple[np.ndarray, np.float32]:
        """TernGrad codes on the host and the scale ``max |v|``."""
        ...

    def sign_quantize(self, values: torch.Tensor) -> tuple[np.ndarray, np.float32]:
        """Sign codes on the host and the fixed-order mean magnitude."""
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


class TorchBackend:
    """Plain torch ops: correct on every device, the reference for other backends."""

    name = "torch"

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
        # NaN ranks as +inf, as in the numba backend (see kernels.select.keep_top_k).
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
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = values.numel()
        if n == 0:
            empty = np.zeros(0, dtype=np.float32)
            return np.zeros(0, dtype=np.uint8), empty, empty.copy()
        levels = (1 << bits) - 1
        table = _chunked(values, chunk)
        lo = table.amin(dim=1)
        hi = table.amax(dim=1)
        scale = ((hi.double() - lo.double()) / levels).float()
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = ((table - lo[:, None]) / safe[:, None]).round_().clamp_(0, levels)
        q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q))
        codes = q.to(torch.uint8).reshape(-1)[:n]
        return (
            codes.cpu().numpy(),
            lo.cpu().numpy().astype(np.float32, copy=False),
            scale.cpu().numpy().astype(np.float32, copy=False),
        )

    def uniform_dequantize(
        self,
        codes: np.ndarray,
        mins: np.ndarray,
        scales: np.ndarray,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        n = codes.shape[0]
        c = torch.from_numpy(np.ascontiguousarray(codes).astype(np.float32)).to(device)
        lo = torch.from_numpy(np.ascontiguousarray(mins, dtype=np.float32)).to(device)
        sc = torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32)).to(device)
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


# --------------------------------------------------------------------------------------
# Numba: CPU
# --------------------------------------------------------------------------------------


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().contiguous().numpy()


class NumbaCpuBackend:
    """numba kernels on CPU tensors, zero-copy through ``Tensor.numpy()``."""

    name = "numba"

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
        # The fixed order every backend shares (kernels.ordered_sums), not the
        # thread-count-dependent chunked sum: SIDCo's threshold must not depend on
        # the device or the machine.
        return _ordered.ordered_abs_moments(_host(x))

    def uniform_quantize(
        self, values: torch.Tensor, bits: int, chunk: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _quantize.uniform_quantize(_host(values), bits, chunk)

    def uniform_dequantize(
        self,
        codes: np.ndarray,
        mins: np.ndarray,
        scales: np.ndarray,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        out = torch.from_numpy(_quantize.uniform_dequantize(codes, mins, scales, chunk))
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
    from kernels import triton as _triton  # no Triton import unless it installs

    _triton.install()
    return _BACKENDS.get("cuda")


def backend_for(x: torch.Tensor | torch.device) -> KernelBackend:
    """The backend serving ``x``'s device type (torch ops when none is registered).

    CUDA tensors get the Triton kernels (:mod:`kernels.triton`) when Triton is
    installed, unless ``FEDSYNC_TRITON=0``; the same bytes either way, see
    :mod:`kernels.triton`.
    """
    device = x if isinstance(x, torch.device) else x.device
    backend = _BACKENDS.get(device.type)
    if backend is None and device.type == "cuda" and not _CUDA_PROBED:
        backend = _probe_cuda()
    return backend if backend is not None else _DEFAULT
