"""Decoding a frame, trusting nothing.

Order of checks: the payload size against the limits, magic, version, declared
length, CRC-32; then the whole table, field by field, each count against the limits
and against the tensor's shape; then that the data part has exactly the bytes the
table implies. Only then are sections decoded, by kernels whose every read and
write the table checks have already put in range. Any fault raises a
:class:`~fedsync.wire.PayloadError` subclass naming it. The byte layout is
documented in :mod:`fedsync.wire.layout`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedsync.updates import (
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
    TrailingBytes,
    TruncatedPayload,
    UnknownCode,
    UnsupportedVersion,
)
from fedsync.wire.index_coding import decode_indices, ef_nbytes, max_param, rice_nbytes_bounds
from fedsync.wire.layout import (
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
    SCHEME_NAMES,
)
from kernels import bitpack

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
    if entry.mode == "dense" and entry.count != numel:
        raise CountMismatch(
            "dense index mode needs one value per element",
            field="value count",
            tensor=entry.label,
            expected=numel,
            got=entry.count,
        )
    if entry.count > numel:
        raise CountMismatch(
            "more values than the tensor has elements",
            field="value count",
            tensor=entry.label,
            expected=f"<= {numel}",
            got=entry.count,
        )


def _read_params(reader: Reader, entry: _Entry, limits: FrameLimits) -> None:
    label = entry.label
    n_params = reader.varint("param count", label)
    if n_params > limits.max_params:
        raise LimitExceeded(
            "too many params (FrameLimits.max_params)",
            field="param count",
            tensor=label,
            expected=f"<= {limits.max_params}",
            got=n_params,
        )
    for i in range(n_params):
        name = reader.text(f"param[{i}] name", limits.max_name_length, "max_name_length", label)
        if any(name == seen for seen, _ in entry.params):
            raise MalformedField(
                f"duplicate param name {name!r}", field=f"param[{i}] name", tensor=label
            )
        length = reader.varint(f"param {name!r} length", label)
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
        entry.params.append((name, length))


def _check_index_section(entry: _Entry) -> None:
    """Check the coding fits the mode and the section length fits coding, count, numel."""
    label, coding, param, nbytes = entry.label, entry.coding, entry.coding_param, entry.index_nbytes
    count, numel = entry.count, entry.spec.numel
    if (entry.mode == "explicit") == (coding == "none"):
        allowed = "a position coding" if entry.mode == "explicit" else "'none'"
        raise MalformedField(
            f"index mode {entry.mode!r} needs {allowed}",
            field="index coding",
            tensor=label,
            expected=allowed,
            got=repr(coding),
        )
    if coding in ("none", "dense", "bitmap"):
        if param != 0:
            raise MalformedField(
                f"coding {coding!r} has no parameter",
                field="coding param",
                tensor=label,
                expected=0,
                got=param,
            )
    elif param > max_param(numel):
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


def _read_entry(reader: Reader, position: int, limits: FrameLimits) -> _Entry:
    where = f"#{position}"
    name = reader.text("name", limits.max_name_length, "max_name_length", where)
    label = f"#{position} {name!r}"
    dtype = _enum(reader, DTYPE_NAMES, "dtype", label)
    shape = _read_shape(reader, label, limits)
    mode = _enum(reader, INDEX_MODE_NAMES, "index mode", label)
    count = reader.varint("value count", label)
    scheme = _enum(reader, SCHEME_NAMES, "scheme", label)
    bits = reader.u8("bits", label)
    if not 1 <= bits <= MAX_BITS:
        raise MalformedField(
            "bits per code out of range",
            field="bits",
            tensor=label,
            expected=f"1..{MAX_BITS}",
            got=bits,
        )
    entry = _Entry(label, TensorSpec(name, shape, dtype), mode, count, scheme, bits)
    _check_count(entry)
    _read_params(reader, entry, limits)
    entry.coding = _enum(reader, CODING_NAMES, "index coding", label)
    entry.coding_param = reader.u8("coding param", label)
    entry.index_nbytes = reader.varint("index bytes", label)
    _check_index_section(entry)
    return entry


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


def _check_envelope(view: memoryview, limits: FrameLimits) -> None:
    """Size, magic, version, declared length and checksum: cheap checks first."""
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
    if flags != 0:
        raise MalformedField(
            "reserved flags must be 0 in version 1", field="flags", expected=0, got=flags
        )


def _decode_data(reader: Reader, entry: _Entry) -> CompressedTensor:
    label = entry.label
    params = {}
    for name, length in entry.params:
        raw = reader.take(4 * length, f"param {name!r}", label)
        params[name] = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    section = np.frombuffer(reader.take(entry.index_nbytes, "index section", label), dtype=np.uint8)
    indices = None
    if entry.mode == "explicit":
        indices = decode_indices(
            section, entry.coding, entry.coding_param, entry.count, entry.spec.numel, tensor=label
        )
    nbits = entry.count * entry.bits
    packed = np.frombuffer(reader.take((nbits + 7) // 8, "codes", label), dtype=np.uint8)
    if nbits % 8 and int(packed[-1]) >> (nbits % 8):
        raise MalformedField(
            "padding bits after the last code are not zero", field="codes", tensor=label
        )
    codes = bitpack.unpack_bits(packed, entry.count, entry.bits, code_dtype(entry.bits))
    values = QuantizedValues(entry.scheme, entry.bits, codes, params)
    return CompressedTensor(entry.spec, entry.mode, indices, values)  # type: ignore[arg-type]


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


def _parse_table(
    payload: bytes | bytearray | memoryview | np.ndarray, limits: FrameLimits
) -> tuple[str, list[_Entry], Reader]:
    """Check the envelope and the whole table; return a reader at the data part,
    which is known to have exactly the bytes the table implies."""
    view = _as_view(payload)
    _check_envelope(view, limits)
    reader = Reader(view, HEADER_BYTES, len(view) - TRAILER_BYTES)
    codec = reader.text("codec", limits.max_codec_length, "max_codec_length")
    n_tensors = reader.varint("tensor count")
    if n_tensors > limits.max_tensors:
        raise LimitExceeded(
            "too many tensors (FrameLimits.max_tensors)",
            field="tensor count",
            expected=f"<= {limits.max_tensors}",
            got=n_tensors,
        )

    entries: list[_Entry] = []
    names: set[str] = set()
    total_values = 0
    for position in range(n_tensors):
        entry = _read_entry(reader, position, limits)
        if entry.spec.name in names:
            raise MalformedField("duplicate tensor name", field="name", tensor=entry.label)
        names.add(entry.spec.name)
        total_values += entry.count
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
    return codec, entries, reader


def decode_frame(
    payload: bytes | bytearray | memoryview | np.ndarray, *, limits: FrameLimits = DEFAULT_LIMITS
) -> tuple[str, list[CompressedTensor]]:
    """Decode and validate a frame.

    Parameters
    ----------
    payload : bytes-like
        The frame: ``bytes``, ``bytearray``, ``memoryview`` or a ``uint8`` numpy
        array (as it arrives in a Flower ``ArrayRecord``).
    limits : FrameLimits, optional
        Largest sizes the frame may declare; checked before anything is allocated.

    Returns
    -------
    codec : str
        The codec description.
    tensors : list of CompressedTensor
        The tensors in frame order (see the module docstring for the dtypes).

    Raises
    ------
    PayloadError
        A subclass naming the fault, its field, tensor and expected vs found value,
        for any payload that is not a valid frame within ``limits``. Nothing else
        escapes for bad bytes.
    """
    codec, entries, reader = _parse_table(payload, limits)
    return codec, [_decode_data(reader, entry) for entry in entries]


def inspect_frame(
    payload: bytes | bytearray | memoryview | np.ndarray, *, limits: FrameLimits = DEFAULT_LIMITS
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
        As :func:`decode_frame`, for faults in the envelope or table.
    """
    codec, entries, _ = _parse_table(payload, limits)
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
        for entry in entries
    ]
    return codec, layouts
