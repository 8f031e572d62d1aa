"""Threshold selection, sampling and exact top-k on the device (Triton).

Selection is one fused pass over the input: each program loads a block of
:data:`BLOCK` values, masks ``not |x| <= t`` (so ``NaN`` is kept, as on the CPU),
counts the block and compacts its survivors, in index order, into its own region of
``cap`` slots (an in-block prefix sum gives each survivor its slot). A second, small
kernel moves the regions into place behind an exclusive scan of the block counts;
it touches only the survivors. The input is read once.

A block whose region overflows (survivors bunched in one place) still reports its
exact count; the rare overflow is then repaired by one exact pass that writes every
survivor straight to its final slot (the counts are known by then). With no
``limit`` or a limit near ``n``, the exact two-pass path is used from the start.

Exact top-k follows the CPU's algorithm (:func:`fedsync.kernels.select.exact_topk`): a
stratified sample's order statistic is a threshold a little below the k-th largest
magnitude, one selection keeps ~1.5 k candidates and the exact k-th value is found
among those with ``torch.topk`` (on ~1.5 k values, where it is cheap). The kept set
is a function of the data alone (ties to lower positions), so it equals the CPU's
whatever sample either side drew. For small inputs or ``k > n / 8``, ``torch.topk``
over the whole input is faster than a sample and a pass: it is used there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from fedsync.kernels import select as _cpu
from fedsync.kernels.triton._runtime import launch_options

__all__ = [
    "BLOCK",
    "DeviceSelection",
    "exact_topk",
    "gather_abs",
    "sample_positions",
    "stratified_positions",
    "threshold_select",
    "topk_of_candidates",
]

BLOCK = 4096
"""Values per program of the selection pass (16 per thread over 8 warps)."""

_SERIAL_TOPK_BELOW = 1 << 17
"""Below this size (as on the CPU) exact top-k skips the sample."""


@triton.jit
def _select_regions(x_ptr, n, t, idx_ptr, val_ptr, count_ptr, cap, BLOCK: tl.constexpr):
    """Count block ``pid``'s survivors; compact the first ``cap`` into its region."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    x = tl.load(x_ptr + offs, mask=inb, other=0.0)
    keep = (~(tl.abs(x) <= t)) & inb  # NaN survives: `<=` is false for it
    k32 = keep.to(tl.int32)
    slot = tl.cumsum(k32, 0) - 1
    tl.store(count_ptr + pid, tl.sum(k32, 0))
    ok = keep & (slot < cap)
    dst = pid * cap + slot
    tl.store(idx_ptr + dst, offs, mask=ok)
    tl.store(val_ptr + dst, x, mask=ok)


@triton.jit
def _count_blocks(x_ptr, n, t, count_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    x = tl.load(x_ptr + offs, mask=inb, other=0.0)
    keep = (~(tl.abs(x) <= t)) & inb
    tl.store(count_ptr + pid, tl.sum(keep.to(tl.int32), 0))


@triton.jit
def _select_exact(x_ptr, n, t, start_ptr, idx_ptr, val_ptr, BLOCK: tl.constexpr):
    """Write block ``pid``'s survivors from ``start[pid]`` on (counts known)."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    x = tl.load(x_ptr + offs, mask=inb, other=0.0)
    keep = (~(tl.abs(x) <= t)) & inb
    slot = tl.cumsum(keep.to(tl.int32), 0) - 1
    dst = tl.load(start_ptr + pid) + slot
    tl.store(idx_ptr + dst, offs, mask=keep)
    tl.store(val_ptr + dst, x, mask=keep)


@triton.jit
def _gather_regions(
    idx_ptr, val_ptr, count_ptr, start_ptr, cap, out_idx, out_val, CAP: tl.constexpr
):
    """Move region ``pid`` (``count[pid]`` entries) to ``start[pid]``."""
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, CAP)
    m = r < tl.load(count_ptr + pid)
    src = pid * cap + r
    dst = tl.load(start_ptr + pid) + r
    tl.store(out_idx + dst, tl.load(idx_ptr + src, mask=m), mask=m)
    tl.store(out_val + dst, tl.load(val_ptr + src, mask=m), mask=m)


@triton.jit(do_not_specialize=["seed"])  # seed == 1 must stay a tensor
def _stratified_abs(x_ptr, n, s, q, r, seed, pos_ptr, abs_ptr, BLOCK: tl.constexpr):
    """Stratum ``i``'s draw, its position and ``|x|`` there.

    The arithmetic of ``fedsync.kernels.select._stratum_draw``: one splitmix64 step from the
    state ``seed ^ (i * 0xD1B54A32D192ED03)``, so every stratum draws on its own.
    """
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < s
    z = (seed.to(tl.uint64) ^ (i.to(tl.uint64) * 0xD1B54A32D192ED03)) + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    u = (z >> 11).to(tl.float64) * (1.0 / 9007199254740992.0)
    lo = i * q + tl.minimum(i, r)
    width = q + (i < r).to(tl.int64)
    pos = lo + tl.minimum((u * width.to(tl.float64)).to(tl.int64), width - 1)
    tl.store(pos_ptr + i, pos, mask=live)
    tl.store(abs_ptr + i, tl.abs(tl.load(x_ptr + pos, mask=live, other=0.0)), mask=live)


@triton.jit
def _gather_abs(x_ptr, pos_ptr, m, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < m
    pos = tl.load(pos_ptr + i, mask=live, other=0)
    tl.store(out_ptr + i, tl.abs(tl.load(x_ptr + pos, mask=live, other=0.0)), mask=live)


@dataclass
class DeviceSelection:
    """Survivors of a threshold, on the input's device.

    Attributes
    ----------
    count : int
        Exact number of entries with ``not |x| <= threshold``.
    indices, values : torch.Tensor or None
        int64 increasing positions and their float32 values; ``None`` when ``count``
        exceeded the caller's limit.
    overflowed : bool
        Whether a region overflowed and the exact repair pass ran (for benchmarks).
    """

    count: int
    indices: torch.Tensor | None
    values: torch.Tensor | None
    overflowed: bool = False


def _exclusive_scan(counts: torch.Tensor) -> torch.Tensor:
    inclusive = torch.cumsum(counts.to(torch.int64), 0)
    return inclusive - counts


def _region_cap(n: int, cap_total: int) -> int:
    """Slots per block: the block's share of the limit plus room for uneven spread."""
    share = BLOCK * cap_total / max(n, 1)
    return min(BLOCK, triton.next_power_of_2(int(1.25 * share) + 32))


def threshold_select(
    x: torch.Tensor, threshold: float, limit: int | None = None
) -> DeviceSelection:
    """Positions and values of the entries with ``not |x| <= float32(threshold)``.

    The contract of :func:`fedsync.kernels.select.threshold_select` (the CPU kernel), with
    tensors on ``x``'s device: same count, same positions, same values.

    Parameters
    ----------
    x : torch.Tensor
        1-d contiguous float32.
    threshold : float
        Rounded to float32 first, as every backend does.
    limit : int, optional
        Above this many survivors only the count comes back.
    """
    n = x.numel()
    device = x.device
    t = float(np.float32(threshold))
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return DeviceSelection(0, empty, torch.zeros(0, dtype=torch.float32, device=device))
    cap_total = n if limit is None else max(0, min(int(limit), n))
    nblocks = triton.cdiv(n, BLOCK)
    counts = torch.empty(nblocks, dtype=torch.int32, device=device)
    opts = launch_options()
    cap = _region_cap(n, cap_total)
    two_pass = cap >= BLOCK // 2  # regions would be as large as the input: count first
    if two_pass:
        _count_blocks[(nblocks,)](x, n, t, counts, BLOCK=BLOCK, **opts)
        total = int(counts.sum())
        overflow = False
    else:
        region_idx = torch.empty(nblocks * cap, dtype=torch.int64, device=device)
        region_val = torch.empty(nblocks * cap, dtype=torch.float32, device=device)
        _select_regions[(nblocks,)](
            x, n, t, region_idx, region_val, counts, cap, BLOCK=BLOCK, **opts
        )
        total, most = (int(v) for v in torch.stack([counts.sum(), counts.max()]).tolist())
        overflow = most > cap
    if total > cap_total:
        return DeviceSelection(total, None, None)
    out_idx = torch.empty(total, dtype=torch.int64, device=device)
    out_val = torch.empty(total, dtype=torch.float32, device=device)
    if total == 0:
        return DeviceSelection(0, out_idx, out_val)
    start = _exclusive_scan(counts)
    if two_pass or overflow:
        _select_exact[(nblocks,)](x, n, t, start, out_idx, out_val, BLOCK=BLOCK, **opts)
    else:
        _gather_regions[(nblocks,)](
            region_idx, region_val, counts, start, cap, out_idx, out_val, CAP=cap, **opts
        )
    return DeviceSelection(total, out_idx, out_val, overflowed=overflow)


def stratified_positions(x: torch.Tensor, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU's stratified sample (:func:`fedsync.kernels.select.stratified_positions`)
    drawn on the device, and ``|x|`` there: ``(positions int64, magnitudes float32)``.

    Bit-identical positions: splitmix64 is integer arithmetic, and the one float
    step (``u * width``, rounded once, truncated) is IEEE on both sides.
    """
    n = x.numel()
    if not 0 < s <= n:
        raise ValueError(f"sample size must be in 1..{n}, got {s}")
    positions = torch.empty(s, dtype=torch.int64, device=x.device)
    mags = torch.empty(s, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(s, 1024),)
    seed64 = int(seed) % (1 << 64)
    if seed64 >= 1 << 63:
        seed64 -= 1 << 64  # the same 64 bits, as the signed argument a kernel takes
    _stratified_abs[grid](
        x, n, s, n // s, n % s, seed64, positions, mags, BLOCK=1024, **launch_options()
    )
    return positions, mags


def sample_positions(x: torch.Tensor, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU's threshold sample (:func:`fedsync.kernels.select.sample_positions`) on the
    device: ``(positions int64, magnitudes float32)``, ``sample_size(n, s)`` of each.

    A sparse sample takes whole cache lines: the line of each stratum is the
    stratified draw over the ``n // LINE`` lines (the same splitmix64 draw as the
    CPU's), then expanded to its ``LINE`` positions.
    """
    n = x.numel()
    size = _cpu.sample_size(n, s)
    if not _cpu.clustered(n, size):
        return stratified_positions(x, size, seed)
    # The line draws are the stratified positions over an array of n // LINE values
    # (any prefix of x of that length: only the positions are used).
    lines, _ = stratified_positions(x[: n // _cpu.LINE], size // _cpu.LINE, seed)
    offsets = torch.arange(_cpu.LINE, dtype=torch.int64, device=x.device)
    positions = (lines[:, None] * _cpu.LINE + offsets).reshape(-1)
    return positions, gather_abs(x, positions)


def gather_abs(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``|x[positions]|`` on the device (positions in range, int64 on the device)."""
    m = positions.numel()
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        _gather_abs[(triton.cdiv(m, 1024),)](x, positions, m, out, BLOCK=1024, **launch_options())
    return out


def topk_of_candidates(indices: torch.Tensor, values: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest ``|values|`` among candidates, ties to lower positions.

    ``indices`` are increasing, so ties resolved by order within the candidates are
    ties resolved by position; ``NaN`` ranks as ``+inf`` (the rule of
    :func:`fedsync.kernels.select.keep_top_k`).
    """
    m = values.numel()
    if k >= m:
        return indices
    mags = torch.nan_to_num(values.abs(), nan=math.inf, posinf=math.inf)
    kth = torch.topk(mags, k, sorted=False).values.min()
    keep = mags > kth
    need = k - int(keep.sum())
    if need > 0:
        ties = mags == kth
        keep |= ties & (torch.cumsum(ties.to(torch.int64), 0) <= need)
    return indices[keep]


def exact_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Increasing positions of the ``k`` largest ``|x|`` (ties to lower positions).

    Same set as :func:`fedsync.kernels.select.exact_topk` on the CPU (module docstring).
    """
    n = x.numel()
    k = max(0, min(int(k), n))
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=x.device)
    if k == n:
        return torch.arange(n, device=x.device)
    if 8 * k >= n or n < _SERIAL_TOPK_BELOW:
        # torch.topk over everything wins here: no sample, no selection pass.
        everything = torch.arange(n, device=x.device)
        return topk_of_candidates(everything, x, k)
    s = min(n, max(1 << 14, int(64 * n / k)))
    _, sample = stratified_positions(x, s, 0x5EED)
    sample = torch.sort(sample, descending=True).values
    if bool(torch.isnan(sample).any()):
        sel = threshold_select(x, -1.0)
        assert sel.indices is not None and sel.values is not None
        return topk_of_candidates(sel.indices, sel.values, k)
    want = 1.5 * k + 4.0 * math.sqrt(k) + 16
    rank = min(s, math.ceil(want * s / n))
    limit = int(4 * want)
    host_sample = sample.cpu().numpy()  # one copy; each probe then reads a float
    while rank <= s:
        t = float(host_sample[rank - 1])
        sel = threshold_select(x, t, limit)
        if sel.count < k:
            rank *= 4
            continue
        if sel.indices is None:
            sel = threshold_select(x, t, sel.count)
        assert sel.indices is not None and sel.values is not None
        return topk_of_candidates(sel.indices, sel.values, k)
    sel = threshold_select(x, -1.0)
    assert sel.indices is not None and sel.values is not None
    return topk_of_candidates(sel.indices, sel.values, k)
