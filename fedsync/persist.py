"""Crash-safe files: a reader finds the old version or the new one, never half of either.

Server checkpoints and a node's codec state are written while the process may be killed
at any instant (a SIGKILLed SuperLink, a board losing power). Every write here goes to
a temporary file in the target's own folder, is flushed and ``fsync``-ed, then renamed
over the target with :func:`os.replace` (atomic on POSIX within one filesystem), and
the folder is ``fsync``-ed so the rename itself survives a power cut.

:func:`save_arrays` / :func:`load_arrays` store named numpy arrays plus a small JSON
header in one ``.npz`` (no pickle: a file from elsewhere cannot run code when read).

Nothing here imports Flower or torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = [
    "JOB_KEY",
    "META_KEY",
    "PersistError",
    "arrays_bytes",
    "atomic_write_bytes",
    "atomic_write_text",
    "bytes_digest",
    "file_digest",
    "load_arrays",
    "parse_arrays",
    "save_arrays",
]

JOB_KEY: Final = "fedsync-job"
"""Task-config key naming the training job (a lineage of global models that a resumed
run continues). A node keys its persisted codec state by it, so a residual is reused
by a resumed run of the same job but never leaks into an unrelated run."""

META_KEY: Final = "__meta__"
"""Entry of a :func:`save_arrays` file that holds its JSON header (UTF-8 bytes)."""


class PersistError(ValueError):
    """A persisted file is unreadable, truncated, or not the kind expected."""


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically.

    Parameters
    ----------
    path : pathlib.Path
        The target; its folder is created if missing.
    data : bytes
        The whole new content.
    durable : bool
        ``fsync`` the file and its folder (off only where a power cut does not
        matter, e.g. tests of the atomicity alone).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as the target: os.replace is atomic only within one filesystem.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fsync_folder(path.parent)
    return path


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def save_arrays(
    path: Path,
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
    *,
    durable: bool = True,
) -> Path:
    """Write named arrays and a JSON-able header to ``path`` (an ``.npz``), atomically.

    Raises
    ------
    ValueError
        If an array is named :data:`META_KEY` or holds Python objects.
    """
    return atomic_write_bytes(path, arrays_bytes(arrays, meta), durable=durable)


def arrays_bytes(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bytes:
    """The bytes :func:`save_arrays` writes (for a caller that writes them itself).

    Raises
    ------
    ValueError
        If an array is named :data:`META_KEY` or holds Python objects.
    """
    if META_KEY in arrays:
        raise ValueError(f"array name {META_KEY!r} is reserved for the header")
    entries: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        value = np.asarray(array)
        if value.dtype == object:
            raise ValueError(f"array {name!r} holds Python objects; only numeric arrays persist")
        entries[name] = value
    header = json.dumps(dict(meta), sort_keys=True).encode("utf-8")
    entries[META_KEY] = np.frombuffer(header, dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **entries)  # type: ignore[arg-type]
    return buffer.getvalue()


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read what :func:`save_arrays` wrote: ``(arrays, header)``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    PersistError
        If the file is not a readable ``.npz`` with a header.
    """
    return parse_arrays(path.read_bytes(), source=str(path))


def parse_arrays(
    raw: bytes, *, source: str = "<bytes>"
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """:func:`load_arrays` on bytes already read (so a caller can hash exactly them).

    Raises
    ------
    PersistError
        If ``raw`` is not a readable ``.npz`` with a header; ``source`` names it.
    """
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {name: np.array(npz[name]) for name in npz.files}
    except Exception as err:  # zip, header or dtype trouble: all mean "not our file"
        raise PersistError(f"{source} is not a readable array file: {err}") from err
    header = arrays.pop(META_KEY, None)
    if header is None or header.dtype != np.uint8:
        raise PersistError(f"{source} has no {META_KEY!r} header")
    try:
        meta = json.loads(header.tobytes().decode("utf-8"))
    except ValueError as err:
        raise PersistError(f"{source} has an unreadable header: {err}") from err
    if not isinstance(meta, dict):
        raise PersistError(f"{source}: header must be a JSON object, got {type(meta).__name__}")
    return arrays, meta


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, hex (what was written is what is read)."""
    return bytes_digest(path.read_bytes())


def bytes_digest(data: bytes) -> str:
    """SHA-256 of ``data``, hex."""
    return hashlib.sha256(data).hexdigest()


def _fsync_folder(folder: Path) -> None:
    # The rename lives in the folder's entry table; without this a power cut can undo it.
    # Some filesystems refuse to open or sync a directory: durability is then the OS's.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
