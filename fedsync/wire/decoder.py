"""Decoding a frame, trusting nothing.

Order of checks: the payload size against the limits, magic, version, declared
length, CRC-32, flags; then the codec description (against the one the receiver
expects, when it names one) and the frame seed, if the flags say one follows (both
then go to the receiver's ``check_header``, if it gave one); then the
schema (the digest against the receiver's specs, or the tensor table, each count
against the limits); then the format table and every tensor entry, field by field,
each count against the limits and the tensor's shape (a context-coded section's
length, too, against the elements it would step through); then that the data part has
exactly the bytes the table implies. Only then are sections decoded, by kernels whose
every read and write the table checks have already put in range. Any fault raises a
:class:`~fedsync.wire.PayloadError` subclass naming it. The byte layout is
documented in :mod:`fedsync.wire.layout`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedsync.kernels import bitpack
from fedsync.updates import (
    Array,
    CompressedTensor,
    QuantizedValues,
    TensorSpec,
    lowrank_rank,
    matrix_dims,
)
from fedsync.wire.buffer import Reader
from fedsync.wire.errors import (
    BadMagic,
    ChecksumMismatch,
    CountMismatch,
    LimitExceeded,
    MalformedField,
    SchemaMismatch,
    SchemaRequired,
    TrailingBytes,
    TruncatedPayload,
    UnexpectedCodec,
    UnknownCode,
    UnsupportedVersion,
)
from fedsync.wire.index_coding import (
    CODINGS_WITH_LENGTH,
    CODINGS_WITH_PARAM,
    CONTEXT_MAX_NUMEL,
    CONTEXT_MIN_BYTES,
    context_min_nbytes,
    decode_indices,
    ef_nbytes,
    max_param,
    rice_nbytes_bounds,
)
from fedsync.wire.layout import (
    FLAG_SEED,
    FLAG_TABLE,
    FLAGS_KNOWN,
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    MAX_BITS,
    TRAILER,
    TRAILER_BYTES,
    code_dtype,
    codes_nbytes,
)
from fedsync.wire.limits import DEFAULT_LIMITS, FrameLimits
from fedsync.wire.registry import (
    CODING_NAMES,
    DTYPE_NAMES,
    INDEX_MODE_NAMES,
    INDEX_MODE_RULES,
    SCHEME_NAMES,
)
from fedsync.wire.schema import DIGEST_BYTES, as_spec_list, canonical, schema_digest

__all__ = ["TensorLayout", "decode_frame", "inspect_frame"]


@dataclass
class _Entry:
    """One parsed and validated table entry."""

    label: str
    spec: TensorSpec
    mode: str
    count: int
    scheme: str
    bits: int
    params: list[tuple[str, int]] = field(default_factory=list)
    coding: str = "none"
    coding_param: int = 0
    index_nbytes: int = 0

    @property
    def data_nbytes(self) -> int:
        """Bytes this tensor's data part must have."""
        params = sum(4 * length for _, length in self.params)
        return params + self.index_nbytes + codes_nbytes(self.count, self.bits)


def _enum(reader: Reader, names: Mapping[int, str], field: str, label: str) -> str:
    code = reader.u8(field, label)
    name = names.get(code)
    if name is None:
        raise UnknownCode(
            f"unknown {field} code",
            field=field,
            tensor=label,
            expected=f"one of {sorted(names)}",
            got=code,
        )
    return name


def _read_shape(reader: Reader, label: str, limits: FrameLimits) -> tuple[int, ...]:
    ndim = reader.u8("ndim", label)
    if ndim > limits.max_ndim:
        raise LimitExceeded(
            "too many dimensions (FrameLimits.max_ndim)",
            field="ndim",
            tensor=label,
            expected=f"<= {limits.max_ndim}",
            got=ndim,
        )
    shape = []
    for axis in range(ndim):
        dim = reader.varint(f"shape[{axis}]", label)
        if dim > limits.max_numel:
            raise LimitExceeded(
                "dimension larger than FrameLimits.max_numel",
                field=f"shape[{axis}]",
                tensor=label,
                expected=f"<= {limits.max_numel}",
                got=dim,
            )
        shape.append(dim)
    numel = math.prod(shape)
    if numel > limits.max_numel:
        raise LimitExceeded(
            "tensor has more elements than FrameLimits.max_numel",
            field="shape",
            tensor=label,
            expected=f"<= {limits.max_numel}",
            got=f"{numel} (shape {tuple(shape)})",
        )
    return tuple(shape)


def _check_count(entry: _Entry) -> None:
    numel = entry.spec.numel
    if entry.mode == "lowrank":
        if lowrank_rank(entry.spec.shape, entry.count) is None:
            dims = matrix_dims(entry.spec.shape)
            raise CountMismatch(
                "lowrank index mode needs r * (m + n) values, 1 <= r <= min(m, n)"
                if dims is not None
                else "lowrank index mode needs a tensor of 2 or more dimensions",
                field="value count",
                tensor=entry.label,
                expected=(
                    f"a multiple of m + n = {sum(dims)} up to {min(dims) * sum(dims)}"
                    if dims is not None and min(dims) > 0
                    else f"ndim >= 2 and no empty dimension, shape {entry.spec.shape}"
                ),
                got=entry.count,
            )
        return
    rule = INDEX_MODE_RULES[entry.mode]
    if rule.count == "at_most_numel" and entry.count > numel:
        raise CountMismatch(
            "more values than the tensor has elements",
            field="value count",
            tensor=entry.label,
            expected=f"<= {numel}",
            got=entry.count,
        )


@dataclass(frozen=True)
class _Format:
    """One entry of the frame's format table."""

    scheme: str
    bits: int
    params: list[tuple[str, int | None]]
    """Param names with their fixed float count (``None``: given per tensor)."""


def _read_formats(reader: Reader, n_tensors: int, limits: FrameLimits) -> list[_Format]:
    n_formats = reader.varint("format count")
    if n_formats > n_tensors:
        raise MalformedField(
            "more formats than tensors",
            field="format count",
            expected=f"<= {n_tensors}",
            got=n_formats,
        )
    formats = []
    for i in range(n_formats):
        where = f"format #{i}"
        scheme = _enum(reader, SCHEME_NAMES, "scheme", where)
        bits = reader.u8("bits", where)
        if not 1 <= bits <= MAX_BITS:
            raise MalformedField(
                "bits per code out of range",
                field="bits",
                tensor=where,
                expected=f"1..{MAX_BITS}",
                got=bits,
            )
        n_params = reader.varint("param count", where)
        if n_params > limits.max_params:
            raise LimitExceeded(
                "too many params (FrameLimits.max_params)",
                field="param count",
                tensor=where,
                expected=f"<= {limits.max_params}",
                got=n_params,
            )
        params: list[tuple[str, int | None]] = []
        for j in range(n_params):
            name = reader.text(f"param[{j}] name", limits.max_name_length, "max_name_length", where)
            if any(name == seen for seen, _ in params):
                raise MalformedField(
                    f"duplicate param name {name!r}", field=f"param[{j}] name", tensor=where
                )
            fixed = reader.varint(f"param {name!r} length", where)
            length = None if fixed == 0 else fixed - 1
            if length is not None:
                _check_param_length(reader, length, name, where)
            params.append((name, length))
        formats.append(_Format(scheme, bits, params))
    return formats


def _check_param_length(reader: Reader, length: int, name: str, label: str) -> None:
    # Cheap early bound (the exact data size is checked after the table): the
    # floats must fit in what is left of the frame.
    if 4 * length > reader.remaining:
        raise TruncatedPayload(
            "param is larger than the rest of the frame",
            field=f"param {name!r} length",
            tensor=label,
            expected=f"<= {reader.remaining // 4} floats",
            got=length,
        )


def _check_index_section(entry: _Entry) -> None:
    """Check the coding fits the mode and the section length fits coding, count, numel."""
    label, coding, param, nbytes = entry.label, entry.coding, entry.coding_param, entry.index_nbytes
    count, numel = entry.count, entry.spec.numel
    if INDEX_MODE_RULES[entry.mode].positions == (coding == "none"):
        allowed = "a position coding" if coding == "none" else "'none'"
        raise MalformedField(
            f"index mode {entry.mode!r} needs {allowed}",
            field="index coding",
            tensor=label,
            expected=allowed,
            got=repr(coding),
        )
    if coding in CODINGS_WITH_PARAM and param > max_param(numel):
        raise MalformedField(
            f"{coding} parameter larger than bit_length(numel - 1)",
            field="coding param",
            tensor=label,
            expected=f"<= {max_param(numel)}",
            got=param,
        )
    if coding == "dense" and count != numel:
        raise CountMismatch(
            "dense coding needs every position",
            field="value count",
            tensor=label,
            expected=numel,
            got=count,
        )
    if coding == "context":
        if numel > CONTEXT_MAX_NUMEL:
            raise MalformedField(
                "context coding is for tensors of at most CONTEXT_MAX_NUMEL elements",
                field="index coding",
                tensor=label,
                expected=f"<= {CONTEXT_MAX_NUMEL} elements",
                got=numel,
            )
        if nbytes < CONTEXT_MIN_BYTES:
            raise MalformedField(
                "context section shorter than the coder's start",
                field="index bytes",
                tensor=label,
                expected=f">= {CONTEXT_MIN_BYTES}",
                got=nbytes,
            )
        return
    if coding == "rice":
        least, most = rice_nbytes_bounds(count, numel, param)
        if not least <= nbytes <= most:
            raise MalformedField(
                "Rice section size impossible for this count, numel and k",
                field="index bytes",
                tensor=label,
                expected=f"{least}..{most}",
                got=nbytes,
            )
        return
    expected = {
        "none": 0,
        "dense": 0,
        "bitmap": (numel + 7) // 8,
        "elias_fano": ef_nbytes(count, numel, param) if coding == "elias_fano" else 0,
    }[coding]
    if nbytes != expected:
        raise MalformedField(
            f"{coding} section size does not follow from count and numel",
            field="index bytes",
            tensor=label,
            expected=expected,
            got=nbytes,
        )


def _read_entry(
    reader: Reader, position: int, spec: TensorSpec, formats: list[_Format], limits: FrameLimits
) -> _Entry:
    label = f"#{position} {spec.name!r}"
    head = reader.u8("head", label)
    mode = INDEX_MODE_NAMES.get(head >> 4)
    if mode is None:
        raise UnknownCode(
            "unknown index mode code",
            field="index mode",
            tensor=label,
            expected=f"one of {sorted(INDEX_MODE_NAMES)}",
            got=head >> 4,
        )
    coding = CODING_NAMES.get(head & 0x0F)
    if coding is None:
        raise UnknownCode(
            "unknown index coding code",
            field="index coding",
            tensor=label,
            expected=f"one of {sorted(CODING_NAMES)}",
            got=head & 0x0F,
        )
    if not formats:
        raise MalformedField("a tensor but no value format", field="format count", tensor=label)
    which = reader.varint("format", label) if len(formats) > 1 else 0
    if which >= len(formats):
        raise MalformedField(
            "format index out of range",
            field="format",
            tensor=label,
            expected=f"< {len(formats)}",
            got=which,
        )
    fmt = formats[which]
    rule = INDEX_MODE_RULES[mode]
    count = spec.numel if rule.count == "numel" else reader.varint("value count", label)
    entry = _Entry(label, spec, mode, count, fmt.scheme, fmt.bits, coding=coding)
    _check_count(entry)
    for name, fixed in fmt.params:
        length = fixed
        if length is None:
            length = reader.varint(f"param {name!r} length", label)
            _check_param_length(reader, length, name, label)
        entry.params.append((name, length))
    if coding in CODINGS_WITH_PARAM:
        entry.coding_param = reader.u8("coding param", label)
    if coding in CODINGS_WITH_LENGTH:
        entry.index_nbytes = reader.varint("index bytes", label)
    else:
        entry.index_nbytes = _implied_nbytes(entry)
    _check_index_section(entry)
    return entry


def _check_context_work(entry: _Entry, limits: FrameLimits) -> None:
    """A context section steps through every element of its tensor: it must have a
    byte per ``max_context_numel_per_byte`` of them, so the work follows the bytes the
    frame carries (the data part's size is checked against the table next)."""
    least = context_min_nbytes(entry.spec.numel, limits.max_context_numel_per_byte)
    if least is None or entry.index_nbytes < least:
        raise LimitExceeded(
            "context section too short for its tensor's elements "
            "(FrameLimits.max_context_numel_per_byte)",
            field="index bytes",
            tensor=entry.label,
            expected="no context section" if least is None else f">= {least}",
            got=f"{entry.index_nbytes} for {entry.spec.numel} elements",
        )


def _implied_nbytes(entry: _Entry) -> int:
    """Section size of a coding whose length is not carried (checked parameter first)."""
    if entry.coding == "bitmap":
        return (entry.spec.numel + 7) // 8
    if entry.coding == "elias_fano" and entry.coding_param <= max_param(entry.spec.numel):
        return ef_nbytes(entry.count, entry.spec.numel, entry.coding_param)
    return 0


def _as_view(payload: bytes | bytearray | memoryview | np.ndarray) -> memoryview:
    try:
        view = payload.data if isinstance(payload, np.ndarray) else memoryview(payload)
    except TypeError:
        raise TypeError(
            f"payload must be a bytes-like object, got {type(payload).__name__}"
        ) from None
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B")


def _check_envelope(view: memoryview, limits: FrameLimits) -> int:
    """Size, magic, version, declared length, checksum and flags: cheap checks first.
    Returns the flags."""
    size = len(view)
    if size > limits.max_payload_bytes:
        raise LimitExceeded(
            "payload larger than FrameLimits.max_payload_bytes",
            field="payload",
            expected=f"<= {limits.max_payload_bytes} bytes",
            got=size,
        )
    head = bytes(view[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise BadMagic("not a fedsync frame", field="magic", expected=MAGIC, got=head)
    if size < HEADER_BYTES + TRAILER_BYTES:
        raise TruncatedPayload(
            "shorter than an empty frame",
            field="header",
            expected=f">= {HEADER_BYTES + TRAILER_BYTES} bytes",
            got=size,
        )
    _, version, flags, length = HEADER.unpack_from(view, 0)
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(
            "this decoder reads one format version",
            field="version",
            expected=FORMAT_VERSION,
            got=version,
        )
    if length > size:
        raise TruncatedPayload(
            "payload shorter than the frame length it declares",
            field="length",
            expected=f"{length} bytes",
            got=f"{size} bytes",
        )
    if length < size:
        raise TrailingBytes(
            "payload longer than the frame length it declares",
            field="length",
            expected=f"{length} bytes",
            got=f"{size} bytes",
        )
    (stored,) = TRAILER.unpack_from(view, size - TRAILER_BYTES)
    actual = zlib.crc32(view[: size - TRAILER_BYTES])
    if stored != actual:
        raise ChecksumMismatch(
            "frame contents do not match their CRC-32 (corrupted in transit?)",
            field="crc32",
            expected=f"{actual:#010x}",
            got=f"{stored:#010x}",
        )
    if flags & ~FLAGS_KNOWN:
        raise MalformedField(
            "reserved flag bits must be 0 in version 2",
            field="flags",
            expected=f"only bits of {FLAGS_KNOWN:#04x}",
            got=f"{flags:#04x}",
        )
    return int(flags)


def _decode_data(reader: Reader, entry: _Entry, seed: int | None) -> CompressedTensor:
    label = entry.label
    params: dict[str, Array] = {}
    for name, length in entry.params:
        raw = reader.take(4 * length, f"param {name!r}", label)
        params[name] = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    section = np.frombuffer(reader.take(entry.index_nbytes, "index section", label), dtype=np.uint8)
    indices = None
    if entry.mode == "explicit":
        indices = decode_indices(
            section,
            entry.coding,
            entry.coding_param,
            entry.count,
            entry.spec.numel,
            tensor=label,
            shape=entry.spec.shape,
        )
    nbits = entry.count * entry.bits
    packed = np.frombuffer(reader.take((nbits + 7) // 8, "codes", label), dtype=np.uint8)
    if nbits % 8 and int(packed[-1]) >> (nbits % 8):
        raise MalformedField(
            "padding bits after the last code are not zero", field="codes", tensor=label
        )
    codes = bitpack.unpack_bits(packed, entry.count, entry.bits, code_dtype(entry.bits))
    values = QuantizedValues(entry.scheme, entry.bits, codes, params)
    return CompressedTensor(entry.spec, entry.mode, indices, values, seed)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TensorLayout:
    """Where one tensor's bytes go in a frame, as :func:`inspect_frame` reports it.

    Parameters
    ----------
    spec : TensorSpec
        Name, shape and dtype.
    index_mode : str
        ``"explicit"``, ``"dense"``, ``"mask"`` or ``"lowrank"``.
    coding : str
        Index coding (``"none"`` for the dense, mask and lowrank modes).
    coding_param : int
        Rice ``k`` or Elias-Fano ``L`` (0 otherwise).
    count : int
        Number of values.
    scheme : str
        Quantization scheme.
    bits : int
        Bits per code.
    index_nbytes, codes_nbytes, params_nbytes : int
        Bytes of the index section, the packed codes and the float params.
    """

    spec: TensorSpec
    index_mode: str
    coding: str
    coding_param: int
    count: int
    scheme: str
    bits: int
    index_nbytes: int
    codes_nbytes: int
    params_nbytes: int


def _read_table(reader: Reader, limits: FrameLimits) -> list[TensorSpec]:
    n_tensors = reader.varint("tensor count")
    if n_tensors > limits.max_tensors:
        raise LimitExceeded(
            "too many tensors (FrameLimits.max_tensors)",
            field="tensor count",
            expected=f"<= {limits.max_tensors}",
            got=n_tensors,
        )
    specs: list[TensorSpec] = []
    names: set[str] = set()
    for position in range(n_tensors):
        where = f"#{position}"
        name = reader.text("name", limits.max_name_length, "max_name_length", where)
        label = f"#{position} {name!r}"
        if name in names:
            raise MalformedField("duplicate tensor name", field="name", tensor=label)
        names.add(name)
        dtype = _enum(reader, DTYPE_NAMES, "dtype", label)
        specs.append(TensorSpec(name, _read_shape(reader, label, limits), dtype))
    return specs


def _schema_mismatch(got: list[TensorSpec], want: list[TensorSpec]) -> SchemaMismatch:
    """Say how a frame's tensors differ from the expected ones."""
    got_by, want_by = {s.name: s for s in got}, {s.name: s for s in want}
    missing = sorted(set(want_by) - set(got_by))
    extra = sorted(set(got_by) - set(want_by))
    if missing or extra:
        return SchemaMismatch(
            "the frame's tensors are not the expected model's",
            field="tensor table",
            expected=f"also {missing}" if missing else "no others",
            got=f"unexpected {extra}" if extra else "some missing",
        )
    for name, spec in got_by.items():
        other = want_by[name]
        if tuple(other.shape) != spec.shape or other.dtype != spec.dtype:
            return SchemaMismatch(
                "shape or dtype differs from the expected model's",
                field="tensor table",
                tensor=repr(name),
                expected=f"{tuple(other.shape)} {other.dtype}",
                got=f"{spec.shape} {spec.dtype}",
            )
    return SchemaMismatch("the frame's tensors are not the expected model's", field="schema")


def _read_schema(
    reader: Reader, table: bool, expected: list[TensorSpec] | None, limits: FrameLimits
) -> list[TensorSpec]:
    if table:
        specs = _read_table(reader, limits)
        if expected is not None and schema_digest(specs) != schema_digest(expected):
            raise _schema_mismatch(specs, expected)
        return specs
    digest = bytes(reader.take(DIGEST_BYTES, "schema digest"))
    if expected is None:
        raise SchemaRequired(
            "the frame carries only its schema digest; decode it with expected= (the "
            "model's tensor specs) or have the sender include the table",
            field="schema digest",
            got=digest.hex(),
        )
    want = schema_digest(expected)
    if digest != want:
        raise SchemaMismatch(
            "schema digest differs from the expected model's (another model, or "
            "another version of it)",
            field="schema digest",
            expected=want.hex(),
            got=digest.hex(),
        )
    return canonical(expected)


@dataclass
class _Table:
    """A frame's checked table: what precedes the data part."""

    codec: str
    seed: int | None
    entries: list[_Entry]
    reader: Reader
    """At the data part, which has exactly the bytes the entries imply."""


def _parse_table(
    payload: bytes | bytearray | memoryview | np.ndarray,
    limits: FrameLimits,
    expected: Mapping[str, TensorSpec] | Sequence[TensorSpec] | None = None,
    expected_codec: str | None = None,
    check_header: Callable[[str, int | None], None] | None = None,
) -> _Table:
    """Check the envelope, the codec, the seed, the schema and the whole table."""
    view = _as_view(payload)
    flags = _check_envelope(view, limits)
    reader = Reader(view, HEADER_BYTES, len(view) - TRAILER_BYTES)
    codec = reader.text("codec", limits.max_codec_length, "max_codec_length")
    if expected_codec is not None and codec != expected_codec:
        raise UnexpectedCodec(
            "the frame names another codec than the receiver expects",
            field="codec",
            expected=repr(expected_codec),
            got=repr(codec),
        )
    seed = reader.u64("seed") if flags & FLAG_SEED else None
    if check_header is not None:
        check_header(codec, seed)
    want = as_spec_list(expected) if expected is not None else None
    specs = _read_schema(reader, bool(flags & FLAG_TABLE), want, limits)
    formats = _read_formats(reader, len(specs), limits)

    entries: list[_Entry] = []
    total_values = 0
    context_numel = 0
    for position, spec in enumerate(specs):
        entry = _read_entry(reader, position, spec, formats, limits)
        total_values += entry.count
        if entry.coding == "context":
            _check_context_work(entry, limits)
            context_numel += spec.numel
            if context_numel > limits.max_context_numel:
                raise LimitExceeded(
                    "context-coded sections cover more elements than FrameLimits.max_context_numel",
                    field="index coding",
                    tensor=entry.label,
                    expected=f"<= {limits.max_context_numel} in all",
                    got=f"{context_numel} so far",
                )
        if total_values > limits.max_total_values:
            raise LimitExceeded(
                "frame carries more values than FrameLimits.max_total_values",
                field="value count",
                tensor=entry.label,
                expected=f"<= {limits.max_total_values} in all",
                got=f"{total_values} so far",
            )
        entries.append(entry)

    needed = sum(entry.data_nbytes for entry in entries)
    if needed > reader.remaining:
        raise TruncatedPayload(
            "data part shorter than the table declares",
            field="data",
            expected=f"{needed} bytes",
            got=f"{reader.remaining} bytes",
        )
    if needed < reader.remaining:
        raise TrailingBytes(
            "data part longer than the table declares",
            field="data",
            expected=f"{needed} bytes",
            got=f"{reader.remaining} bytes",
        )
    return _Table(codec, seed, entries, reader)


def decode_frame(
    payload: bytes | bytearray | memoryview | np.ndarray,
    *,
    limits: FrameLimits = DEFAULT_LIMITS,
    expected: Mapping[str, TensorSpec] | Sequence[TensorSpec] | None = None,
    expected_codec: str | None = None,
    check_header: Callable[[str, int | None], None] | None = None,
) -> tuple[str, list[CompressedTensor]]:
    """Decode and validate a frame.

    Parameters
    ----------
    payload : bytes-like
        The frame: ``bytes``, ``bytearray``, ``memoryview`` or a ``uint8`` numpy
        array (as it arrives in a Flower ``ArrayRecord``).
    limits : FrameLimits, optional
        Largest sizes the frame may declare; checked before anything is allocated.
    expected : mapping of str to TensorSpec, or sequence of TensorSpec, optional
        The model's tensors as the receiver knows them. Needed for a frame that
        carries only its schema digest (else :class:`~fedsync.wire.SchemaRequired`);
        when given, the frame's digest or table must match them (else
        :class:`~fedsync.wire.SchemaMismatch`).
    expected_codec : str, optional
        The codec description the frame must carry, exactly; another raises
        :class:`~fedsync.wire.UnexpectedCodec` as soon as it is read (after the
        envelope, before the schema and the table). Default: any.
    check_header : callable, optional
        Called with the codec description and the frame seed (``None`` when the frame
        has none) as soon as both are read, after ``expected_codec``'s check and
        before the schema, the table or any tensor; what it raises propagates. A
        codec uses it for the rules the wire leaves to it, such as whether its
        frames carry a seed (:meth:`fedsync.codecs.UpdateCodec.decode`), which then
        hold for a frame of no tensors too.

    Returns
    -------
    codec : str
        The codec description.
    tensors : list of CompressedTensor
        The tensors in frame order (a digest-only frame's are sorted by name; see
        the module docstring for the dtypes), each with the frame seed when the
        frame carries one (``seed``, else ``None``).

    Raises
    ------
    PayloadError
        A subclass naming the fault, its field, tensor and expected vs found value,
        for any payload that is not a valid frame within ``limits``. Nothing else
        escapes for bad bytes (but whatever ``check_header`` raises).
    """
    table = _parse_table(payload, limits, expected, expected_codec, check_header)
    return table.codec, [_decode_data(table.reader, e, table.seed) for e in table.entries]


def inspect_frame(
    payload: bytes | bytearray | memoryview | np.ndarray,
    *,
    limits: FrameLimits = DEFAULT_LIMITS,
    expected: Mapping[str, TensorSpec] | Sequence[TensorSpec] | None = None,
) -> tuple[str, list[TensorLayout]]:
    """Validate a frame's envelope and table and report each tensor's byte layout.

    Cheaper than :func:`decode_frame` (no section is decoded, so a frame that
    passes here may still fail there); meant for reports and benchmarks that break
    a real payload down into index, code and parameter bytes.

    Returns
    -------
    codec : str
        The codec description.
    layouts : list of TensorLayout
        One per tensor, in frame order.

    Raises
    ------
    PayloadError
        As :func:`decode_frame` (which also explains ``expected``), for faults in
        the envelope or table.
    """
    table = _parse_table(payload, limits, expected)
    layouts = [
        TensorLayout(
            spec=entry.spec,
            index_mode=entry.mode,
            coding=entry.coding,
            coding_param=entry.coding_param,
            count=entry.count,
            scheme=entry.scheme,
            bits=entry.bits,
            index_nbytes=entry.index_nbytes,
            codes_nbytes=codes_nbytes(entry.count, entry.bits),
            params_nbytes=sum(4 * length for _, length in entry.params),
        )
        for entry in table.entries
    ]
    return table.codec, layouts
