"""The dataset registry and :func:`load_dataset`, the one way data is loaded.

Each entry says which files a dataset needs (none for generated or bundled data), where
a package manager puts them, how to build the splits and which model suits it. Loading
first *locates* the files (cheap: a few ``stat`` calls) and then builds the splits
through a per-process cache keyed by the files actually found, so the Flower ClientApp
can call :func:`load_dataset` every round without re-reading anything, and a change of
``data_dir`` or ``$FEDSYNC_DATA`` is never answered from a stale cache entry.

A name with a ``:`` is the import path of the user's own loader,
``"package.module:loader"`` (see :mod:`fedsync.plugins`), called as
``loader(*, seed, data_dir)`` and returning :class:`DatasetSplits`; it is imported in the
calling process and its splits go through the same per-process, read-only cache.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsync.data import mnist, shakespeare
from fedsync.data.digits import load_digits
from fedsync.data.download import RemoteFile, download_files
from fedsync.data.locate import cache_dir, find_files
from fedsync.data.synthetic import load_synthetic
from fedsync.data.types import (
    DatasetError,
    DatasetNotFoundError,
    DatasetSplits,
    UnknownDatasetError,
)
from fedsync.plugins import check_signature, is_import_path, load_callable

Builder = Callable[..., DatasetSplits]
"""``builder(files, **kwargs) -> DatasetSplits``; ``files`` maps logical keys to paths."""


@dataclass(frozen=True)
class LocalTraining:
    """A dataset's local-training defaults: what ``learning-rate = 0``, ``local-epochs =
    0`` and ``partitioning = "auto"`` in the run config stand for.

    Chosen by measurement (``benchmarks/dataset_defaults.py``: the app's quickstart
    settings, 10 simulated devices, fedsync's TEASQ mode and FedAvg; results in
    ``benchmarks/results/dataset_defaults.json``), for local SGD with momentum 0.9 and
    batch 32; with ``client-optimizer = "adamw"`` the learning rate is
    :data:`ADAMW_LEARNING_RATE` for every dataset.

    Parameters
    ----------
    learning_rate : float
        Local SGD learning rate.
    local_epochs : int
        Local epochs per task.
    partitioning : str
        How the data is split across clients.
    """

    learning_rate: float
    local_epochs: int
    partitioning: str = "dirichlet"


ADAMW_LEARNING_RATE = 1e-3
"""The learning rate ``learning-rate = 0`` means with ``client-optimizer = "adamw"``."""

DEFAULT_TRAINING = LocalTraining(learning_rate=0.1, local_epochs=3)
"""The defaults of a dataset whose entry names none (the app's defaults before the
per-dataset table)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry knows about one dataset.

    Parameters
    ----------
    name : str
        Registry name (also the sub-folder searched for its files, unless ``folder``).
    build : callable
        ``build(files, **kwargs)`` returning the splits.
    default_model : str
        Model registry name used when the run config says ``model = "auto"``.
    description : str
        One line for listings and error messages.
    files : mapping of str to tuple of str
        Logical file key to accepted file names; empty for bundled/generated data.
    system_dirs : tuple of str
        Folders a package manager installs the files to.
    remote : tuple of RemoteFile
        Where ``download=True`` fetches the files from.
    uses_seed : bool
        Whether ``seed`` changes the data (a split or a generator); if not, all seeds
        share one cache entry.
    defaults : mapping
        Fixed keyword arguments for ``build`` (variants of one generator).
    training : LocalTraining
        What the run config's ``auto`` training keys mean for this dataset.
    external : bool
        ``build`` is a user's loader named by import path, called as
        ``build(seed=..., data_dir=..., **options)``; such an entry has no files and no
        default model (``default_model`` is empty).
    folder : str
        The sub-folder its files are searched for and downloaded to, when another
        entry's (a second task on the same files); empty: ``name``.
    """

    name: str
    build: Builder
    default_model: str
    description: str
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    system_dirs: tuple[str, ...] = ()
    remote: tuple[RemoteFile, ...] = ()
    uses_seed: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    training: LocalTraining = DEFAULT_TRAINING
    external: bool = False
    folder: str = ""

    @property
    def files_folder(self) -> str:
        """The sub-folder its files are searched for and downloaded to."""
        return self.folder or self.name


def _synthetic(name: str, label: str, **fixed: Any) -> DatasetInfo:
    return DatasetInfo(
        name=name,
        build=load_synthetic,
        default_model="logreg",
        description=f"FedProx Synthetic({label}): 60 features, 10 classes, 30 natural clients",
        uses_seed=True,
        defaults=fixed,
        training=SYNTHETIC_TRAINING,
    )


IMAGE_TRAINING = LocalTraining(learning_rate=0.05, local_epochs=1)
"""MNIST and Fashion-MNIST (LeNet-5)."""
SYNTHETIC_TRAINING = LocalTraining(learning_rate=0.1, local_epochs=1, partitioning="natural")
"""The FedProx synthetic sets (logistic regression), split by generating client."""

_REGISTRY: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            name="digits",
            build=load_digits,
            default_model="mlp",
            description="scikit-learn 8x8 digits, 1,797 images (bundled, no download)",
            uses_seed=True,
            training=DEFAULT_TRAINING,
        ),
        DatasetInfo(
            name="mnist",
            build=mnist.load_mnist,
            default_model="cnn",
            description="MNIST handwritten digits, 60k/10k 28x28",
            files=mnist.idx_file_names(),
            remote=mnist.mnist_remote_files(),
            training=IMAGE_TRAINING,
        ),
        DatasetInfo(
            name="fashion-mnist",
            build=mnist.load_fashion_mnist,
            default_model="cnn",
            description="Zalando Fashion-MNIST, 60k/10k 28x28",
            files=mnist.idx_file_names(),
            system_dirs=("/usr/share/datasets/fashion-mnist",),
            remote=mnist.fashion_remote_files(),
            training=IMAGE_TRAINING,
        ),
        DatasetInfo(
            name="shakespeare",
            build=shakespeare.load_shakespeare,
            default_model="char-lstm-small",
            description="Tiny Shakespeare next-character prediction, one client per role",
            files={"text": shakespeare.FILE_NAMES},
            remote=shakespeare.REMOTE_FILES,
            training=LocalTraining(learning_rate=0.1, local_epochs=1, partitioning="natural"),
        ),
        # Language modelling: every position predicts the next character, windows of
        # 128 that do not overlap (each character is a target once), as many as the
        # text holds (about 7,900 train windows, 1.0M target characters).
        DatasetInfo(
            name="shakespeare-lm",
            build=shakespeare.load_shakespeare,
            default_model="char-gpt",
            description="Tiny Shakespeare language modelling (every position), one client per role",
            files={"text": shakespeare.FILE_NAMES},
            remote=shakespeare.REMOTE_FILES,
            defaults={"targets": "sequence", "seq_len": 128, "stride": 128, "max_windows": 1 << 20},
            folder="shakespeare",
            training=LocalTraining(learning_rate=0.1, local_epochs=1, partitioning="natural"),
        ),
        # "synthetic" takes alpha/beta as options (default 1, 1); the variants fix them
        # so a run config can name the paper's settings with the dataset key alone.
        _synthetic("synthetic", "alpha, beta; default 1, 1"),
        _synthetic("synthetic-0-0", "0, 0", alpha=0.0, beta=0.0),
        _synthetic("synthetic-0.5-0.5", "0.5, 0.5", alpha=0.5, beta=0.5),
        _synthetic("synthetic-1-1", "1, 1", alpha=1.0, beta=1.0),
        _synthetic("synthetic-iid", "IID", iid=True),
    )
}


def normalize_name(name: str) -> str:
    """Registry spelling of a dataset name: lower case, ``_`` read as ``-``."""
    return name.strip().lower().replace("_", "-")


def dataset_names() -> tuple[str, ...]:
    """Every registered dataset name, sorted."""
    return tuple(sorted(_REGISTRY))


def dataset_info(name: str) -> DatasetInfo:
    """Look a dataset up by name, or import the loader an import path names.

    For ``"package.module:loader"`` the entry is made on the spot (no files, no default
    model, :data:`DEFAULT_TRAINING`, ``external=True``) after checking that the loader
    imports and takes ``(*, seed, data_dir)``.

    Raises
    ------
    UnknownDatasetError
        For an unknown name; the message lists the valid ones.
    fedsync.plugins.PluginError
        For an import path that does not resolve to such a loader.
    """
    if is_import_path(name):
        path = name.strip()
        loader = load_callable(path, "dataset", "loader(*, seed, data_dir)", seed=0, data_dir=None)
        return DatasetInfo(
            name=path,
            build=loader,
            default_model="",
            description=f"loaded by {path}",
            uses_seed=True,
            external=True,
        )
    info = _REGISTRY.get(normalize_name(name))
    if info is None:
        raise UnknownDatasetError(
            f"unknown dataset {name!r}; valid names: {', '.join(dataset_names())} "
            "(or a loader's import path, 'package.module:loader')"
        )
    return info


def locate_dataset(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, download: bool = False
) -> dict[str, Path]:
    """Find (and with ``download=True``, fetch if missing) the files of a dataset.

    Returns an empty dict for datasets that need no files. See
    :mod:`fedsync.data.locate` for the search order.
    """
    info = dataset_info(name)
    if not info.files:
        return {}
    try:
        return find_files(info.files_folder, info.files, data_dir, info.system_dirs)
    except DatasetNotFoundError:
        if not download:
            raise
    download_dataset(info.name, data_dir)
    return find_files(info.files_folder, info.files, data_dir, info.system_dirs)


def download_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Download a dataset's files, md5-checked, into ``<data_dir>/<name>`` or the cache.

    Only ever runs when called; nothing in fedsync calls it implicitly.
    """
    info = dataset_info(name)
    if info.external:
        raise DatasetError(f"dataset {info.name!r} has its own loader: fedsync downloads nothing")
    folder = info.files_folder
    target = Path(data_dir).expanduser() / folder if data_dir else cache_dir(folder)
    download_files(info.remote, target)
    return target


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    download: bool = False,
    **options: Hashable,
) -> DatasetSplits:
    """Load a dataset's train/test splits (cached per process).

    Parameters
    ----------
    name : str
        A registry name, see :func:`dataset_names` (``_`` and ``-`` are alike), or the
        import path of a loader, ``"package.module:loader"``, called as
        ``loader(seed=seed, data_dir=data_dir, **options)``.
    data_dir : str or path-like, optional
        Folder searched first (the ``data-dir`` run config); ``""`` means not given.
        A loader gets it as a string, or ``None``.
    seed : int
        Seed for datasets whose split or content is random (digits, synthetic).
    download : bool
        Fetch missing files from the official sources. Off by default: nothing is
        downloaded unless asked.
    **options
        Dataset-specific settings (e.g. ``min_speeches=5`` for shakespeare,
        ``num_clients=100`` for synthetic). Must be hashable.

    Returns
    -------
    DatasetSplits
        Shared, read-only arrays: copy before editing in place.

    Raises
    ------
    UnknownDatasetError
        Unknown name.
    fedsync.plugins.PluginError
        An import path that does not resolve to a loader.
    DatasetNotFoundError
        Files not found anywhere (the message lists where it looked).
    DatasetFormatError
        Files found but malformed.
    DatasetError
        A loader that returns no :class:`DatasetSplits`.
    """
    info = dataset_info(name)
    if info.external:
        return _load_external(
            info.build,
            info.name,
            str(data_dir) if data_dir else None,
            seed,
            tuple(sorted(options.items())),
        )
    files = locate_dataset(info.name, data_dir, download=download)
    return _load_cached(
        info.name,
        tuple(sorted((key, str(path)) for key, path in files.items())),
        seed if info.uses_seed else 0,
        tuple(sorted(options.items())),
    )


@functools.lru_cache(maxsize=16)
def _load_cached(
    name: str,
    files: tuple[tuple[str, str], ...],
    seed: int,
    options: tuple[tuple[str, Hashable], ...],
) -> DatasetSplits:
    info = _REGISTRY[name]
    _check_options(info, options)
    kwargs: dict[str, Any] = {**info.defaults, **dict(options)}
    if info.uses_seed:
        kwargs["seed"] = seed
    splits = info.build({key: Path(path) for key, path in files}, **kwargs)
    return dataclasses.replace(splits, name=name).read_only()


@functools.lru_cache(maxsize=16)
def _load_external(
    loader: Builder,
    name: str,
    data_dir: str | None,
    seed: int,
    options: tuple[tuple[str, Hashable], ...],
) -> DatasetSplits:
    # Keyed by the loader object as well as its path: a module imported afresh (a test,
    # a reload) is a new loader, never answered with the old one's splits.
    kwargs = dict(options)
    check_signature(
        loader,
        name,
        "dataset",
        "loader(*, seed, data_dir, **options)",
        **{**kwargs, "seed": seed, "data_dir": data_dir},
    )
    splits = loader(seed=seed, data_dir=data_dir, **kwargs)
    if not isinstance(splits, DatasetSplits):
        raise DatasetError(
            f"dataset {name!r} returned a {type(splits).__name__}, not fedsync.data.DatasetSplits"
        )
    return dataclasses.replace(splits, name=name).read_only()


def _check_options(info: DatasetInfo, options: tuple[tuple[str, Hashable], ...]) -> None:
    # Checked against the builder's signature rather than by catching TypeError, which
    # would also swallow genuine bugs inside the builder. A variant's fixed settings
    # (``defaults``) and the seed are not options.
    params = inspect.signature(info.build).parameters.values()
    accepted = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    accepted -= {*info.defaults, "seed"}
    unknown = sorted({key for key, _ in options} - accepted)
    if unknown:
        raise DatasetError(
            f"dataset {info.name!r} has no option(s) {unknown}; valid: {sorted(accepted) or 'none'}"
        )


def clear_cache() -> None:
    """Forget every cached dataset (tests; freeing memory in long-lived processes)."""
    _load_cached.cache_clear()
    _load_external.cache_clear()
