"""The frame's byte layout (version 1) and the constants that pin it down.

All fixed-width integers are little-endian; ``varint`` is minimal unsigned LEB128
(at most 10 bytes, see :mod:`fedsync.wire.buffer`); ``text`` is a varint byte length
followed by that many bytes of UTF-8. Bit streams are little-endian (bit ``j`` is
bit ``j % 8`` of byte ``j // 8``) and padded with zero bits to a whole byte.

Header and trailer:

========== ======== =============================================================
size       field    meaning
========== ======== =============================================================
4          magic    ``b"FSYN"``
1          version  format version, 1
1          flags    reserved, must be 0
8 (u64)    length   total frame bytes, this header and the checksum included
text       codec    codec description (at most ``max_codec_length`` bytes)
varint     count    number of tensors
...        table    ``count`` table entries (below)
...        data     per tensor, in table order: params, index section, codes
4 (u32)    crc32    CRC-32 (zlib) of every byte before it
========== ======== =============================================================

Table entry, one per tensor:

============= ============ ==========================================================
size          field        meaning
============= ============ ==========================================================
text          name         state-dict key (at most ``max_name_length`` bytes, unique)
1             dtype        1 float32, 2 float16, 3 bfloat16, 4 float64
1             ndim         number of dimensions (0 for a scalar)
ndim varints  shape        dimensions; their product is ``numel``
1             index mode   0 explicit, 1 dense (all positions), 2 mask (shared mask),
                           3 lowrank (factors, below)
varint        value count  ``n``, codes that follow; dense: ``n == numel``; lowrank:
                           ``n == r * (m + n)``, ``1 <= r <= min(m, n)``; else ``<= numel``
1             scheme       1 fp32, 2 fp16, 3 bf16, 4 uniform, 5 qsgd, 6 sign, 7 ternary
1             bits         bits per code, 1..32
varint        param count  float parameter arrays (at most ``max_params``)
per param     name, len    ``text`` name (unique in the tensor), varint float count
1             coding       0 none (dense, mask, lowrank); explicit: 1 dense, 2 bitmap,
                           3 elias_fano, 4 rice
1             coding param Elias-Fano low bits ``L`` / Rice ``k``; 0 otherwise
varint        index bytes  length of the index section
============= ============ ==========================================================

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

Every size in the data part follows from the table, so the decoder checks the
whole table and that the data part has exactly the bytes it implies *before* it
decodes (or allocates for) any tensor.

The decoder returns codes as ``uint8`` / ``uint16`` / ``uint32`` (the narrowest
that holds ``bits``), params as 1-d ``float32`` arrays in frame order, explicit
positions as ``int64`` and ``indices=None`` for the dense and mask modes.
"""

from __future__ import annotations

import struct

import numpy as np

from kernels import bitpack

__all__ = [
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
FORMAT_VERSION = 1
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
