"""A strict reader of IDX files, the format of MNIST and Fashion-MNIST.

An IDX file is a 4-byte magic number -- two zero bytes, a dtype code, the number of
dimensions -- then one big-endian uint32 per dimension, then the values, big-endian,
in C order. Files may be gzip-compressed (detected by content, not by name).

Nothing is trusted: the magic, the dtype code, the dimension count, and the declared
size against the bytes actually present are all checked, and the declared size is
bounded *before* anything that large is allocated. Every fault raises
:class:`~fedsync.data.types.DatasetFormatError` naming the file and what is wrong.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

from fedsync.data.types import DatasetFormatError

IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
"""IDX dtype code to numpy dtype (big-endian where it matters)."""

MAX_DIMS = 16
"""More dimensions than this is taken as a corrupt header, not a real tensor."""

DEFAULT_MAX_BYTES = 1 << 32
"""Refuse files declaring more data than this (4 GiB); MNIST train images are 47 MB."""

_GZIP_MAGIC = b"\x1f\x8b"


class _Readable(Protocol):
    """A raw file or a gzip stream: all the parser needs is ``read``."""

    def read(self, size: int = -1, /) -> bytes: ...


def read_idx(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a native-endian numpy array.

    Parameters
    ----------
    path : str or path-like
        The file.
    max_bytes : int
        Largest data section accepted; a header declaring more is rejected unread.

    Returns
    -------
    numpy.ndarray
        Array of the declared shape and dtype, in native byte order.

    Raises
    ------
    DatasetFormatError
        Bad magic, unknown dtype code, bad dimension count, a declared size over
        ``max_bytes``, a truncated header or data section, trailing bytes, or a
        corrupt gzip stream.
    FileNotFoundError
        When the file does not exist.
    """
    file = Path(path)
    with file.open("rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if not compressed:
            return _parse(raw, file, max_bytes, file_size=file.stat().st_size)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                return _parse(stream, file, max_bytes, file_size=None)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            # EOFError: the compressed stream stops early; zlib.error and BadGzipFile:
            # corrupt deflate data or a CRC/length mismatch in the trailer.
            raise DatasetFormatError(file, f"corrupt or truncated gzip stream ({err})") from err


def _parse(stream: _Readable, file: Path, max_bytes: int, file_size: int | None) -> np.ndarray:
    magic = stream.read(4)
    if len(magic) < 4:
        raise DatasetFormatError(
            file, f"truncated header: {len(magic)} bytes, the magic number alone needs 4"
        )
    if magic[0] != 0 or magic[1] != 0:
        raise DatasetFormatError(
            file,
            f"bad magic number 0x{magic.hex()}: an IDX file starts with two zero bytes "
            "(is this really an IDX file?)",
        )
    code, ndim = magic[2], magic[3]
    dtype = IDX_DTYPES.get(code)
    if dtype is None:
        valid = ", ".join(f"0x{c:02x}" for c in IDX_DTYPES)
        raise DatasetFormatError(file, f"unknown dtype code 0x{code:02x} (valid: {valid})")
    if not 1 <= ndim <= MAX_DIMS:
        raise DatasetFormatError(file, f"bad number of dimensions {ndim} (1 to {MAX_DIMS})")

    dims_raw = stream.read(4 * ndim)
    if len(dims_raw) < 4 * ndim:
        raise DatasetFormatError(
            file,
            f"truncated header: {ndim} dimensions need {4 * ndim} bytes, "
            f"only {len(dims_raw)} present",
        )
    dims = struct.unpack(f">{ndim}I", dims_raw)
    header_len = 4 + 4 * ndim
    n_bytes = math.prod(dims) * dtype.itemsize
    if n_bytes > max_bytes:
        raise DatasetFormatError(
            file,
            f"header declares {n_bytes} data bytes for shape {dims}, over the {max_bytes} limit",
        )
    if file_size is not None and file_size != header_len + n_bytes:
        # Raw file: the size is known up front, so say exactly how far off it is.
        have = file_size - header_len
        fault = "truncated" if have < n_bytes else "trailing bytes"
        raise DatasetFormatError(
            file,
            f"{fault}: header declares shape {dims} of {dtype.name} = {n_bytes} data bytes, "
            f"the file holds {have}",
        )

    data = stream.read(n_bytes)
    if len(data) < n_bytes:
        raise DatasetFormatError(
            file,
            f"truncated: header declares shape {dims} of {dtype.name} = {n_bytes} data bytes, "
            f"only {len(data)} present",
        )
    if stream.read(1):
        raise DatasetFormatError(
            file, f"trailing bytes after the {n_bytes} data bytes of shape {dims}"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=False)
