"""Fixed-order float64 sums on the device: the Triton twins of :mod:`fedsync.kernels.ordered_sums`.

Each kernel runs the order :mod:`fedsync.kernels.ordered_sums` writes down, so the CPU and
the GPU produce the same float64 partials bit for bit (see that module for why
this matters and what the order is). The last step, :func:`math.fsum` of at most
:data:`~fedsync.kernels.ordered_sums.LANES2` partials, runs on the host for both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fedsync.kernels.ordered_sums import LANES, LANES2, finish_second
from fedsync.kernels.triton._runtime import launch_options

__all__ = ["abs_moments", "abs_sum", "chunk_norms", "chunk_sumsq", "moments"]

_LANE_BLOCK = 1024
"""Lanes per program: one thread per lane, 1024 threads over 8 warps."""

_CHUNK_BLOCK = 128
"""Chunks per program of :func:`chunk_sumsq` (one thread walks one chunk)."""


@triton.jit
def _lane_moments(x_ptr, n, lanes, steps, abs_ptr, sq_ptr, BL: tl.constexpr, SIGNED: tl.constexpr):
    """Stage 1: lane ``l`` adds ``|x|`` (``x`` if SIGNED) and ``x*x`` of ``x[l],
    x[l + lanes], ...``."""
    lane = tl.program_id(0).to(tl.int64) * BL + tl.arange(0, BL)
    live = lane < lanes
    a1 = tl.zeros([BL], dtype=tl.float64)
    a2 = tl.zeros([BL], dtype=tl.float64)
    for j in range(steps):
        off = j * lanes + lane
        m = live & (off < n)
        # A masked lane adds +0.0, which changes no sum: every sum starts at +0.0, so
        # it is never -0.0 (the one value +0.0 would change).
        v = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float64)
        a1 = a1 + (v if SIGNED else tl.abs(v))
        a2 = a2 + v * v  # rounded product, then sum: fusion is off
    tl.store(abs_ptr + lane, a1, mask=live)
    tl.store(sq_ptr + lane, a2, mask=live)


@triton.jit
def _lane_abs(x_ptr, n, lanes, steps, out_ptr, BL: tl.constexpr):
    """Stage 1 for ``|x|`` only (float32 input)."""
    lane = tl.program_id(0).to(tl.int64) * BL + tl.arange(0, BL)
    live = lane < lanes
    acc = tl.zeros([BL], dtype=tl.float64)
    for j in range(steps):
        off = j * lanes + lane
        v = tl.load(x_ptr + off, mask=live & (off < n), other=0.0).to(tl.float64)
        acc = acc + tl.abs(v)
    tl.store(out_ptr + lane, acc, mask=live)


@triton.jit
def _lane_plain(p_ptr, n, lanes, steps, out_ptr, BL: tl.constexpr):
    """Stage 2: the same walk over float64 partials, adding them as they are."""
    lane = tl.program_id(0).to(tl.int64) * BL + tl.arange(0, BL)
    live = lane < lanes
    acc = tl.zeros([BL], dtype=tl.float64)
    for j in range(steps):
        off = j * lanes + lane
        acc = acc + tl.load(p_ptr + off, mask=live & (off < n), other=0.0)
    tl.store(out_ptr + lane, acc, mask=live)


@triton.jit
def _chunk_sumsq(v_ptr, n, chunk, nchunks, out_ptr, BC: tl.constexpr):
    """Per chunk, ``sum v*v`` in index order (one thread per chunk)."""
    c = tl.program_id(0).to(tl.int64) * BC + tl.arange(0, BC)
    live = c < nchunks
    base = c * chunk
    acc = tl.zeros([BC], dtype=tl.float64)
    for j in range(chunk):
        off = base + j
        v = tl.load(v_ptr + off, mask=live & (off < n), other=0.0).to(tl.float64)
        acc = acc + v * v
    tl.store(out_ptr + c, acc, mask=live)


def _walk(n: int, lanes: int) -> tuple[int, int]:
    return triton.cdiv(lanes, _LANE_BLOCK), triton.cdiv(n, lanes)


def _second(partials: torch.Tensor, lanes2: int) -> float:
    """Stages 2 and 3 from device partials: one small copy to the host."""
    m = partials.numel()
    if m == 0:
        return 0.0
    lanes = min(m, lanes2)
    out = torch.empty(lanes, dtype=torch.float64, device=partials.device)
    grid, steps = _walk(m, lanes)
    _lane_plain[(grid,)](partials, m, lanes, steps, out, BL=_LANE_BLOCK, **launch_options())
    return finish_second(out.cpu().numpy())


def abs_moments(x: torch.Tensor, lanes: int = LANES, lanes2: int = LANES2) -> tuple[float, float]:
    """``(sum |x|, sum x**2)`` of a 1-d contiguous float32 device tensor, in the
    order of :func:`fedsync.kernels.ordered_sums.ordered_abs_moments` (same bits)."""
    n = x.numel()
    if n == 0:
        return 0.0, 0.0
    lanes = min(n, lanes)
    p_abs = torch.empty(lanes, dtype=torch.float64, device=x.device)
    p_sq = torch.empty(lanes, dtype=torch.float64, device=x.device)
    grid, steps = _walk(n, lanes)
    _lane_moments[(grid,)](
        x, n, lanes, steps, p_abs, p_sq, BL=_LANE_BLOCK, SIGNED=False, **launch_options()
    )
    return _second(p_abs, lanes2), _second(p_sq, lanes2)


def moments(x: torch.Tensor, lanes: int = LANES, lanes2: int = LANES2) -> tuple[float, float]:
    """``(sum x, sum x**2)`` of a 1-d contiguous float32 or float64 device tensor, as
    :func:`fedsync.kernels.ordered_sums.ordered_moments` (same bits)."""
    n = x.numel()
    if n == 0:
        return 0.0, 0.0
    lanes = min(n, lanes)
    p_sum = torch.empty(lanes, dtype=torch.float64, device=x.device)
    p_sq = torch.empty(lanes, dtype=torch.float64, device=x.device)
    grid, steps = _walk(n, lanes)
    _lane_moments[(grid,)](
        x, n, lanes, steps, p_sum, p_sq, BL=_LANE_BLOCK, SIGNED=True, **launch_options()
    )
    return _second(p_sum, lanes2), _second(p_sq, lanes2)


def abs_sum(x: torch.Tensor, lanes: int = LANES, lanes2: int = LANES2) -> float:
    """``sum |x|`` in the fixed order (the sign quantizer's scale)."""
    n = x.numel()
    if n == 0:
        return 0.0
    lanes = min(n, lanes)
    partials = torch.empty(lanes, dtype=torch.float64, device=x.device)
    grid, steps = _walk(n, lanes)
    _lane_abs[(grid,)](x, n, lanes, steps, partials, BL=_LANE_BLOCK, **launch_options())
    return _second(partials, lanes2)


def chunk_sumsq(values: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per-chunk ``sum v*v`` (float64, on the device), as
    :func:`fedsync.kernels.ordered_sums.chunk_sumsq`."""
    n = values.numel()
    nchunks = triton.cdiv(n, chunk)
    out = torch.empty(nchunks, dtype=torch.float64, device=values.device)
    if nchunks:
        grid = (triton.cdiv(nchunks, _CHUNK_BLOCK),)
        _chunk_sumsq[grid](values, n, chunk, nchunks, out, BC=_CHUNK_BLOCK, **launch_options())
    return out


def chunk_norms(values: torch.Tensor, chunk: int) -> torch.Tensor:
    """QSGD's per-chunk norms (float32, on the device), as
    :func:`fedsync.kernels.ordered_sums.chunk_norms`.

    The square root and the rounding to float32 are torch ops: both are correctly
    rounded on every device, like numpy's on the CPU.
    """
    return chunk_sumsq(values, chunk).sqrt().to(torch.float32)
