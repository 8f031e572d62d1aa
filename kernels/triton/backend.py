"""The Triton backend: :class:`fedsync.kernels.dispatch.KernelBackend` for CUDA tensors.

Installed for ``"cuda"`` by :func:`fedsync.kernels.triton.install`; compressors reach it only
through :func:`fedsync.kernels.dispatch.backend_for`. Every method returns what the CPU
backend returns for the same input (positions, values, codes, params: the same
bits); the unit tests run both on the same data, the Triton side under
``TRITON_INTERPRET=1``.

Beyond the protocol it offers the device halves of the stochastic and sign
quantizers (:meth:`qsgd_quantize`, :meth:`ternary_quantize`, :meth:`sign_quantize`,
whose CPU twins are in :mod:`fedsync.kernels.quantize`), the packers of
:mod:`fedsync.kernels.triton.pack`, and the fused decode + scatter-add of
:mod:`fedsync.kernels.triton.scatter`.

Positions, codes and per-chunk params stay on the device (``host`` is false): the
sender's frame writer packs the codes here and copies the frame's sections to the
host once (:mod:`fedsync.wire.staging`). Only scalars (counts, a tensor's one scale)
and the few magnitudes a threshold estimate samples cross earlier.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsync.kernels.dispatch import Array, Selection
from fedsync.kernels.triton import pack as _pack
from fedsync.kernels.triton import quantize as _quantize
from fedsync.kernels.triton import reduce as _reduce
from fedsync.kernels.triton import scatter as _scatter
from fedsync.kernels.triton import select as _select

__all__ = ["TritonBackend"]


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


class TritonBackend:
    """Triton kernels for 1-d contiguous float32 tensors on a CUDA device."""

    name = "triton"
    host = False

    # -- selection ---------------------------------------------------------------------

    def threshold_select(
        self, x: torch.Tensor, threshold: float, limit: int | None = None
    ) -> Selection:
        sel = _select.threshold_select(x, threshold, limit)
        return Selection(sel.count, sel.indices, sel.values)

    def exact_topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return _select.exact_topk(x, k)

    def sample_abs(self, x: torch.Tensor, s: int, seed: int) -> np.ndarray:
        # Positions are drawn on the device: only the s magnitudes cross to the host.
        return _numpy(_select.sample_positions(x, s, seed)[1])

    def gather_abs(self, x: torch.Tensor, positions: np.ndarray) -> np.ndarray:
        """``|x[positions]|`` for host positions (float32, on the host)."""
        index = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(x.device)
        return _numpy(_select.gather_abs(x, index))

    def all_finite(self, x: torch.Tensor) -> bool:
        # One read at memory speed; torch's reduction is as good as a kernel here.
        return bool(torch.isfinite(x).all())

    def abs_moments(self, x: torch.Tensor) -> tuple[float, float]:
        return _reduce.abs_moments(x)

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        """``(sum x, sum x**2)`` in the fixed order (SIDCo's later stages)."""
        return _reduce.moments(x)

    # -- uniform -----------------------------------------------------------------------

    def uniform_quantize(
        self, values: torch.Tensor, bits: int, chunk: int
    ) -> tuple[Array, Array, Array]:
        """Codes, minima and scales, left on the device."""
        return _quantize.uniform_quantize(values, bits, chunk)

    def uniform_dequantize(
        self,
        codes: Array,
        mins: Array,
        scales: Array,
        chunk: int,
        device: torch.device,
    ) -> torch.Tensor:
        def up(a: Array, dtype: torch.dtype) -> torch.Tensor:
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
            return t.to(device=device, dtype=dtype).contiguous()

        return _quantize.uniform_dequantize(
            up(codes, torch.uint8), up(mins, torch.float32), up(scales, torch.float32), chunk
        )

    # -- stochastic and sign quantizers ------------------------------------------------

    def qsgd_quantize(
        self, values: torch.Tensor, levels: int, chunk: int, seed: int
    ) -> tuple[Array, Array]:
        """QSGD codes (uint8, or int16 read as uint16) and norms, on the device (the
        arithmetic of :func:`fedsync.kernels.quantize.qsgd_quantize`)."""
        return _quantize.qsgd_quantize(values, levels, chunk, seed)

    def ternary_quantize(self, values: torch.Tensor, seed: int) -> tuple[Array, np.float32]:
        """Codes on the device; the scale (one number) on the host."""
        return _quantize.ternary_quantize(values, seed)

    def sign_quantize(self, values: torch.Tensor) -> tuple[Array, np.float32]:
        """Codes on the device; the scale (one number) on the host."""
        return _quantize.sign_quantize(values)

    # -- wire sections on the device ---------------------------------------------------

    def pack_bits(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        """The packed code stream, built on the device (see :mod:`.pack`)."""
        return _pack.pack_bits(codes, width)

    def bitmap_encode(self, indices: torch.Tensor, numel: int) -> torch.Tensor:
        """The bitmap index section, built on the device."""
        return _pack.bitmap_encode(indices, numel)

    # -- server side -------------------------------------------------------------------

    def scatter_add_(
        self,
        acc: torch.Tensor,
        indices: torch.Tensor | None,
        values: torch.Tensor,
        weight: float,
    ) -> torch.Tensor:
        """``acc[indices] += values * float32(weight)``, bit-identical to ``index_add_``."""
        return _scatter.scatter_add_(acc, indices, values, weight)
