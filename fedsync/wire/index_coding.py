"""Choosing, sizing, encoding and decoding the positions of one tensor.

An explicit index set travels in one of five codings (see :mod:`fedsync.kernels.index_coding`
and :mod:`fedsync.kernels.context_coding` for the bit layouts). No single one is best across
densities and supports, so the encoder computes the exact size of each candidate
and keeps the smallest:

=========== ==================================================== ====================
coding      section bytes                                        table fields
=========== ==================================================== ====================
dense       0 (only when every position is kept)                 --
bitmap      ceil(numel / 8)                                      --
elias_fano  ceil(n*L / 8) + ceil((n + ((numel - 1) >> L)) / 8)   L, low bits each
rice        ceil((n*(k + 1) + sum(g_i >> k)) / 8)                k; section length
context     what the range coder emits (>= 4)                    section length
=========== ==================================================== ====================

The context coding (an arithmetic-coded bitmap whose probabilities come from each
position's neighbours, see :mod:`fedsync.kernels.context_coding`) is the one that can beat
``H(rho) / rho``, the bound for a random support, on the clustered supports of real
updates. It costs a step per element rather than per position, so the encoder tries
it only on tensors of at most :data:`CONTEXT_MAX_NUMEL` elements whose support an
``O(count)`` test finds clustered (:data:`CONTEXT_MIN_GAIN`), and the decoder
bounds the elements it will step through per frame
(:attr:`~fedsync.wire.FrameLimits.max_context_numel`) and per byte of section
(:attr:`~fedsync.wire.FrameLimits.max_context_numel_per_byte`: the encoder keeps a
context section only if it has at least :func:`context_min_nbytes` bytes).

Elias-Fano's ``L`` is the exact minimiser of its closed-form size. Rice's ``k``
starts from the density (``log2(ln 2 * mean gap)``, the optimum for geometric gaps)
and is refined to the exact minimiser: the size is convex in ``k`` (the saving from
``k`` to ``k + 1``, ``sum(ceil((g >> k) / 2))``, shrinks as ``k`` grows), so walking
downhill from the estimate ends at the global minimum in a few passes.

The size of a coding, as :func:`index_bits_for` reports it, is every bit the tensor's
positions add to a frame: the section, plus the parameter byte of the codings that
have one and the varint section length of those whose length does not follow from
count and numel (the coding's id shares the tensor's head byte with its index mode).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np

from fedsync.kernels import bitpack
from fedsync.kernels import context_coding as ctx_kern
from fedsync.kernels import index_coding as kern
from fedsync.wire.buffer import varint_len
from fedsync.wire.errors import (
    CountMismatch,
    IndexOutOfRange,
    MalformedField,
    PayloadError,
    TruncatedPayload,
    UnorderedIndices,
)
from fedsync.wire.limits import DEFAULT_LIMITS
from fedsync.wire.registry import INDEX_CODINGS

__all__ = [
    "CODINGS_WITH_LENGTH",
    "CODINGS_WITH_PARAM",
    "CONTEXT_MAX_NUMEL",
    "CONTEXT_MIN_BYTES",
    "CONTEXT_MIN_GAIN",
    "IndexPlan",
    "as_index_array",
    "choose_index_coding",
    "context_min_nbytes",
    "decode_indices",
    "ef_nbytes",
    "encode_indices",
    "index_bits_for",
    "index_candidates",
    "max_param",
    "rice_nbytes_bounds",
]

CODINGS_WITH_PARAM: frozenset[str] = frozenset({"elias_fano", "rice"})
"""Codings whose table entry carries a parameter byte (``L`` or ``k``)."""
CODINGS_WITH_LENGTH: frozenset[str] = frozenset({"rice", "context"})
"""Codings whose section length is carried (a varint); the others' follows from
count, numel and parameter."""
CONTEXT_MAX_NUMEL = 1 << 24
"""Largest tensor whose positions may travel context-coded: decoding costs a step
per element, so the format bounds it per tensor (and
:attr:`~fedsync.wire.FrameLimits.max_context_numel` per frame)."""
CONTEXT_MIN_BYTES = 4
"""Shortest context section: the range decoder starts by reading four bytes."""
CONTEXT_MIN_GAIN = 0.97
"""The encoder runs the context coder only where a one-feature estimate (the left
neighbour, the upper one, or whether the column was kept before) already predicts
at most this fraction of the best other coding's bits: on an unclustered support it
cannot win, and skipping it keeps the encoder's cost ``O(count + width)`` there."""


@dataclass(frozen=True)
class IndexPlan:
    """One way to code an index set, with its exact size.

    Parameters
    ----------
    coding : str
        One of :data:`~fedsync.wire.registry.INDEX_CODINGS`.
    param : int
        Rice ``k`` or Elias-Fano ``L``; 0 for the codings without a parameter.
    nbytes : int
        Bytes of the index section.
    """

    coding: str
    param: int
    nbytes: int
    data: bytes | None = field(default=None, compare=False, repr=False)
    """The section itself, for codings that had to build it to size it."""

    @property
    def frame_bits(self) -> int:
        """Bits these positions add to a frame: the section, plus the parameter byte
        and section-length varint of the codings that carry them (the coding's id
        shares the tensor's head byte with its index mode)."""
        table = (self.coding in CODINGS_WITH_PARAM) + (
            varint_len(self.nbytes) if self.coding in CODINGS_WITH_LENGTH else 0
        )
        return 8 * (table + self.nbytes)


def as_index_array(indices: np.ndarray, numel: int, *, label: str = "") -> np.ndarray:
    """Return ``indices`` as a contiguous int64 array after checking that it is a
    strictly increasing set of positions in ``[0, numel)``.

    Raises
    ------
    ValueError
        Naming the first position that breaks the contract.
    """
    arr = np.asarray(indices)
    prefix = f"{label}: " if label else ""
    if arr.ndim != 1:
        raise ValueError(f"{prefix}indices must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{prefix}indices must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= 1 << 63:
        raise ValueError(f"{prefix}index {int(arr.max())} does not fit int64")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    bad = int(kern.first_bad_index(arr, numel))
    if bad >= 0:
        value = int(arr[bad])
        if not 0 <= value < numel:
            raise ValueError(f"{prefix}index #{bad} = {value} is outside [0, {numel})")
        raise ValueError(
            f"{prefix}indices must be strictly increasing: #{bad} = {value} follows "
            f"{int(arr[bad - 1])}"
        )
    return arr


def max_param(numel: int) -> int:
    """Largest Rice ``k`` or Elias-Fano ``L`` worth using for ``numel`` positions.

    Beyond ``bit_length(numel - 1)`` every gap or high part is already zero, so a
    larger parameter only adds bits; decoders reject it.
    """
    return max(numel - 1, 0).bit_length()


def ef_nbytes(count: int, numel: int, low_bits: int) -> int:
    """Bytes of an Elias-Fano section: low parts, then the high bit array."""
    if count == 0:
        return 0
    high_bits = count + ((numel - 1) >> low_bits)
    return bitpack.packed_nbytes(count, low_bits) + (high_bits + 7) // 8


def rice_nbytes_bounds(count: int, numel: int, k: int) -> tuple[int, int]:
    """Smallest and largest possible Rice section for ``count`` positions.

    Every position costs ``k + 1`` bits plus its quotient; the quotients sum to at
    most ``(numel - count) >> k`` because the gaps sum to at most ``numel - count``.
    """
    if count == 0:
        return 0, 0
    least = count * (k + 1)
    most = least + (max(numel - count, 0) >> k)
    return (least + 7) // 8, (most + 7) // 8


def _best_elias_fano(count: int, numel: int) -> IndexPlan:
    best = IndexPlan("elias_fano", 0, ef_nbytes(count, numel, 0))
    for low_bits in range(1, max_param(numel) + 1):
        nbytes = ef_nbytes(count, numel, low_bits)
        if nbytes < best.nbytes:
            best = IndexPlan("elias_fano", low_bits, nbytes)
    return best


def _rice_bits(indices: np.ndarray, k: int) -> int:
    return indices.shape[0] * (k + 1) + int(kern.rice_shift_sum(indices, k))


def _best_rice(indices: np.ndarray, numel: int) -> IndexPlan:
    count = indices.shape[0]
    if count == 0:
        return IndexPlan("rice", 0, 0)
    top = max_param(numel)
    # Mean gap from the density; the geometric optimum is near log2(ln 2 * mean gap).
    mean_gap = (int(indices[-1]) + 1 - count) / count
    k = min(top, max(0, round(math.log2(mean_gap * math.log(2))))) if mean_gap > 0 else 0
    cost = _rice_bits(indices, k)
    # The size is convex in k: walk downhill from the estimate to the minimum.
    step = 1
    if k < top and (up := _rice_bits(indices, k + 1)) < cost:
        k, cost = k + 1, up
    else:
        step = -1
    while 0 <= k + step <= top:
        nxt = _rice_bits(indices, k + step)
        if nxt >= cost:
            break
        k, cost = k + step, nxt
    return IndexPlan("rice", k, (cost + 7) // 8)


def grid(shape: tuple[int, ...] | None, numel: int) -> tuple[int, int]:
    """``(rows, width)`` of the context coder's view: the first dimension by the
    rest for two or more dimensions, else one row."""
    if shape is not None and len(shape) >= 2 and shape[0] > 0:
        return int(shape[0]), numel // int(shape[0])
    return 1, numel


def _bits_h(ones: int, total: int) -> float:
    """``total * H(ones / total)``: ideal bits of ``total`` binary symbols."""
    if total <= 0 or ones <= 0 or ones >= total:
        return 0.0
    p = ones / total
    return -total * (p * math.log2(p) + (1 - p) * math.log2(1 - p))


def _looks_clustered(indices: np.ndarray, numel: int, width: int, best_bits: int) -> bool:
    """Whether knowing the left or the upper neighbour alone would save enough to
    try the context coder (see :data:`CONTEXT_MIN_GAIN`); ``O(count)``."""
    count = indices.shape[0]
    columns = width < numel and width <= 8 * count  # O(width) work only where it is O(count)
    pairs = ctx_kern.neighbour_pairs(indices, width, columns)
    left, up, cells, ones = (int(v) for v in pairs)
    estimate = math.inf
    for pairs in (left, up):
        # ``count`` positions follow a kept one; ``pairs`` of them are kept.
        bits = _bits_h(pairs, count) + _bits_h(count - pairs, numel - count)
        estimate = min(estimate, bits)
    # Columns: below a column's first kept position, ``ones`` of ``cells`` are kept.
    if columns:
        estimate = min(estimate, _bits_h(ones, cells) + _bits_h(count - ones, numel - cells))
    return estimate <= CONTEXT_MIN_GAIN * best_bits


def context_min_nbytes(
    numel: int, per_byte: int = DEFAULT_LIMITS.max_context_numel_per_byte
) -> int | None:
    """Shortest context section a tensor of ``numel`` elements may have.

    Parameters
    ----------
    numel : int
        Elements of the tensor.
    per_byte : int
        Most elements a section may cover per byte
        (:attr:`~fedsync.wire.FrameLimits.max_context_numel_per_byte`).

    Returns
    -------
    int or None
        ``max(CONTEXT_MIN_BYTES, ceil(numel / per_byte))``; ``None`` when ``per_byte``
        is 0 (no context section is allowed).
    """
    if per_byte <= 0:
        return None
    return max(CONTEXT_MIN_BYTES, -(-numel // per_byte))


def _context_plan(
    indices: np.ndarray, numel: int, shape: tuple[int, ...] | None, budget: int
) -> IndexPlan | None:
    """The context-coded section if it fits ``budget`` bytes and has the bytes the
    decoder asks of it (:func:`context_min_nbytes`), else ``None``."""
    least = context_min_nbytes(numel)
    if least is None or budget < least:
        return None  # no section the decoder would accept fits: skip the O(numel) coder
    rows, width = grid(shape, numel)
    out = np.zeros(budget, dtype=np.uint8)
    nbytes = int(ctx_kern.context_encode(indices, rows, width, out))
    if nbytes < least:
        return None  # did not fit (-1), or too short for its elements
    return IndexPlan("context", 0, nbytes, out[:nbytes].tobytes())


def index_candidates(
    indices: np.ndarray,
    numel: int,
    *,
    shape: tuple[int, ...] | None = None,
    context: str = "auto",
) -> list[IndexPlan]:
    """Every coding that can carry ``indices``, each with its best parameter and
    exact size, in tie-break order (``indices`` already checked by
    :func:`as_index_array`).

    ``context`` says when to build the context-coded section (tensors of at most
    :data:`CONTEXT_MAX_NUMEL` elements with at least one position): ``"auto"``
    where the support looks clustered and only if smaller than the others,
    ``"always"``, or ``"never"``. ``shape`` gives it its rows (one row if absent).
    A section shorter than :func:`context_min_nbytes` is left out: the decoder
    would refuse it.
    """
    count = indices.shape[0]
    plans = []
    if count == numel:
        plans.append(IndexPlan("dense", 0, 0))
    plans.append(IndexPlan("bitmap", 0, (numel + 7) // 8))
    plans.append(_best_elias_fano(count, numel))
    plans.append(_best_rice(indices, numel))
    if context != "never" and 0 < count < numel <= CONTEXT_MAX_NUMEL:
        best = min(plan.frame_bits for plan in plans)
        plan = None
        if context == "always":
            plan = _context_plan(indices, numel, shape, 2 * numel + 16)
        elif _looks_clustered(indices, numel, grid(shape, numel)[1], best):
            plan = _context_plan(indices, numel, shape, best // 8)
        if plan is not None:
            plans.append(plan)
    return plans


def choose_index_coding(
    indices: np.ndarray,
    numel: int,
    *,
    coding: str | None = None,
    shape: tuple[int, ...] | None = None,
    allow_context: bool = True,
) -> IndexPlan:
    """The smallest coding of ``indices`` (ties to the earlier of
    :data:`~fedsync.wire.registry.INDEX_CODINGS`), or the named one.

    ``allow_context=False`` leaves the context coding out (the encoder does so once
    a frame's context-coded elements reach their limit).

    Raises
    ------
    ValueError
        If ``coding`` names an unknown coding or one that cannot carry the set
        (``dense`` needs every position; ``context`` at least one, at most
        :data:`CONTEXT_MAX_NUMEL` elements and a section of at least
        :func:`context_min_nbytes`).
    """
    if coding is not None and coding not in INDEX_CODINGS:
        raise ValueError(f"unknown index coding {coding!r}; expected one of {INDEX_CODINGS}")
    if not allow_context or coding not in (None, "context"):
        mode = "never"  # another coding is named: the context coder need not run
    else:
        mode = "always" if coding == "context" else "auto"
    plans = index_candidates(indices, numel, shape=shape, context=mode)
    if coding is None:
        return min(plans, key=lambda plan: plan.frame_bits)  # min keeps the first tie
    for plan in plans:
        if plan.coding == coding:
            return plan
    raise ValueError(
        f"index coding {coding!r} cannot carry {indices.shape[0]} of {numel} positions "
        "(dense needs all of them, context at least one, a tensor of at most "
        f"{CONTEXT_MAX_NUMEL} elements and a section of at least one byte per "
        f"{DEFAULT_LIMITS.max_context_numel_per_byte} elements)"
    )


def index_bits_for(
    indices: np.ndarray, numel: int, *, shape: tuple[int, ...] | None = None
) -> dict[str, int]:
    """Exact bits each applicable coding would add to a frame for these positions.

    Parameters
    ----------
    indices : numpy.ndarray
        Sorted unique flat positions.
    numel : int
        Number of elements of the dense tensor.
    shape : tuple of int, optional
        The tensor's shape (the context coding's rows); one row if absent.

    Returns
    -------
    dict of str to int
        Coding name (``"dense"`` only when every position is kept, ``"bitmap"``,
        ``"elias_fano"``, ``"rice"``, and ``"context"`` where it applies) to the
        bits it adds to the frame (see :attr:`IndexPlan.frame_bits`). The frame
        encoder picks the smallest.

    Examples
    --------
    >>> import numpy as np
    >>> bits = index_bits_for(np.arange(0, 1000, 10), 1000)
    >>> min(bits, key=bits.get)
    'rice'
    """
    arr = as_index_array(indices, numel)
    plans = index_candidates(arr, numel, shape=shape, context="always")
    return {plan.coding: plan.frame_bits for plan in plans}


def encode_indices(indices: np.ndarray, numel: int, plan: IndexPlan) -> bytes:
    """The index section for ``indices`` under ``plan`` (exactly ``plan.nbytes``)."""
    if plan.data is not None:
        return plan.data
    if plan.coding == "dense":
        return b""
    if plan.coding == "bitmap":
        out = np.zeros(plan.nbytes, dtype=np.uint8)
        kern.bitmap_encode(indices, out)
        return out.tobytes()
    if plan.coding == "elias_fano":
        if indices.shape[0] == 0:
            return b""
        low_bits = plan.param
        low = b""
        if low_bits:
            mask = np.int64((1 << low_bits) - 1)
            low = bitpack.pack_bits((indices & mask).view(np.uint64), low_bits).tobytes()
        high = np.zeros(plan.nbytes - len(low), dtype=np.uint8)
        kern.ef_encode_high(indices, low_bits, high)
        return low + high.tobytes()
    if plan.coding == "rice":
        if plan.param <= kern.RICE_WORDS_MAX_K and sys.byteorder == "little":
            words = np.zeros(-(-plan.nbytes // 4) + 1, dtype=np.uint32)
            kern.rice_encode_words(indices, plan.param, words)
            return words.view(np.uint8)[: plan.nbytes].tobytes()
        out = np.zeros(plan.nbytes, dtype=np.uint8)
        kern.rice_encode(indices, plan.param, out)
        return out.tobytes()
    if plan.coding == "context":
        raise ValueError("a context plan carries its section: build it with choose_index_coding")
    raise ValueError(f"unknown index coding {plan.coding!r}")


def _padded(section: np.ndarray) -> np.ndarray:
    """Copy ``section`` with the zero tail the 64-bit reading window needs."""
    out = np.zeros(section.shape[0] + kern.READ_PAD_BYTES, dtype=np.uint8)
    out[: section.shape[0]] = section
    return out


@dataclass(frozen=True)
class _Section:
    """Which index section a kernel status refers to, for the error message."""

    coding: str
    count: int
    numel: int
    tensor: str


def _raise_for_status(status: int, position: int, detail: int, where: _Section) -> None:
    coding, count, numel, tensor = where.coding, where.count, where.numel, where.tensor
    field = f"index section ({coding})"
    if status == kern.STATUS_TRUNCATED:
        raise TruncatedPayload(
            f"stream ends after {position} of {count} positions",
            field=field,
            tensor=tensor,
            expected=f"{count} positions",
            got=position,
        )
    if status == kern.STATUS_OUT_OF_RANGE:
        raise IndexOutOfRange(
            f"position #{position} decodes to at least {detail}, outside [0, {numel})",
            field=field,
            tensor=tensor,
            expected=f"< {numel}",
            got=detail,
        )
    if status == kern.STATUS_UNORDERED:
        raise UnorderedIndices(
            f"position #{position} = {detail} does not exceed the one before it "
            "(positions must be strictly increasing)",
            field=field,
            tensor=tensor,
        )
    if status == kern.STATUS_EXTRA_BITS:
        raise CountMismatch(
            f"set bit at stream position {detail} beyond the {count} declared positions",
            field=field,
            tensor=tensor,
            expected=f"{count} positions",
            got="more",
        )
    raise PayloadError(f"index decoder status {status}", field=field, tensor=tensor)


def decode_indices(
    section: np.ndarray,
    coding: str,
    param: int,
    count: int,
    numel: int,
    *,
    tensor: str,
    shape: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Decode and validate one index section.

    The caller has already checked the table: ``coding`` fits the mode, ``param`` is
    at most :func:`max_param` of ``numel``, ``count <= numel <= 2**56 - 1``, and
    ``section`` has exactly the length the table declares, within the bounds of
    :func:`ef_nbytes` / :func:`rice_nbytes_bounds`, and a context-coded tensor
    has at most :data:`CONTEXT_MAX_NUMEL` elements. Those checks are what make the
    kernels' unchecked reads and writes stay in range. ``shape`` gives the context
    coding its rows (one row if absent).

    Returns
    -------
    numpy.ndarray
        ``count`` strictly increasing int64 positions in ``[0, numel)``.

    Raises
    ------
    PayloadError
        A subclass naming the fault (truncated stream, position out of range,
        unordered or surplus positions, nonzero padding).
    """
    if coding == "dense":
        return np.arange(count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    where = _Section(coding, count, numel, tensor)
    if coding == "bitmap":
        status, position, detail = kern.bitmap_decode(section, out)
        if status == kern.STATUS_EXTRA_BITS and detail >= numel:
            raise IndexOutOfRange(
                f"bitmap padding bit {detail} is set",
                field="index section (bitmap)",
                tensor=tensor,
                expected=f"< {numel}",
                got=detail,
            )
        if status != kern.STATUS_OK:
            _raise_for_status(status, position, detail, where)
        if count and int(out[-1]) >= numel:
            raise IndexOutOfRange(
                f"bitmap padding bit {int(out[-1])} is set",
                field="index section (bitmap)",
                tensor=tensor,
                expected=f"< {numel}",
                got=int(out[-1]),
            )
        return out
    if coding == "elias_fano":
        if count == 0:
            return out
        low_bits = param
        low_nbytes = bitpack.packed_nbytes(count, low_bits)
        if low_bits:
            lows = bitpack.unpack_bits(section[:low_nbytes], count, low_bits, np.uint64)
            _check_padding(section[:low_nbytes], count * low_bits, "elias_fano low bits", tensor)
        else:
            lows = np.zeros(count, dtype=np.uint64)
        nbits_high = count + ((numel - 1) >> low_bits)
        status, position, detail = kern.ef_decode(
            section[low_nbytes:], nbits_high, lows, low_bits, numel, out
        )
        if status != kern.STATUS_OK:
            _raise_for_status(status, position, detail, where)
        return out
    if coding == "rice":
        if count == 0:
            return out
        nbits = 8 * section.shape[0]
        status, position, used = kern.rice_decode(_padded(section), nbits, param, numel, out)
        if status != kern.STATUS_OK:
            _raise_for_status(status, position, used, where)
        # Canonical form: no whole spare byte and no set bit after the last code.
        if (used + 7) // 8 != section.shape[0]:
            raise MalformedField(
                "Rice stream is shorter than its declared section",
                field="index section (rice)",
                tensor=tensor,
                expected=f"{(used + 7) // 8} bytes",
                got=f"{section.shape[0]} bytes",
            )
        _check_padding(section, used, "index section (rice)", tensor)
        return out
    if coding == "context":
        rows, width = grid(shape, numel)
        status, position, detail = ctx_kern.context_decode(section, count, rows, width, out)
        if status != kern.STATUS_OK:
            _raise_for_context_status(int(status), int(position), int(detail), where)
        return out
    raise MalformedField(f"unknown index coding {coding!r}", field="index coding", tensor=tensor)


def _raise_for_context_status(status: int, position: int, detail: int, where: _Section) -> None:
    field = "index section (context)"
    if status == kern.STATUS_TRUNCATED:
        raise TruncatedPayload(
            f"the coded bitmap reads past the section's end at element {detail} "
            f"({position} of {where.count} positions decoded)",
            field=field,
            tensor=where.tensor,
        )
    if status == ctx_kern.STATUS_FEW_ONES:
        raise CountMismatch(
            "the coded bitmap holds fewer positions than declared",
            field=field,
            tensor=where.tensor,
            expected=where.count,
            got=position,
        )
    if status == ctx_kern.STATUS_TRAILING:
        raise MalformedField(
            "the coded bitmap ends before its section does",
            field=field,
            tensor=where.tensor,
            expected=f"{detail} bytes",
            got="more",
        )
    if status == ctx_kern.STATUS_BAD_CODE:
        raise MalformedField(
            f"not a valid coded stream (code outside the range at element {detail})",
            field=field,
            tensor=where.tensor,
        )
    _raise_for_status(status, position, detail, where)


def _check_padding(section: np.ndarray, used_bits: int, field: str, tensor: str) -> None:
    """Reject set bits after the last ``used_bits`` of a byte-padded stream."""
    if used_bits % 8 and int(section[used_bits // 8]) >> (used_bits % 8):
        raise MalformedField(
            "padding bits after the last value are not zero", field=field, tensor=tensor
        )
