"""Fetching dataset files for online users; never called unless asked.

Tests and simulations read local files only. This module runs when a user passes
``download=True`` to :func:`fedsync.data.load_dataset` or calls
:func:`download_dataset` directly. Every file is md5-checked before it is moved into
place (written to a temporary name first, so an interrupted download never leaves a
half file where the loader would find it).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedsync.data.types import DatasetError

_CHUNK = 1 << 20
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset as published.

    Parameters
    ----------
    name : str
        File name to store it under.
    urls : tuple of str
        Where to get it, tried in order (the official place first, then mirrors).
    md5 : str
        Expected md5 hex digest.
    md5_of_uncompressed : bool
        The digest is of the gunzipped content (how MNIST's are published) rather than
        of the file as downloaded.
    """

    name: str
    urls: tuple[str, ...]
    md5: str
    md5_of_uncompressed: bool = False


def md5_of(path: Path, *, uncompressed: bool = False) -> str:
    """The md5 hex digest of a file, or of its gunzipped content."""
    digest = hashlib.md5(usedforsecurity=False)
    with gzip.open(path, "rb") if uncompressed else path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_files(files: Sequence[RemoteFile], target: Path) -> list[Path]:
    """Download each file into ``target`` unless a copy with the right md5 is there.

    Raises
    ------
    DatasetError
        When every URL of a file fails or the content does not match its md5.
    """
    target.mkdir(parents=True, exist_ok=True)
    return [_fetch_one(remote, target) for remote in files]


def _fetch_one(remote: RemoteFile, target: Path) -> Path:
    final = target / remote.name
    if final.is_file() and _matches(final, remote):
        return final
    errors: list[str] = []
    for url in remote.urls:
        fd, tmp_name = tempfile.mkstemp(dir=target, prefix=f".{remote.name}.", suffix=".part")
        tmp = Path(tmp_name)
        try:
            with (
                os.fdopen(fd, "wb") as out,
                urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp,
            ):
                shutil.copyfileobj(resp, out, _CHUNK)
            if not _matches(tmp, remote):
                errors.append(f"{url}: md5 mismatch (expected {remote.md5})")
                continue
            tmp.replace(final)
            return final
        except (urllib.error.URLError, OSError, EOFError) as err:
            errors.append(f"{url}: {err}")
        finally:
            tmp.unlink(missing_ok=True)
    raise DatasetError(f"could not download {remote.name}:\n  " + "\n  ".join(errors))


def _matches(path: Path, remote: RemoteFile) -> bool:
    try:
        return md5_of(path, uncompressed=remote.md5_of_uncompressed) == remote.md5
    except (OSError, EOFError):
        # A corrupt gzip cannot match an md5 of its content.
        return False
