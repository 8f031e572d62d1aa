"""Tools for building broken frames on purpose, for tests of the decoder.

:class:`FrameBuilder` writes a frame field by field from raw values (any code, any
count, any length), so a test can state exactly which field lies; :func:`reseal`
makes a mutated frame's length and checksum consistent again so the decoder's
deeper checks, not the CRC, have to catch the fault.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fedsync.wire.buffer import encode_varint
from fedsync.wire.layout import FORMAT_VERSION, HEADER_BYTES, MAGIC, TRAILER_BYTES

__all__ = ["FrameBuilder", "RawTensor", "reseal"]


def reseal(frame: bytes) -> bytes:
    """Rewrite the length field and the CRC-32 of ``frame`` to match its bytes.

    The last four bytes are taken to be the checksum whatever they hold. Frames too
    short to have a header and a trailer are returned unchanged.
    """
    if len(frame) < HEADER_BYTES + TRAILER_BYTES:
        return frame
    body = bytearray(frame[:-TRAILER_BYTES])
    struct.pack_into("<Q", body, 6, len(frame))
    return bytes(body) + struct.pack("<I", zlib.crc32(body))


def _text(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return encode_varint(len(raw)) + raw


@dataclass
class RawTensor:
    """One table entry and its data, every field a raw number or raw bytes.

    Defaults describe a valid 4-element float32 tensor, dense mode, 8-bit codes.
    ``index_nbytes=None`` writes the length of ``index``.
    """

    name: str | bytes = "t"
    dtype: int = 1
    shape: Sequence[int] = (4,)
    ndim: int | None = None
    mode: int = 1
    count: int = 4
    scheme: int = 4
    bits: int = 8
    params: Sequence[tuple[str | bytes, int]] = ()
    coding: int = 0
    coding_param: int = 0
    index_nbytes: int | None = None
    param_data: bytes = b""
    index: bytes = b""
    codes: bytes = b"\x01\x02\x03\x04"

    def table_bytes(self) -> bytes:
        """The table entry."""
        out = bytearray(_text(self.name))
        out += bytes((self.dtype, len(self.shape) if self.ndim is None else self.ndim))
        for dim in self.shape:
            out += encode_varint(dim)
        out += bytes((self.mode,))
        out += encode_varint(self.count)
        out += bytes((self.scheme, self.bits))
        out += encode_varint(len(self.params))
        for name, length in self.params:
            out += _text(name) + encode_varint(length)
        out += bytes((self.coding, self.coding_param))
        nbytes = len(self.index) if self.index_nbytes is None else self.index_nbytes
        out += encode_varint(nbytes)
        return bytes(out)

    def data_bytes(self) -> bytes:
        """Params, index section and codes."""
        return self.param_data + self.index + self.codes


@dataclass
class FrameBuilder:
    """Build a frame from raw fields; :meth:`build` fixes length and CRC by default."""

    codec: str | bytes = "test"
    magic: bytes = MAGIC
    version: int = FORMAT_VERSION
    flags: int = 0
    tensors: list[RawTensor] = field(default_factory=list)

    def add(self, tensor: RawTensor | None = None, **fields: Any) -> FrameBuilder:
        """Append a tensor (a :class:`RawTensor` or its fields); returns ``self``."""
        self.tensors.append(tensor if tensor is not None else RawTensor(**fields))
        return self

    def build(
        self,
        *,
        tensor_count: int | None = None,
        length: int | None = None,
        crc: int | None = None,
        extra_body: bytes = b"",
    ) -> bytes:
        """The frame bytes.

        Parameters
        ----------
        tensor_count : int, optional
            Declared tensor count (default: the number added).
        length : int, optional
            Declared frame length (default: the true length).
        crc : int, optional
            Declared CRC-32 (default: the true one).
        extra_body : bytes
            Bytes inserted after the data part, before the checksum.
        """
        count = len(self.tensors) if tensor_count is None else tensor_count
        body = bytearray(_text(self.codec))
        body += encode_varint(count)
        for tensor in self.tensors:
            body += tensor.table_bytes()
        for tensor in self.tensors:
            body += tensor.data_bytes()
        body += extra_body
        total = HEADER_BYTES + len(body) + TRAILER_BYTES
        head = struct.pack(
            "<4sBBQ", self.magic, self.version, self.flags, total if length is None else length
        )
        content = head + bytes(body)
        checksum = zlib.crc32(content) if crc is None else crc
        return content + struct.pack("<I", checksum)
