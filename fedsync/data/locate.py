"""Where dataset files are looked for, in order.

1. ``data_dir`` (the ``data-dir`` run config), as ``<data_dir>/<name>/`` and then as the
   dataset folder itself (so both ``data-dir = "~/datasets"`` and
   ``data-dir = "/usr/share/datasets/fashion-mnist"`` work). Because MNIST and
   Fashion-MNIST use the same file names, pointing ``data_dir`` straight at one of
   them while asking for the other loads the wrong one; the ``<name>/`` layout avoids
   that.
2. ``$FEDSYNC_DATA/<name>/``.
3. System folders a package manager fills (Debian's ``dataset-fashion-mnist`` puts the
   files in ``/usr/share/datasets/fashion-mnist/``).
4. The user cache, ``$XDG_CACHE_HOME/fedsync/<name>/`` (default ``~/.cache/fedsync/<name>``),
   which is also where :func:`fedsync.data.download.download_dataset` writes.

A folder only counts if it holds *every* file the dataset needs, so a train split is
never paired with a test split from somewhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedsync.data.types import DatasetNotFoundError

ENV_VAR = "FEDSYNC_DATA"
"""Environment variable naming a folder that holds one sub-folder per dataset."""


def cache_dir(name: str) -> Path:
    """The per-user cache folder of dataset ``name`` (it need not exist)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "fedsync" / name


def candidate_dirs(
    name: str, data_dir: str | os.PathLike[str] | None, system_dirs: Sequence[str] = ()
) -> list[Path]:
    """The folders searched for dataset ``name``, best first.

    Parameters
    ----------
    name : str
        Registry name of the dataset (also its sub-folder name).
    data_dir : str or path-like or None
        An explicit folder; empty string and ``None`` mean "not given".
    system_dirs : sequence of str
        Package-manager folders for this dataset.
    """
    dirs: list[Path] = []
    if data_dir:
        root = Path(data_dir).expanduser()
        dirs += [root / name, root]
    env = os.environ.get(ENV_VAR)
    if env:
        dirs.append(Path(env).expanduser() / name)
    dirs += [Path(d) for d in system_dirs]
    dirs.append(cache_dir(name))
    return dirs


def find_files(
    name: str,
    wanted: Mapping[str, Sequence[str]],
    data_dir: str | os.PathLike[str] | None,
    system_dirs: Sequence[str] = (),
) -> dict[str, Path]:
    """Find the first folder that holds every wanted file.

    Parameters
    ----------
    name : str
        Registry name of the dataset.
    wanted : mapping of str to sequence of str
        Logical file key to the file names accepted for it, preferred first
        (e.g. ``"train-images"`` to ``("train-images-idx3-ubyte.gz",
        "train-images-idx3-ubyte")``).
    data_dir : str or path-like or None
        An explicit folder, searched first.
    system_dirs : sequence of str
        Package-manager folders for this dataset.

    Returns
    -------
    dict of str to Path
        Logical key to the resolved file path.

    Raises
    ------
    DatasetNotFoundError
        When no folder holds all the files; the message lists every folder searched.
    """
    searched = candidate_dirs(name, data_dir, system_dirs)
    for folder in searched:
        found = _all_in(folder, wanted)
        if found is not None:
            return found
    listing = "\n  ".join(str(d) for d in searched)
    needed = ", ".join(names[0] for names in wanted.values())
    raise DatasetNotFoundError(
        f"dataset {name!r} not found: no folder holds all of [{needed}].\nSearched:\n  "
        f"{listing}\nSet the data-dir run config or ${ENV_VAR}, or call "
        f"load_dataset({name!r}, download=True) once while online."
    )


def _all_in(folder: Path, wanted: Mapping[str, Sequence[str]]) -> dict[str, Path] | None:
    if not folder.is_dir():
        return None
    found: dict[str, Path] = {}
    for key, file_names in wanted.items():
        path = next((folder / f for f in file_names if (folder / f).is_file()), None)
        if path is None:
            return None
        found[key] = path.resolve()
    return found
