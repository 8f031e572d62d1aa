"""Encoding a codec description and compressed tensors into one frame.

The input comes from fedsync's own compressors, so a tensor that breaks its contract
is a programming error: it raises :class:`ValueError` naming the tensor (never
:class:`~fedsync.wire.PayloadError`, which is about received bytes). The byte layout
is documented in :mod:`fedsync.wire.layout`.

Positions, codes and params may still be tensors on the sender's device: they are
packed there and copied to the host in one piece first (:mod:`fedsync.wire.staging`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedsync.kernels import bitpack
from fedsync.updates import (
    Array,
    CompressedTensor,
    QuantizedValues,
    TensorSpec,
    host_array,
    lowrank_rank,
    matrix_dims,
)
from fedsync.wire.buffer import Writer
from fedsync.wire.index_coding import (
    CODINGS_WITH_LENGTH,
    CODINGS_WITH_PARAM,
    as_index_array,
    choose_index_coding,
    encode_indices,
)
from fedsync.wire.layout import (
    FLAG_SEED,
    FLAG_TABLE,
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    MAX_BITS,
    SEED,
    TRAILER,
    TRAILER_BYTES,
    code_dtype,
)
from fedsync.wire.limits import DEFAULT_LIMITS, MAX_FORMAT_NUMEL
from fedsync.wire.registry import CODING_CODES, DTYPE_CODES, INDEX_MODE_RULES, SCHEME_CODES
from fedsync.wire.schema import schema_digest
from fedsync.wire.staging import stage_tensors

__all__ = ["encode_frame"]


def _checked_codes(values: QuantizedValues, label: str) -> np.ndarray:
    """Codes as an unsigned array after checking shape, sign and width."""
    bits = values.bits
    if not isinstance(bits, int | np.integer) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{label}: bits must be an int in 1..{MAX_BITS}, got {bits!r}")
    codes = np.asarray(values.codes)  # a host array here (see fedsync.wire.staging)
    if codes.ndim != 1:
        raise ValueError(f"{label}: codes must be one-dimensional, got shape {codes.shape}")
    if codes.size == 0:
        return np.zeros(0, dtype=code_dtype(int(bits)))
    if codes.dtype.kind not in "iu":
        raise ValueError(f"{label}: codes must be integers, got dtype {codes.dtype}")
    if codes.dtype.kind == "i":
        if int(codes.min()) < 0:
            raise ValueError(f"{label}: codes must be non-negative, got {int(codes.min())}")
        codes = codes.view(codes.dtype.str.replace("i", "u"))
    if bits < codes.dtype.itemsize * 8 and int(codes.max()) >> bits:
        raise ValueError(
            f"{label}: code {int(codes.max())} does not fit {bits} bits "
            f"(expected < {1 << int(bits)})"
        )
    return codes


def _checked_params(params: Mapping[str, Array], label: str) -> list[tuple[str, np.ndarray]]:
    out = []
    for name, array in params.items():
        if not isinstance(name, str):
            raise ValueError(f"{label}: param names must be str, got {name!r}")
        host = np.asarray(host_array(array), dtype="<f4")
        out.append((name, np.ascontiguousarray(host.reshape(-1))))
    return out


@dataclass
class _Prepared:
    """One tensor, checked and coded, waiting for its place in the frame."""

    spec: TensorSpec
    mode: str
    count: int
    scheme: str
    bits: int
    params: list[tuple[str, np.ndarray]]
    coding: str
    coding_param: int
    section: bytes
    packed: np.ndarray

    @property
    def format_key(self) -> tuple[str, int, tuple[str, ...]]:
        return (self.scheme, self.bits, tuple(name for name, _ in self.params))


def _check_spec(spec: TensorSpec, label: str) -> int:
    """Check name, dtype and shape; return numel."""
    if not isinstance(spec.name, str):
        raise ValueError(f"{label}: name must be a str, got {type(spec.name).__name__}")
    if spec.dtype not in DTYPE_CODES:
        raise ValueError(
            f"{label}: unknown dtype {spec.dtype!r}; expected one of {list(DTYPE_CODES)}"
        )
    shape = tuple(spec.shape)
    if len(shape) > 255 or any(
        not isinstance(d, int | np.integer) or not 0 <= d <= MAX_FORMAT_NUMEL for d in shape
    ):
        raise ValueError(
            f"{label}: shape must be at most 255 ints in [0, {MAX_FORMAT_NUMEL}], got {shape}"
        )
    numel = math.prod(int(d) for d in shape)
    if numel > MAX_FORMAT_NUMEL:
        raise ValueError(f"{label}: numel {numel} exceeds the format's {MAX_FORMAT_NUMEL}")
    return numel


def _prepare(
    tensor: CompressedTensor,
    label: str,
    index_coding: str | None,
    allow_context: bool,
    packed: np.ndarray | None = None,
) -> _Prepared:
    """Check and code one tensor; ``packed`` is its code stream when the codes were
    checked and packed on their device already (the codes then only give the count)."""
    spec = tensor.spec
    numel = _check_spec(spec, label)
    mode = tensor.index_mode
    rule = INDEX_MODE_RULES.get(mode)
    if rule is None:
        raise ValueError(f"{label}: unknown index mode {mode!r}")
    values = tensor.values
    if values.scheme not in SCHEME_CODES:
        raise ValueError(
            f"{label}: unknown scheme {values.scheme!r}; expected one of {list(SCHEME_CODES)}"
        )
    if packed is None:
        codes = _checked_codes(values, label)
        count = int(codes.shape[0])
        packed = bitpack.pack_bits(codes, int(values.bits))
    else:
        count = len(values)

    if rule.positions:
        if tensor.indices is None:
            raise ValueError(f"{label}: index mode {mode!r} needs indices")
        indices = as_index_array(host_array(tensor.indices), numel, label=label)
        if indices.shape[0] != count:
            raise ValueError(f"{label}: {indices.shape[0]} indices but {count} codes")
        plan = choose_index_coding(
            indices,
            numel,
            coding=index_coding,
            shape=tuple(int(d) for d in spec.shape),
            allow_context=allow_context,
        )
        section = encode_indices(indices, numel, plan)
        coding, coding_param = plan.coding, plan.param
    else:
        if tensor.indices is not None:
            raise ValueError(f"{label}: index mode {mode!r} carries no indices, got some")
        if mode == "lowrank" and lowrank_rank(tuple(spec.shape), count) is None:
            raise ValueError(
                f"{label}: lowrank mode needs r * (m + n) codes with 1 <= r <= min(m, n) "
                f"for (m, n) = {matrix_dims(tuple(spec.shape))}, got {count}"
            )
        section, coding, coding_param = b"", "none", 0
    if rule.count == "numel" and count != numel:
        raise ValueError(f"{label}: {mode} mode needs {numel} codes, got {count}")
    if rule.count == "at_most_numel" and count > numel:
        raise ValueError(f"{label}: {mode} mode has {count} codes for {numel} elements")

    params = _checked_params(values.params, label)
    return _Prepared(
        spec,
        mode,
        count,
        values.scheme,
        int(values.bits),
        params,
        coding,
        coding_param,
        section,
        packed,
    )


def _write_schema(head: Writer, prepared: list[_Prepared], schema: str) -> None:
    if schema == "digest":
        head.raw(schema_digest([p.spec for p in prepared]))
        return
    head.varint(len(prepared))
    for p in prepared:
        head.text(p.spec.name)
        head.u8(DTYPE_CODES[p.spec.dtype])
        head.u8(len(p.spec.shape))
        for dim in p.spec.shape:
            head.varint(int(dim))


def _write_formats(
    table: Writer, prepared: list[_Prepared]
) -> tuple[dict[tuple[str, int, tuple[str, ...]], int], list[list[int | None]]]:
    """The format table: each distinct (scheme, bits, param names) once, with each
    param's length stored once when every tensor of the format has the same."""
    index: dict[tuple[str, int, tuple[str, ...]], int] = {}
    members: list[list[_Prepared]] = []
    for p in prepared:
        if p.format_key not in index:
            index[p.format_key] = len(members)
            members.append([])
        members[index[p.format_key]].append(p)
    fixed: list[list[int | None]] = []
    table.varint(len(members))
    for (scheme, bits, names), group in zip(index, members, strict=True):
        table.u8(SCHEME_CODES[scheme])
        table.u8(bits)
        table.varint(len(names))
        lengths: list[int | None] = []
        for i, name in enumerate(names):
            seen = {int(p.params[i][1].shape[0]) for p in group}
            length = seen.pop() if len(seen) == 1 else None
            table.text(name)
            table.varint(0 if length is None else length + 1)
            lengths.append(length)
        fixed.append(lengths)
    return index, fixed


def _frame_seed(
    tensors: Sequence[CompressedTensor], labels: Sequence[str], given: int | None
) -> int | None:
    """The seed every tensor carries (the frame stores it once), or ``None``; the
    ``given`` one when there is one (every tensor must carry it)."""
    seed: int | None = given
    whose = "the frame's"
    if given is None:
        seed, whose = (tensors[0].seed if tensors else None), "the first tensor's"
    for label, tensor in zip(labels, tensors, strict=True):
        if tensor.seed != seed:
            raise ValueError(
                f"{label}: frame seed {tensor.seed!r} differs from {whose} "
                f"{seed!r}; the tensors of a frame carry one seed, or none"
            )
    if seed is not None and (not isinstance(seed, int | np.integer) or not 0 <= seed < 1 << 64):
        raise ValueError(f"the frame seed must be an int in [0, 2**64), got {seed!r}")
    return None if seed is None else int(seed)


def encode_frame(
    codec: str,
    tensors: Sequence[CompressedTensor],
    *,
    index_coding: str | None = None,
    schema: str = "table",
    seed: int | None = None,
) -> bytes:
    """Encode a codec description and compressed tensors into one frame.

    Parameters
    ----------
    codec : str
        The codec description (the compressor's spec string), stored verbatim.
    tensors : sequence of CompressedTensor
        The tensors; names must be unique. Their ``seed`` (a rotation's frame seed:
        the same for all, or ``None`` for all) travels once.
    index_coding : str, optional
        Force one coding (``"dense"``, ``"bitmap"``, ``"elias_fano"``, ``"rice"``,
        ``"context"``) for every explicit index set, e.g. to compare codings; by
        default each tensor's positions take the smallest (see
        :func:`fedsync.wire.index_bits_for`). Context coding stays within
        ``DEFAULT_LIMITS.max_context_numel`` elements per frame.
    schema : {"table", "digest"}
        ``"table"`` carries every tensor's name, shape and dtype (any receiver can
        decode it; tensors keep their order); ``"digest"`` carries only the 8-byte
        :func:`~fedsync.wire.schema.schema_digest` of them, for a receiver that knows
        the model (it decodes with ``expected=``); the tensors then travel sorted by
        name.
    seed : int, optional
        The frame seed, written even when no tensor carries it: a rotating codec's
        frame has one whatever its tensor count (a frame of no tensors included), and
        every tensor must then carry this one. Default: the tensors' seed.

    Returns
    -------
    bytes
        The frame (layout in :mod:`fedsync.wire.layout`). Codes may come in any
        integer dtype; params are stored flattened as float32 (and come back 1-d).
        The bytes are a function of the inputs alone: same tensors, same bytes.

    Raises
    ------
    ValueError
        If a tensor breaks its contract (unknown dtype or scheme, bits outside
        1..32, a code wider than ``bits``, indices unsorted or out of range,
        counts that disagree with the index mode, duplicate names, a frame seed
        that is not every tensor's or ``seed``'s) or ``schema`` is unknown; the
        message names the tensor.
    """
    if not isinstance(codec, str):
        raise ValueError(f"codec must be a str, got {type(codec).__name__}")
    if schema not in ("table", "digest"):
        raise ValueError(f"schema must be 'table' or 'digest', got {schema!r}")
    prepared: list[_Prepared] = []
    seen: set[str] = set()
    context_left = DEFAULT_LIMITS.max_context_numel
    labels = [f"tensor #{position} {tensor.spec.name!r}" for position, tensor in enumerate(tensors)]
    for label, tensor in zip(labels, tensors, strict=True):
        if tensor.spec.name in seen:
            raise ValueError(f"{label}: duplicate tensor name")
        seen.add(tensor.spec.name)
    frame_seed = _frame_seed(tensors, labels, seed)
    for label, entry in zip(labels, stage_tensors(tensors, labels), strict=True):
        tensor = entry.tensor
        numel = math.prod(int(d) for d in tensor.spec.shape)
        allow = numel <= context_left
        prepared.append(_prepare(tensor, label, index_coding, allow, entry.packed))
        if prepared[-1].coding == "context":
            context_left -= numel
    if schema == "digest":
        prepared.sort(key=lambda p: p.spec.name)

    table, data = Writer(), Writer()
    table.text(codec)
    if frame_seed is not None:
        table.raw(SEED.pack(frame_seed))
    _write_schema(table, prepared, schema)
    formats, fixed = _write_formats(table, prepared)
    for p in prepared:
        fmt = formats[p.format_key]
        rule = INDEX_MODE_RULES[p.mode]
        table.u8(rule.code << 4 | CODING_CODES[p.coding])
        if len(formats) > 1:
            table.varint(fmt)
        if rule.count != "numel":
            table.varint(p.count)
        for (_, array), length in zip(p.params, fixed[fmt], strict=True):
            if length is None:
                table.varint(int(array.shape[0]))
        if p.coding in CODINGS_WITH_PARAM:
            table.u8(p.coding_param)
        if p.coding in CODINGS_WITH_LENGTH:
            table.varint(len(p.section))
        for _, array in p.params:
            data.raw(array.tobytes())
        data.raw(p.section)
        data.raw(p.packed.data)

    flags = FLAG_TABLE if schema == "table" else 0
    if frame_seed is not None:
        flags |= FLAG_SEED
    length = HEADER_BYTES + table.size + data.size + TRAILER_BYTES
    header = HEADER.pack(MAGIC, FORMAT_VERSION, flags, length)
    crc = zlib.crc32(header)
    for part in table.parts + data.parts:
        crc = zlib.crc32(part, crc)
    return b"".join([header, *table.parts, *data.parts, TRAILER.pack(crc)])
