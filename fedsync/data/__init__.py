"""Datasets, partitions and the arrays they travel in.

Everything loads offline: scikit-learn's bundled digits, MNIST and Fashion-MNIST from
their IDX files, Tiny Shakespeare from its text file, and FedProx's synthetic data from
a seeded generator. Downloads happen only when asked for (``download=True``).

The app's entry points:

* :func:`load_dataset` -- train/test splits of a dataset, cached per process;
* :func:`load_partition` -- one client's (train, validation) share, cached per process;
* :func:`partition_indices` -- the partitioning itself, for any label array.
"""

from fedsync.data.idx import read_idx
from fedsync.data.partition import (
    Partitioner,
    PartitionOptions,
    load_partition,
    make_partitioner,
    partition_indices,
    partition_schemes,
)
from fedsync.data.partition import clear_cache as _clear_partitions
from fedsync.data.registry import (
    DatasetInfo,
    dataset_info,
    dataset_names,
    download_dataset,
    load_dataset,
    locate_dataset,
)
from fedsync.data.registry import clear_cache as _clear_datasets
from fedsync.data.types import (
    ArrayDataset,
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    DatasetSplits,
    UnknownDatasetError,
)

__all__ = [
    "ArrayDataset",
    "DatasetError",
    "DatasetFormatError",
    "DatasetInfo",
    "DatasetNotFoundError",
    "DatasetSplits",
    "PartitionOptions",
    "Partitioner",
    "UnknownDatasetError",
    "clear_caches",
    "dataset_info",
    "dataset_names",
    "download_dataset",
    "load_dataset",
    "load_partition",
    "locate_dataset",
    "make_partitioner",
    "partition_indices",
    "partition_schemes",
    "read_idx",
]


def clear_caches() -> None:
    """Forget every cached dataset and partition in this process."""
    _clear_partitions()
    _clear_datasets()
