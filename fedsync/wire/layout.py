"""The frame's byte layout (version 2) and the constants that pin it down.

All fixed-width integers are little-endian; ``varint`` is minimal unsigned LEB128
(at most 10 bytes, see :mod:`fedsync.wire.buffer`); ``text`` is a varint byte length
followed by that many bytes of UTF-8. Bit streams are little-endian (bit ``j`` is
bit ``j % 8`` of byte ``j // 8``) and padded with zero bits to a whole byte.

A frame costs what it carries: both ends know the model, so by default only a digest
of its tensors travels (:mod:`fedsync.wire.schema`), and a field appears only where
the decoder cannot derive it.

========== ========= ============================================================
size       field     meaning
========== ========= ============================================================
4          magic     ``b"FSYN"``
1          version   format version, 2
1          flags     bit 0 (``FLAG_TABLE``): the tensor table travels; others 0
8 (u64)    length    total frame bytes, this header and the checksum included
text       codec     codec description (at most ``max_codec_length`` bytes)
...        schema    flag clear: the 8-byte schema digest; the tensors are the
                     receiver's specs in name order. Flag set: varint tensor count,
                     then per tensor ``text`` name, 1 dtype (1 float32, 2 float16,
                     3 bfloat16, 4 float64), 1 ndim, ndim varint dimensions
...        formats   varint format count (at most the tensor count), then per
                     format: 1 scheme (1 fp32, 2 fp16, 3 bf16, 4 uniform, 5 qsgd,
                     6 sign, 7 ternary), 1 bits (1..32), varint param count (at
                     most ``max_params``), per param ``text`` name and varint
                     ``L``: 0 if each tensor gives the param's float count, else
                     every tensor of the format has ``L - 1`` floats
...        entries   one per tensor, in schema order (below)
...        data      per tensor, in the same order: params, index section, codes
4 (u32)    crc32     CRC-32 (zlib) of every byte before it
========== ========= ============================================================

Tensor entry (fields in brackets appear only when the condition holds):

================================ ===================================================
size                             field
================================ ===================================================
1                                head: ``mode << 4 | coding``; mode (see
                                 :data:`~fedsync.wire.registry.INDEX_MODE_RULES`)
                                 0 explicit, 1 dense, 2 mask; coding 0 none (modes
                                 without positions), 1 dense, 2 bitmap,
                                 3 elias_fano, 4 rice
[varint] format                  when the frame has more than one format
[varint] value count             unless the mode's count is implied (dense: numel)
[varint per param] float count   the format's params whose ``L`` is 0
[1] coding param                 Elias-Fano low bits ``L`` / Rice ``k``
[varint] index bytes             Rice (other sections' sizes follow from count,
                                 numel and parameter)
================================ ===================================================

Data, per tensor:

=============================== ====================================================
size                            contents
=============================== ====================================================
4 * len per param               the param's float32 values
index bytes                     positions (:mod:`fedsync.wire.index_coding`);
                                empty for the none and dense codings
ceil(n * bits / 8)              the codes, ``bits`` bits each, bit-packed
=============================== ====================================================

Every size in the data part follows from the table, so the decoder checks the
whole table and that the data part has exactly the bytes it implies *before* it
decodes (or allocates for) any tensor.

The decoder returns codes as ``uint8`` / ``uint16`` / ``uint32`` (the narrowest
that holds ``bits``), params as 1-d ``float32`` arrays in frame order, explicit
positions as ``int64`` and ``indices=None`` for the modes without positions.
"""

from __future__ import annotations

import struct

import numpy as np

from kernels import bitpack

__all__ = [
    "FLAG_TABLE",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_BITS",
    "TRAILER",
    "TRAILER_BYTES",
    "code_dtype",
    "codes_nbytes",
]

MAGIC = b"FSYN"
FORMAT_VERSION = 2
FLAG_TABLE = 0x01
"""Header flag: the tensor table travels (else only the schema digest)."""
HEADER_BYTES = 14
"""Magic, version, flags and the u64 frame length."""
TRAILER_BYTES = 4
"""The CRC-32."""
MAX_BITS = 32
"""Widest code the format carries."""

HEADER = struct.Struct("<4sBBQ")
TRAILER = struct.Struct("<I")


def code_dtype(bits: int) -> np.dtype:
    """Narrowest unsigned dtype holding ``bits``-bit codes."""
    return np.dtype(np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32)


def codes_nbytes(count: int, bits: int) -> int:
    """Bytes of ``count`` packed codes of ``bits`` bits."""
    return bitpack.packed_nbytes(count, bits)
