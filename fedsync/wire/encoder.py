"""Encoding a codec description and compressed tensors into one frame.

The input comes from fedsync's own compressors, so a tensor that breaks its contract
is a programming error: it raises :class:`ValueError` naming the tensor (never
:class:`~fedsync.wire.PayloadError`, which is about received bytes). The byte layout
is documented in :mod:`fedsync.wire.layout`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from fedsync.updates import CompressedTensor, QuantizedValues, lowrank_rank, matrix_dims
from fedsync.wire.buffer import Writer
from fedsync.wire.index_coding import as_index_array, choose_index_coding, encode_indices
from fedsync.wire.layout import (
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    MAX_BITS,
    TRAILER,
    TRAILER_BYTES,
    code_dtype,
)
from fedsync.wire.limits import MAX_FORMAT_NUMEL
from fedsync.wire.registry import CODING_CODES, DTYPE_CODES, INDEX_MODE_CODES, SCHEME_CODES
from kernels import bitpack

__all__ = ["encode_frame"]


def _checked_codes(values: QuantizedValues, label: str) -> np.ndarray:
    """Codes as an unsigned array after checking shape, sign and width."""
    bits = values.bits
    if not isinstance(bits, int | np.integer) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{label}: bits must be an int in 1..{MAX_BITS}, got {bits!r}")
    codes = np.asarray(values.codes)
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


def _checked_params(params: dict[str, np.ndarray], label: str) -> list[tuple[str, np.ndarray]]:
    out = []
    for name, array in params.items():
        if not isinstance(name, str):
            raise ValueError(f"{label}: param names must be str, got {name!r}")
        out.append((name, np.ascontiguousarray(np.asarray(array, dtype="<f4").reshape(-1))))
    return out


def _encode_tensor(
    tensor: CompressedTensor, label: str, table: Writer, data: Writer, index_coding: str | None
) -> None:
    spec = tensor.spec
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
    mode = tensor.index_mode
    if mode not in INDEX_MODE_CODES:
        raise ValueError(f"{label}: unknown index mode {mode!r}")
    values = tensor.values
    if values.scheme not in SCHEME_CODES:
        raise ValueError(
            f"{label}: unknown scheme {values.scheme!r}; expected one of {list(SCHEME_CODES)}"
        )
    codes = _checked_codes(values, label)
    count = int(codes.shape[0])
    bits = int(values.bits)

    if mode == "explicit":
        if tensor.indices is None:
            raise ValueError(f"{label}: explicit index mode needs indices")
        indices = as_index_array(tensor.indices, numel, label=label)
        if indices.shape[0] != count:
            raise ValueError(f"{label}: {indices.shape[0]} indices but {count} codes")
        plan = choose_index_coding(indices, numel, coding=index_coding)
        section = encode_indices(indices, numel, plan)
        coding, coding_param = plan.coding, plan.param
    else:
        if tensor.indices is not None:
            raise ValueError(f"{label}: index mode {mode!r} carries no indices, got some")
        if mode == "dense" and count != numel:
            raise ValueError(f"{label}: dense mode needs {numel} codes, got {count}")
        if mode == "mask" and count > numel:
            raise ValueError(f"{label}: mask mode has {count} codes for {numel} elements")
        if mode == "lowrank" and lowrank_rank(shape, count) is None:
            raise ValueError(
                f"{label}: lowrank mode needs r * (m + n) codes with 1 <= r <= min(m, n) "
                f"for (m, n) = {matrix_dims(shape)}, got {count}"
            )
        section, coding, coding_param = b"", "none", 0

    params = _checked_params(values.params, label)

    table.text(spec.name)
    table.u8(DTYPE_CODES[spec.dtype])
    table.u8(len(shape))
    for dim in shape:
        table.varint(int(dim))
    table.u8(INDEX_MODE_CODES[mode])
    table.varint(count)
    table.u8(SCHEME_CODES[values.scheme])
    table.u8(bits)
    table.varint(len(params))
    for name, array in params:
        table.text(name)
        table.varint(array.shape[0])
    table.u8(CODING_CODES[coding])
    table.u8(coding_param)
    table.varint(len(section))

    for _, array in params:
        data.raw(array.tobytes())
    data.raw(section)
    data.raw(bitpack.pack_bits(codes, bits).data)


def encode_frame(
    codec: str, tensors: Sequence[CompressedTensor], *, index_coding: str | None = None
) -> bytes:
    """Encode a codec description and compressed tensors into one frame.

    Parameters
    ----------
    codec : str
        The codec description (the compressor's spec string), stored verbatim.
    tensors : sequence of CompressedTensor
        The tensors, in the order the decoder will return them; names must be unique.
    index_coding : str, optional
        Force one coding (``"dense"``, ``"bitmap"``, ``"elias_fano"``, ``"rice"``) for
        every explicit index set, e.g. to compare codings; by default each tensor's
        positions take the smallest (see :func:`fedsync.wire.index_bits_for`).

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
        counts that disagree with the index mode, duplicate names); the message
        names the tensor.
    """
    if not isinstance(codec, str):
        raise ValueError(f"codec must be a str, got {type(codec).__name__}")
    table, data = Writer(), Writer()
    table.text(codec)
    table.varint(len(tensors))
    seen: set[str] = set()
    for position, tensor in enumerate(tensors):
        label = f"tensor #{position} {tensor.spec.name!r}"
        if tensor.spec.name in seen:
            raise ValueError(f"{label}: duplicate tensor name")
        seen.add(tensor.spec.name)
        _encode_tensor(tensor, label, table, data, index_coding)

    length = HEADER_BYTES + table.size + data.size + TRAILER_BYTES
    header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, length)
    crc = zlib.crc32(header)
    for part in table.parts + data.parts:
        crc = zlib.crc32(part, crc)
    return b"".join([header, *table.parts, *data.parts, TRAILER.pack(crc)])
