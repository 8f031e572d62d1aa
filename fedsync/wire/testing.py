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
from fedsync.wire.layout import (
    FLAG_SEED,
    FLAG_TABLE,
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    TRAILER_BYTES,
)

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
    """One tensor's schema entry, format, table entry and data, every field a raw
    number or raw bytes.

    Defaults describe a valid 4-element float32 tensor, dense mode, 8-bit codes.
    The builder gives each tensor its own format (``scheme``, ``bits``, ``params``
    with per-tensor lengths). Optional fields (``count``, ``coding_param``,
    ``index_nbytes``) are written only where the layout has them, unless
    ``force_*`` says otherwise; ``index_nbytes=None`` writes the length of
    ``index``.
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
    head: int | None = None
    """Raw head byte (default ``mode << 4 | coding``)."""

    def schema_bytes(self) -> bytes:
        """The tensor-table entry: name, dtype, ndim, dims."""
        out = bytearray(_text(self.name))
        out += bytes((self.dtype, len(self.shape) if self.ndim is None else self.ndim))
        for dim in self.shape:
            out += encode_varint(dim)
        return bytes(out)

    def format_bytes(self) -> bytes:
        """A format of its own: scheme, bits, params with per-tensor lengths."""
        out = bytearray((self.scheme, self.bits))
        out += encode_varint(len(self.params))
        for name, _ in self.params:
            out += _text(name) + encode_varint(0)
        return bytes(out)

    def table_bytes(self, format_index: int | None = None) -> bytes:
        """The tensor entry (``format_index`` written when not ``None``)."""
        head = (self.mode << 4 | self.coding) if self.head is None else self.head
        out = bytearray((head & 0xFF,))
        if format_index is not None:
            out += encode_varint(format_index)
        if self.mode != 1:  # dense mode implies the count
            out += encode_varint(self.count)
        for _, length in self.params:
            out += encode_varint(length)
        if self.coding in (3, 4):
            out += bytes((self.coding_param,))
        if self.coding in (4, 5):  # Rice and context carry their length
            nbytes = len(self.index) if self.index_nbytes is None else self.index_nbytes
            out += encode_varint(nbytes)
        return bytes(out)

    def data_bytes(self) -> bytes:
        """Params, index section and codes."""
        return self.param_data + self.index + self.codes


@dataclass
class FrameBuilder:
    """Build a frame from raw fields; :meth:`build` fixes length and CRC by default.

    With ``digest`` set the frame carries that schema digest instead of the table;
    with ``seed`` set, that frame seed (``seed`` may be raw bytes of any length).
    """

    codec: str | bytes = "test"
    magic: bytes = MAGIC
    version: int = FORMAT_VERSION
    flags: int | None = None
    tensors: list[RawTensor] = field(default_factory=list)
    digest: bytes | None = None
    seed: int | bytes | None = None

    def add(self, tensor: RawTensor | None = None, **fields: Any) -> FrameBuilder:
        """Append a tensor (a :class:`RawTensor` or its fields); returns ``self``."""
        self.tensors.append(tensor if tensor is not None else RawTensor(**fields))
        return self

    def build(
        self,
        *,
        tensor_count: int | None = None,
        format_count: int | None = None,
        length: int | None = None,
        crc: int | None = None,
        extra_body: bytes = b"",
    ) -> bytes:
        """The frame bytes.

        Parameters
        ----------
        tensor_count : int, optional
            Declared tensor count (default: the number added).
        format_count : int, optional
            Declared format count (default: one per tensor).
        length : int, optional
            Declared frame length (default: the true length).
        crc : int, optional
            Declared CRC-32 (default: the true one).
        extra_body : bytes
            Bytes inserted after the data part, before the checksum.
        """
        body = bytearray(_text(self.codec))
        if isinstance(self.seed, int):
            body += struct.pack("<Q", self.seed)
        elif self.seed is not None:
            body += self.seed
        if self.digest is not None:
            body += self.digest
        else:
            body += encode_varint(len(self.tensors) if tensor_count is None else tensor_count)
            for tensor in self.tensors:
                body += tensor.schema_bytes()
        body += encode_varint(len(self.tensors) if format_count is None else format_count)
        for tensor in self.tensors:
            body += tensor.format_bytes()
        several = len(self.tensors) > 1
        for i, tensor in enumerate(self.tensors):
            body += tensor.table_bytes(i if several else None)
        for tensor in self.tensors:
            body += tensor.data_bytes()
        body += extra_body
        flags = self.flags
        if flags is None:
            flags = 0 if self.digest is not None else FLAG_TABLE
            flags |= FLAG_SEED if self.seed is not None else 0
        total = HEADER_BYTES + len(body) + TRAILER_BYTES
        head = struct.pack(
            "<4sBBQ", self.magic, self.version, flags, total if length is None else length
        )
        content = head + bytes(body)
        checksum = zlib.crc32(content) if crc is None else crc
        return content + struct.pack("<I", checksum)
