"""The shapes data takes in fedsync: in-memory arrays, dataset splits, typed errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DatasetError(ValueError):
    """A dataset is missing, malformed or asked for in a way that cannot work."""


class UnknownDatasetError(DatasetError, KeyError):
    """A dataset name that the registry does not know.

    Subclasses :class:`KeyError` too, so code that looks names up in a dict-like way
    can catch it the usual way.
    """

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument; the message reads better plain.
        return str(self.args[0]) if self.args else ""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The files of a dataset are not in any of the places searched."""


class DatasetFormatError(DatasetError):
    """A data file exists but its content is wrong (bad header, truncated, ...).

    Parameters
    ----------
    path : str or Path
        The file at fault.
    fault : str
        What is wrong with it, in words.
    """

    def __init__(self, path: str | Path, fault: str) -> None:
        self.path = Path(path)
        self.fault = fault
        super().__init__(f"{self.path}: {fault}")


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Samples and integer labels held as numpy arrays.

    Parameters
    ----------
    x : numpy.ndarray
        Inputs, first axis = samples: float32 images or features, or integer token ids.
    y : numpy.ndarray
        Class labels, int64: shape ``(N,)``, or ``(N, T)`` for a language model's
        targets at every one of a sample's ``T`` positions.
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.y.ndim not in (1, 2):
            raise DatasetError(f"labels must be (N,) or (N, T), got shape {self.y.shape}")
        if self.y.dtype != np.int64:
            raise DatasetError(f"labels must be int64, got {self.y.dtype}")
        if self.x.shape[0] != self.y.shape[0]:
            raise DatasetError(
                f"x has {self.x.shape[0]} samples but y has {self.y.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        """Return the samples at ``indices`` as a new (copied) dataset."""
        return ArrayDataset(self.x[indices], self.y[indices])

    def read_only(self) -> ArrayDataset:
        """Return a view whose arrays cannot be written.

        Cached datasets are shared by every caller in the process; a read-only view
        turns an accidental in-place edit into an error instead of silent corruption.
        """
        return ArrayDataset(_read_only(self.x), _read_only(self.y))


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A dataset as fedsync uses it: train and test splits plus what a model needs.

    Parameters
    ----------
    train, test : ArrayDataset
        The splits. Partitions are cut from ``train``; ``test`` is the central test set.
    num_classes : int
        Number of output classes (the vocabulary size for next-character prediction).
    input_shape : tuple of int
        Shape of one sample of ``x``.
    groups : numpy.ndarray or None
        For datasets with a natural partition, the group (speaker, generated client)
        of each *train* sample, int64 ids ``0 .. G-1``; ``None`` otherwise.
    name : str
        The registry name of the dataset.
    group_names : tuple of str or None
        A readable name per group id, when ``groups`` is set.
    class_names : tuple of str or None
        A readable name per class (the characters of a vocabulary, garment names).
    """

    train: ArrayDataset
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]
    groups: np.ndarray | None
    name: str
    group_names: tuple[str, ...] | None = None
    class_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for split_name, split in (("train", self.train), ("test", self.test)):
            if tuple(split.x.shape[1:]) != tuple(self.input_shape):
                raise DatasetError(
                    f"{self.name}: {split_name} samples have shape {split.x.shape[1:]}, "
                    f"expected {self.input_shape}"
                )
        if self.groups is not None and self.groups.shape != (len(self.train),):
            raise DatasetError(
                f"{self.name}: groups has shape {self.groups.shape}, expected ({len(self.train)},)"
            )
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise DatasetError(
                f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes"
            )

    @property
    def num_groups(self) -> int:
        """Number of natural groups (0 when the dataset has none)."""
        return 0 if self.groups is None else int(self.groups.max(initial=-1)) + 1

    def read_only(self) -> DatasetSplits:
        """Return a copy of the record whose arrays are read-only views."""
        return DatasetSplits(
            train=self.train.read_only(),
            test=self.test.read_only(),
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            groups=None if self.groups is None else _read_only(self.groups),
            name=self.name,
            group_names=self.group_names,
            class_names=self.class_names,
        )


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
