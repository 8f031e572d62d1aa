"""Encode and decode one frame: a codec description plus compressed tensors.

The entry points of the wire format, gathered in one place: :func:`encode_frame`
(:mod:`fedsync.wire.encoder`), :func:`decode_frame` and :func:`inspect_frame`
(:mod:`fedsync.wire.decoder`). The byte layout is documented in
:mod:`fedsync.wire.layout`.
"""

from __future__ import annotations

from fedsync.wire.decoder import TensorLayout, decode_frame, inspect_frame
from fedsync.wire.encoder import encode_frame
from fedsync.wire.layout import FORMAT_VERSION, HEADER_BYTES, MAGIC, TRAILER_BYTES

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "TRAILER_BYTES",
    "TensorLayout",
    "decode_frame",
    "encode_frame",
    "inspect_frame",
]
