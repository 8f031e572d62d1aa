"""Bit packing and index sections built on the device (Triton).

What the wire format carries for one tensor -- b-bit codes and an index section --
can be built where the update lives, so only the compressed bytes cross to the
host. Every function returns the exact bytes of its CPU counterpart:

* :func:`pack_bits` / :func:`unpack_bits` -- :mod:`fedsync.kernels.bitpack` (little-endian
  bit stream, widths 1..56). Each program packs whole groups of 8 values, which fill
  exactly ``width`` bytes, so programs never share a byte.
* :func:`bitmap_encode` -- ``fedsync.kernels.index_coding.bitmap_encode``.
* :func:`elias_fano_encode` -- the Elias-Fano section of
  :func:`fedsync.wire.index_coding.encode_indices` (low bits packed, then the high
  bit array).
* :func:`rice_encode` -- ``fedsync.kernels.index_coding.rice_encode``: an exclusive scan of
  the code lengths gives every code its bit offset, and each code's one bit and low
  bits are OR-ed into place.

The scattered bits are set with ``atomic_or`` on 32-bit words; OR is commutative,
so the result does not depend on the order the hardware applies them. The words
are little-endian, so their bytes are the stream's bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fedsync.kernels.triton._runtime import launch_options

__all__ = [
    "bitmap_encode",
    "elias_fano_encode",
    "pack_bits",
    "packed_nbytes",
    "rice_bits",
    "rice_encode",
    "unpack_bits",
]

MAX_WIDTH = 56
_GROUPS = 256
"""Groups of 8 values per program of the packer (2048 values)."""
_BLOCK = 1024


def packed_nbytes(count: int, width: int) -> int:
    """Bytes that ``count`` values of ``width`` bits occupy."""
    return (count * width + 7) // 8


@triton.jit
def _pack(v_ptr, n, nbytes, out_ptr, W: tl.constexpr, G: tl.constexpr):
    g = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
    i = tl.arange(0, 8)
    pos = g[:, None] * 8 + i[None, :]
    v = tl.load(v_ptr + pos, mask=pos < n, other=0).to(tl.uint64)
    v = v & ((1 << W) - 1)  # bits above the width are dropped, as on the CPU
    for m in tl.static_range(W):
        # Byte m of a group holds stream bits [8m, 8m + 8); value i starts at bit i*W.
        s = i * W - 8 * m
        left = tl.minimum(tl.maximum(s, 0), 63).to(tl.uint64)
        right = tl.minimum(tl.maximum(-s, 0), 63).to(tl.uint64)
        part = tl.where((s >= 0)[None, :], v << left[None, :], v >> right[None, :])
        part = tl.where(((s < 8) & (s > -W))[None, :], part & 0xFF, 0)
        byte = tl.sum(part, 1)  # the parts' bits are disjoint: a sum is an OR
        dst = g * W + m
        tl.store(out_ptr + dst, byte.to(tl.uint8), mask=dst < nbytes)


@triton.jit
def _unpack(buf_ptr, nbytes, n, out_ptr, W: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    bit = i * W
    first = bit >> 3
    acc = tl.zeros([BLOCK], dtype=tl.uint64)
    for j in tl.static_range(NB):
        at = first + j
        b = tl.load(buf_ptr + at, mask=live & (at < nbytes), other=0).to(tl.uint64)
        acc = acc | (b << (8 * j))
    val = (acc >> (bit & 7).to(tl.uint64)) & ((1 << W) - 1)
    tl.store(out_ptr + i, val.to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _set_bits(word_ptr, pos_ptr, n, add_rank, BLOCK: tl.constexpr):
    """Set stream bit ``pos[i] (+ i if add_rank)`` for each ``i``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    p = tl.load(pos_ptr + i, mask=live, other=0) + i * add_rank
    bit = (1 << (p & 31)).to(tl.uint32)
    tl.atomic_or(word_ptr + (p >> 5), bit.to(tl.int32, bitcast=True), mask=live)


@triton.jit
def _shifted(idx_ptr, n, shift, out_ptr, mask_low, BLOCK: tl.constexpr):
    """``out = idx >> shift`` (or ``idx & mask_low`` when ``shift < 0``)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    x = tl.load(idx_ptr + i, mask=live, other=0)
    y = tl.where(shift >= 0, x >> tl.maximum(shift, 0), x & mask_low)
    tl.store(out_ptr + i, y, mask=live)


@triton.jit
def _rice_bits(word_ptr, gap_ptr, off_ptr, n, k, BLOCK: tl.constexpr):
    """OR code ``i``'s one bit and ``k`` low bits (at most 57 bits) into place."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    gap = tl.load(gap_ptr + i, mask=live, other=0)
    p = tl.load(off_ptr + i, mask=live, other=0) + (gap >> k)
    low = (gap & ((tl.full((), 1, tl.int64) << k) - 1)).to(tl.uint64)
    v = (low << 1) | 1
    sh = (p & 31).to(tl.uint64)
    w0 = p >> 5
    part0 = (v << sh) & 0xFFFFFFFF
    part1 = (v >> (32 - sh)) & 0xFFFFFFFF
    part2 = tl.where(sh > 0, (v >> tl.minimum(64 - sh, 63)) & 0xFFFFFFFF, 0)
    tl.atomic_or(word_ptr + w0, part0.to(tl.uint32).to(tl.int32, bitcast=True), mask=live)
    tl.atomic_or(
        word_ptr + w0 + 1, part1.to(tl.uint32).to(tl.int32, bitcast=True), mask=live & (part1 != 0)
    )
    tl.atomic_or(
        word_ptr + w0 + 2, part2.to(tl.uint32).to(tl.int32, bitcast=True), mask=live & (part2 != 0)
    )


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack unsigned integers (any integer dtype, read as unsigned) into a uint8
    tensor of ``packed_nbytes(n, width)`` bytes, on the device: the bytes of
    :func:`fedsync.kernels.bitpack.pack_bits`."""
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be in 1..{MAX_WIDTH}, got {width}")
    n = values.numel()
    nbytes = packed_nbytes(n, width)
    out = torch.empty(nbytes, dtype=torch.uint8, device=values.device)
    if n:
        if values.dtype in (torch.int8, torch.int16, torch.int32):
            # Read signed storage as its unsigned bit pattern.
            values = values.to(torch.int64) & ((1 << (8 * values.element_size())) - 1)
        groups = triton.cdiv(n, 8)
        _pack[(triton.cdiv(groups, _GROUPS),)](
            values, n, nbytes, out, W=width, G=_GROUPS, **launch_options()
        )
    return out


def unpack_bits(buf: torch.Tensor, count: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Unpack ``count`` values of ``width`` bits from a uint8 device tensor."""
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be in 1..{MAX_WIDTH}, got {width}")
    nbytes = packed_nbytes(count, width)
    if buf.numel() < nbytes:
        raise ValueError(f"buf holds {buf.numel()} bytes, {count} values need {nbytes}")
    out = torch.empty(count, dtype=dtype, device=buf.device)
    if count:
        _unpack[(triton.cdiv(count, _BLOCK),)](
            buf,
            nbytes,
            count,
            out,
            W=width,
            NB=(width + 7 + 7) // 8,
            BLOCK=_BLOCK,
            **launch_options(),
        )
    return out


def _words_to_bytes(words: torch.Tensor, nbytes: int) -> torch.Tensor:
    return words.view(torch.uint8)[:nbytes]


def _set(nbits: int, positions: torch.Tensor, add_rank: bool) -> torch.Tensor:
    n = positions.numel()
    words = torch.zeros(triton.cdiv(nbits, 32) + 1, dtype=torch.int32, device=positions.device)
    if n:
        _set_bits[(triton.cdiv(n, _BLOCK),)](
            words, positions, n, int(add_rank), BLOCK=_BLOCK, **launch_options()
        )
    return _words_to_bytes(words, (nbits + 7) // 8)


def bitmap_encode(indices: torch.Tensor, numel: int) -> torch.Tensor:
    """``numel`` bits, bit ``x`` set for each index ``x`` (uint8 on the device)."""
    return _set(numel, indices, add_rank=False)


def elias_fano_encode(indices: torch.Tensor, numel: int, low_bits: int) -> torch.Tensor:
    """The Elias-Fano section: ``low_bits`` low bits of each index packed, then the
    high bit array (``count + ((numel - 1) >> L)`` bits, bit ``(x_i >> L) + i`` set)."""
    n = indices.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=indices.device)
    grid = (triton.cdiv(n, _BLOCK),)
    parts = []
    if low_bits:
        lows = torch.empty_like(indices)
        _shifted[grid](indices, n, -1, lows, (1 << low_bits) - 1, BLOCK=_BLOCK, **launch_options())
        parts.append(pack_bits(lows, low_bits))
    highs = torch.empty_like(indices)
    _shifted[grid](indices, n, low_bits, highs, 0, BLOCK=_BLOCK, **launch_options())
    parts.append(_set(n + ((numel - 1) >> low_bits), highs, add_rank=True))
    return torch.cat(parts)


def _gaps(indices: torch.Tensor) -> torch.Tensor:
    prev = torch.empty_like(indices)
    prev[0] = -1
    prev[1:] = indices[:-1]
    return indices - prev - 1


def rice_bits(indices: torch.Tensor, k: int) -> int:
    """Bits of the Rice code with parameter ``k``: ``n (k + 1) + sum(g >> k)``
    (an integer sum: exact, in any order)."""
    n = indices.numel()
    if n == 0:
        return 0
    return n * (k + 1) + int((_gaps(indices) >> k).sum())


def rice_encode(indices: torch.Tensor, k: int) -> torch.Tensor:
    """The Rice section with parameter ``k`` (``ceil(bits / 8)`` bytes, uint8)."""
    n = indices.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=indices.device)
    gaps = _gaps(indices)
    lengths = (gaps >> k) + (k + 1)
    ends = torch.cumsum(lengths, 0)
    nbits = int(ends[-1])
    offsets = ends - lengths
    words = torch.zeros(triton.cdiv(nbits, 32) + 3, dtype=torch.int32, device=indices.device)
    _rice_bits[(triton.cdiv(n, _BLOCK),)](
        words, gaps, offsets, n, k, BLOCK=_BLOCK, **launch_options()
    )
    return _words_to_bytes(words, (nbits + 7) // 8)
