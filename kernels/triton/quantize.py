"""Quantizers on the device (Triton): the same codes as the CPU, bit for bit.

* uniform: one program per chunk of kept values finds the chunk's min and max,
  its scale, and every code while the chunk is in registers or L1 -- the arithmetic
  of :mod:`fedsync.kernels.quantize` (float32 subtract, correctly rounded divide,
  round-half-to-even, clamp). Where several values tie for the min or the max, the
  first one wins, as in the CPU's sequential loop: that is what decides whether a
  chunk's min is ``-0.0`` or ``+0.0``.
* QSGD and ternary: one element per thread; the uniform comes from ``tl.randint``
  (Philox4x32-10) keyed by the seed and counted by the element's position, which
  :mod:`fedsync.kernels.philox` reproduces on the CPU.
* sign: a comparison, plus the fixed-order sum of :mod:`.reduce`.

Divisions use ``tl.math.div_rn`` (Triton's ``/`` on float32 is an approximation on
NVIDIA GPUs); every launch switches FMA fusion off (:func:`._runtime.launch_options`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from fedsync.kernels.philox import split_seed
from fedsync.kernels.triton import reduce as _reduce
from fedsync.kernels.triton._runtime import launch_options

__all__ = [
    "qsgd_dequantize",
    "qsgd_quantize",
    "sign_quantize",
    "ternary_quantize",
    "uniform_dequantize",
    "uniform_quantize",
]

_EW_BLOCK = 1024
"""Elements per program of the elementwise kernels."""

_MAX_TILE = 4096
"""Largest tile the uniform kernel holds at once; longer chunks loop over tiles."""

_BIG = tl.constexpr(2**62)
"""Above any position: the identity of a first-position min."""


@triton.jit
def _rint(q):
    """Round half to even for ``0 <= q < 2**23`` (exact: ``q - floor(q)`` is exact)."""
    r = tl.floor(q)
    d = q - r
    odd = (r.to(tl.int32) & 1) == 1
    up = (d > 0.5) | ((d == 0.5) & odd)
    return r + up.to(tl.float32)


@triton.jit(do_not_specialize=["levels"])  # levels == 1 (one bit) must stay a tensor
def _uniform_quantize(v_ptr, n, chunk, levels, codes_ptr, mins_ptr, scales_ptr, TILE: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    start = c * chunk
    stop = tl.minimum(start + chunk, n)
    r = tl.arange(0, TILE).to(tl.int64)
    lo = tl.full((), float("inf"), tl.float32)
    hi = tl.full((), float("-inf"), tl.float32)
    lo_at = start
    hi_at = start
    for t0 in range(start, stop, TILE):
        off = t0 + r
        m = off < stop
        v = tl.load(v_ptr + off, mask=m, other=0.0)
        t_lo = tl.min(tl.where(m, v, float("inf")), 0)
        t_hi = tl.max(tl.where(m, v, float("-inf")), 0)
        # First position holding the tile's extreme; strict comparisons below keep
        # the earliest tile's, so ties resolve to the first position overall.
        at_lo = tl.min(tl.where(m & (v == t_lo), off, _BIG), 0)
        at_hi = tl.min(tl.where(m & (v == t_hi), off, _BIG), 0)
        lo_at = tl.where(t_lo < lo, at_lo, lo_at)
        lo = tl.minimum(lo, t_lo)
        hi_at = tl.where(t_hi > hi, at_hi, hi_at)
        hi = tl.maximum(hi, t_hi)
    # Reload the first extremes: equal values can differ in the sign of zero.
    lo = tl.load(v_ptr + lo_at)
    hi = tl.load(v_ptr + hi_at)
    scale = ((hi.to(tl.float64) - lo.to(tl.float64)) / levels).to(tl.float32)
    tl.store(mins_ptr + c, lo)
    tl.store(scales_ptr + c, scale)
    positive = scale > 0
    safe = tl.where(positive, scale, 1.0)
    top = levels.to(tl.float32)
    for t0 in range(start, stop, TILE):
        off = t0 + r
        m = off < stop
        v = tl.load(v_ptr + off, mask=m, other=0.0)
        q = _rint(tl.math.div_rn(v - lo, safe))
        q = tl.minimum(tl.maximum(q, 0.0), top)
        q = tl.where(positive, q, 0.0)
        tl.store(codes_ptr + off, q.to(tl.uint8), mask=m)


@triton.jit
def _uniform_dequantize(codes_ptr, mins_ptr, scales_ptr, n, chunk, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    c = i // chunk
    code = tl.load(codes_ptr + i, mask=m, other=0).to(tl.float32)
    lo = tl.load(mins_ptr + c, mask=m, other=0.0)
    sc = tl.load(scales_ptr + c, mask=m, other=0.0)
    tl.store(out_ptr + i, code * sc + lo, mask=m)  # two roundings: fusion is off


@triton.jit
def _uniform24(seed, i):
    """The i-th float32 uniform of the stream: 24 random bits times 2**-24."""
    return (tl.randint(seed, i) >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit(do_not_specialize=["seed"])
def _qsgd_codes(v_ptr, n, chunk, norms_ptr, seed, s, codes_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(v_ptr + i, mask=m, other=0.0)
    norm = tl.load(norms_ptr + i // chunk, mask=m, other=1.0)
    safe = tl.where(norm > 0, norm, 1.0)
    scaled = tl.math.div_rn(tl.abs(v), safe) * s
    level = tl.floor(scaled + _uniform24(seed, i))
    level = tl.minimum(tl.maximum(level, 0.0), s)
    code = level.to(tl.int32) * 2 + (v < 0).to(tl.int32)
    tl.store(codes_ptr + i, code.to(codes_ptr.dtype.element_ty), mask=m)


@triton.jit
def _qsgd_dequantize(codes_ptr, norms_ptr, n, chunk, s, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    code = tl.load(codes_ptr + i, mask=m, other=0).to(tl.int32) & 0xFFFF
    step = tl.math.div_rn(tl.load(norms_ptr + i // chunk, mask=m, other=0.0), s)
    sign = 1.0 - 2.0 * (code & 1).to(tl.float32)
    tl.store(out_ptr + i, (code >> 1).to(tl.float32) * step * sign, mask=m)


@triton.jit(do_not_specialize=["seed"])
def _ternary_codes(v_ptr, n, scale, seed, codes_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(v_ptr + i, mask=m, other=0.0)
    keep = _uniform24(seed, i) < tl.math.div_rn(tl.abs(v), scale)
    code = tl.where(keep, tl.where(v < 0, 2, 1), 0)
    tl.store(codes_ptr + i, code.to(tl.uint8), mask=m)


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, _EW_BLOCK),)


def uniform_quantize(
    values: torch.Tensor, bits: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes (uint8), mins and scales (float32), on the device; the CPU's bits.

    The contract of :func:`fedsync.kernels.quantize.uniform_quantize`.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    n = values.numel()
    nchunks = triton.cdiv(n, chunk)
    device = values.device
    codes = torch.empty(n, dtype=torch.uint8, device=device)
    mins = torch.empty(nchunks, dtype=torch.float32, device=device)
    scales = torch.empty(nchunks, dtype=torch.float32, device=device)
    if n:
        tile = min(_MAX_TILE, triton.next_power_of_2(chunk))
        _uniform_quantize[(nchunks,)](
            values, n, chunk, (1 << bits) - 1, codes, mins, scales, TILE=tile, **launch_options()
        )
    return codes, mins, scales


def uniform_dequantize(
    codes: torch.Tensor, mins: torch.Tensor, scales: torch.Tensor, chunk: int
) -> torch.Tensor:
    """``code * scale + min`` per chunk, two roundings (float32, on the device)."""
    n = codes.numel()
    out = torch.empty(n, dtype=torch.float32, device=codes.device)
    if n:
        _uniform_dequantize[_grid(n)](
            codes, mins, scales, n, chunk, out, BLOCK=_EW_BLOCK, **launch_options()
        )
    return out


def _signed_seed(seed: int) -> int:
    split_seed(seed)  # validates the range
    return int(seed)


def qsgd_quantize(
    values: torch.Tensor, levels: int, chunk: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """QSGD codes and norms on the device, as :func:`.cpu.qsgd_quantize`.

    Codes are uint8 when ``2 * levels + 1 < 256``, else int16 holding the uint16
    bit pattern (view them as uint16 on the host).
    """
    n = values.numel()
    norms = _reduce.chunk_norms(values, chunk)
    dtype = torch.uint8 if 2 * levels + 1 < 256 else torch.int16
    codes = torch.empty(n, dtype=dtype, device=values.device)
    if n:
        _qsgd_codes[_grid(n)](
            values,
            n,
            chunk,
            norms,
            _signed_seed(seed),
            float(levels),
            codes,
            BLOCK=_EW_BLOCK,
            **launch_options(),
        )
    return codes, norms


def qsgd_dequantize(
    codes: torch.Tensor, norms: torch.Tensor, levels: int, chunk: int
) -> torch.Tensor:
    """``level * (norm / s) * sign`` (float32, on the device)."""
    n = codes.numel()
    out = torch.empty(n, dtype=torch.float32, device=codes.device)
    if n:
        _qsgd_dequantize[_grid(n)](
            codes, norms, n, chunk, float(levels), out, BLOCK=_EW_BLOCK, **launch_options()
        )
    return out


def ternary_quantize(values: torch.Tensor, seed: int) -> tuple[torch.Tensor, np.float32]:
    """TernGrad codes on the device and the scale ``max |v|``, as the CPU's."""
    n = values.numel()
    codes = torch.zeros(n, dtype=torch.uint8, device=values.device)
    if n == 0:
        return codes, np.float32(0.0)
    scale = np.float32(values.abs().max().item())  # a max is exact in any order
    if scale > 0:
        _ternary_codes[_grid(n)](
            values,
            n,
            float(scale),
            _signed_seed(seed),
            codes,
            BLOCK=_EW_BLOCK,
            **launch_options(),
        )
    return codes, scale


def sign_quantize(values: torch.Tensor) -> tuple[torch.Tensor, np.float32]:
    """Sign codes on the device and the fixed-order mean magnitude."""
    n = values.numel()
    scale = np.float32(_reduce.abs_sum(values) / n) if n else np.float32(0.0)
    return (values < 0).to(torch.uint8), scale
