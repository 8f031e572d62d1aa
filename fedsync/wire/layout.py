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
1          flags     bit 0 (``FLAG_TABLE``): the tensor table travels; bit 1
                     (``FLAG_SEED``): the frame seed travels; others 0
8 (u64)    length    total frame bytes, this header and the checksum included
text       codec     codec description (at most ``max_codec_length`` bytes)
[8 (u64)]  seed      only with ``FLAG_SEED``: the frame seed a seeded rotation of
                     the values (``rht``) derives each tensor's signs from
...        schema    ``FLAG_TABLE`` clear: the 8-byte schema digest; the tensors are
                     the receiver's specs in name order. Set: varint tensor count,
                     then per tensor ``text`` name, 1 dtype (1 float32, 2 float16,
                     3 bfloat16, 4 float64), 1 ndim, ndim varint dimensions
...        formats   varint format count (at most the tensor count), then per
                     format: 1 scheme (1 fp32, 2 fp16, 3 bf16, 4 uniform, 5 qsgd,
                     6 sign, 7 ternary, 8 binmean), 1 bits (1..32), varint param count (at
                     most ``max_params``), per param ``text`` name and varint
                     ``L``: 0 if each tensor gives the param's float count, else
                     every tensor of the format has ``L - 1`` floats
...        entries   one per tensor, in schema order (below)
...        data      per tensor, in the same order: params, index section, codes
4 (u32)    crc32     CRC-32 (zlib) of every byte before it
========== ========= ============================================================

Tensor entry (fields in brackets appear only when the condition holds):

================================ ============================================
Data, per tensor:

=============================== ====================================================
size                            contents
=============================== ====================================================
4 * len per param               the param's float32 values
index bytes                     positions (:mod:`fedsync.wire.index_coding`);
                                empty for the none and dense codings
ceil(n * bits / 8)              the codes, ``bits`` bits each, bit-packed
=============================== ====================================================

Index mode 3, ``lowrank``: the tensor (``ndim >= 2``) is the m x n matrix with
``m = shape[0]`` and ``n`` the product of the other dimensions; its ``n`` codes are
the factors ``P`` (m x r) then ``Q`` (n x r), each row-major, and the tensor is
``P @ Q.T``. The rank is not stored: ``r = count / (m + n)``, which must be a whole
number in ``1..min(m, n)``. No index section (coding 0); params and codes as in
every other mode (one quantizer over the ``r * (m + n)`` factor values).

The frame seed (added within version 2; frames without ``FLAG_SEED`` are byte for byte
what they were, and a decoder from before the flag rejects a seeded frame as a
reserved flag bit) is 8 bytes per frame whatever the tensor count: the rotation's
signs are a hash of it, the tensor's name and the position, never sent. The codec
description says whether a frame must have one, whatever its tensor count (a rotating
codec's frame of no tensors too); the codec, not the wire, checks that, on the header
(:func:`~fedsync.wire.decode_frame`'s ``check_header``).

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

from fedsync.kernels import bitpack

__all__ = [
    "FLAGS_KNOWN",
    "FLAG_SEED",
    "FLAG_TABLE",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_BITS",
    "SEED",
    "TRAILER",
    "TRAILER_BYTES",
    "code_dtype",
    "codes_nbytes",
]

MAGIC = b"FSYN"
FORMAT_VERSION = 2
FLAG_TABLE = 0x01
"""Header flag: the tensor table travels (else only the schema digest)."""
FLAG_SEED = 0x02
"""Header flag: an 8-byte frame seed follows the codec description."""
FLAGS_KNOWN = FLAG_TABLE | FLAG_SEED
"""Every flag bit this version defines; the others must be 0."""
HEADER_BYTES = 14
"""Magic, version, flags and the u64 frame length."""
TRAILER_BYTES = 4
"""The CRC-32."""
MAX_BITS = 32
"""Widest code the format carries."""

HEADER = struct.Struct("<4sBBQ")
TRAILER = struct.Struct("<I")
SEED = struct.Struct("<Q")
"""The frame seed (only with :data:`FLAG_SEED`)."""


def code_dtype(bits: int) -> np.dtype:
    """Narrowest unsigned dtype holding ``bits``-bit codes."""
    return np.dtype(np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32)


def codes_nbytes(count: int, bits: int) -> int:
    """Bytes of ``count`` packed codes of ``bits`` bits."""
    return bitpack.packed_nbytes(count, bits)
