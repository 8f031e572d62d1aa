"""Bounded byte reading and writing for the frame: fixed-width ints and varints.

Varints are unsigned LEB128: seven value bits per byte, low groups first, the high
bit of a byte set when another byte follows. The reader accepts only the minimal
encoding of a value below 2**64 (at most 10 bytes), so every value has exactly one
encoding and a frame's bytes are a function of its contents.
"""

from __future__ import annotations

import struct
import zlib

from fedsync.wire.errors import (
    BadMagic,
    ChecksumMismatch,
    LimitExceeded,
    MalformedField,
    TruncatedPayload,
    UnsupportedVersion,
)

__all__ = [
    "MAX_VARINT_BYTES",
    "Reader",
    "Writer",
    "new_container",
    "open_container",
    "seal_container",
    "varint_len",
]

MAX_VARINT_BYTES = 10
"""Bytes of the longest varint (a value just below 2**64)."""


def varint_len(value: int) -> int:
    """Bytes the varint encoding of ``value`` (0 <= value < 2**64) takes."""
    return max(1, (value.bit_length() + 6) // 7)


def encode_varint(value: int) -> bytes:
    """The minimal LEB128 encoding of ``value`` (0 <= value < 2**64)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint value must be in [0, 2**64), got {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Writer:
    """Collects a frame's pieces; large arrays are kept as-is, not copied per field."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def raw(self, data: bytes | memoryview) -> None:
        """Append bytes unchanged."""
        self.parts.append(data)
        self.size += len(data)

    def u8(self, value: int) -> None:
        """Append one byte."""
        self.raw(bytes((value,)))

    def varint(self, value: int) -> None:
        """Append a varint."""
        self.raw(encode_varint(value))

    def text(self, value: str) -> None:
        """Append a varint byte length and the UTF-8 bytes of ``value``."""
        data = value.encode("utf-8")
        self.varint(len(data))
        self.raw(data)


class Reader:
    """Reads fields from ``data[pos:end]``, never past ``end``.

    Each method takes the name of the field it reads and the tensor it belongs to so
    that a failure names both. Nothing is allocated before its size is checked
    against the bytes that remain.
    """

    def __init__(self, data: memoryview, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end

    @property
    def remaining(self) -> int:
        """Bytes left before ``end``."""
        return self.end - self.pos

    def _need(self, n: int, field: str, tensor: str | None) -> None:
        if n > self.remaining:
            raise TruncatedPayload(
                f"frame body ends at byte {self.end} but the field needs bytes "
                f"{self.pos}..{self.pos + n}",
                field=field,
                tensor=tensor,
                expected=f"{n} bytes",
                got=f"{self.remaining} bytes",
            )

    def u8(self, field: str, tensor: str | None = None) -> int:
        """Read one byte."""
        self._need(1, field, tensor)
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u32(self, field: str, tensor: str | None = None) -> int:
        """Read a little-endian 32-bit unsigned integer."""
        self._need(4, field, tensor)
        (value,) = struct.unpack_from("<I", self.data, self.pos)
        self.pos += 4
        return int(value)

    def u64(self, field: str, tensor: str | None = None) -> int:
        """Read a little-endian 64-bit unsigned integer."""
        self._need(8, field, tensor)
        (value,) = struct.unpack_from("<Q", self.data, self.pos)
        self.pos += 8
        return int(value)

    def varint(self, field: str, tensor: str | None = None) -> int:
        """Read a minimal LEB128 varint below 2**64."""
        value = 0
        for i in range(MAX_VARINT_BYTES):
            byte = self.u8(field, tensor)
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if i > 0 and byte == 0:
                    raise MalformedField(
                        "varint is not minimal (ends in a zero byte)", field=field, tensor=tensor
                    )
                if value >= 1 << 64:
                    raise MalformedField(
                        "varint exceeds 64 bits", field=field, tensor=tensor, got=value
                    )
                return value
        raise MalformedField(
            f"varint runs past {MAX_VARINT_BYTES} bytes", field=field, tensor=tensor
        )

    def take(self, n: int, field: str, tensor: str | None = None) -> memoryview:
        """Return the next ``n`` bytes as a view (no copy)."""
        self._need(n, field, tensor)
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def text(self, field: str, max_len: int, limit: str, tensor: str | None = None) -> str:
        """Read a varint byte length (at most ``max_len``, the limit named ``limit``)
        and that many bytes of strict UTF-8."""
        length = self.varint(f"{field} length", tensor)
        if length > max_len:
            raise LimitExceeded(
                f"{field} is longer than FrameLimits.{limit}",
                field=f"{field} length",
                tensor=tensor,
                expected=f"<= {max_len} bytes",
                got=length,
            )
        raw = self.take(length, field, tensor)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedField(
                f"not valid UTF-8 ({exc.reason} at byte {exc.start})", field=field, tensor=tensor
            ) from None


def new_container(*, magic: bytes, format_version: int) -> Writer:
    """A writer of a small container frame (:func:`open_container` reads it back), its
    ``magic`` and format-version byte written: the body goes next, then
    :func:`seal_container`."""
    writer = Writer()
    writer.raw(magic)
    writer.u8(format_version)
    return writer


def seal_container(writer: Writer) -> bytes:
    """The container frame ``writer`` holds, with the CRC-32 of all of it appended."""
    body = b"".join(bytes(part) for part in writer.parts)
    return body + struct.pack("<I", zlib.crc32(body))


def open_container(
    payload: bytes | memoryview, *, magic: bytes, format_version: int, what: str, min_bytes: int
) -> Reader:
    """Check a small container frame's envelope -- ``magic``, a format-version byte, the
    body, a CRC-32 of everything before it -- and return a reader of the body (after the
    version byte, before the checksum).

    ``min_bytes`` is the shortest frame of this kind (envelope included); ``what`` names
    it in the errors (``"mask"``, ``"shared"``). Raises :class:`TruncatedPayload`,
    :class:`BadMagic`, :class:`ChecksumMismatch` or :class:`UnsupportedVersion`.
    """
    data = memoryview(bytes(payload))
    if len(data) < min_bytes:
        raise TruncatedPayload(
            f"too short for a {what} frame",
            field=f"{what} frame",
            expected=f">= {min_bytes} bytes",
            got=len(data),
        )
    head = bytes(data[: len(magic)])
    if head != magic:
        raise BadMagic(f"not a {what} frame", field="magic", expected=magic, got=head)
    (stored,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != stored:
        raise ChecksumMismatch(f"{what} frame checksum does not match", field="crc32")
    reader = Reader(data, len(magic), len(data) - 4)
    version = reader.u8("version")
    if version != format_version:
        raise UnsupportedVersion(
            f"unknown {what} frame version", field="version", expected=format_version, got=version
        )
    return reader
