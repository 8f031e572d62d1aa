"""Splitting a dataset across clients: IID, Dirichlet label skew, shards, natural groups.

Why these are written here rather than taken from Flower Datasets (``flwr-datasets``):
that package is not installed, and it pulls in Hugging Face ``datasets`` (with pyarrow,
fsspec and a download-and-cache layer built around the Hub) to partition data that
fedsync already holds as in-memory numpy arrays and must load offline. Each scheme
here is a few dozen lines over a label array, keeps the core free of Flower imports,
and is deterministic given its seed -- which matters because every ClientApp process
recomputes the split and all of them must agree on who holds which sample.

Every scheme assigns every sample to exactly one partition. Partitions are returned as
sorted int64 index arrays into the train split.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedsync.data.registry import load_dataset
from fedsync.data.types import ArrayDataset, DatasetSplits

DEFAULT_MAX_TRIES = 100
"""Dirichlet draws before giving up on giving every partition ``min_size`` samples."""


@dataclass(frozen=True, eq=False)
class PartitionOptions:
    """Settings any scheme may read; each scheme takes the ones it needs.

    Parameters
    ----------
    alpha : float
        Dirichlet concentration (smaller = more label skew).
    shards_per_client : int
        Label-sorted shards per partition for ``shards``.
    groups : numpy.ndarray or None
        Group id per sample for ``natural``.
    min_size : int
        Fewest samples any partition may get.
    """

    alpha: float = 0.5
    shards_per_client: int = 2
    groups: np.ndarray | None = None
    min_size: int = 1


class Partitioner(ABC):
    """Splits sample indices into ``num_partitions`` disjoint sets covering them all."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_options(cls, options: PartitionOptions) -> Partitioner:
        """Build the partitioner from the settings it uses."""

    @abstractmethod
    def split(
        self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Return one index array per partition."""


class IidPartitioner(Partitioner):
    """A uniform random split into near-equal sizes (they differ by at most one)."""

    name = "iid"

    @classmethod
    def from_options(cls, options: PartitionOptions) -> IidPartitioner:
        return cls()

    def split(
        self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        return list(np.array_split(rng.permutation(len(labels)), num_partitions))


class DirichletPartitioner(Partitioner):
    """Label skew: each class is spread over partitions by a Dirichlet(alpha) draw.

    Small ``alpha`` leaves some partitions with (almost) nothing. The draw is repeated
    until every partition has ``min_size`` samples, but at most ``max_tries`` times:
    unbounded resampling is a known way for this scheme to hang at small alpha.

    Parameters
    ----------
    alpha : float
        Concentration, > 0.
    min_size : int
        Fewest samples a partition may get, >= 0.
    max_tries : int
        Draws before raising :class:`ValueError`.
    """

    name = "dirichlet"

    def __init__(self, alpha: float, *, min_size: int = 1, max_tries: int = DEFAULT_MAX_TRIES):
        if not alpha > 0 or not np.isfinite(alpha):
            raise ValueError(f"dirichlet alpha must be a positive number, got {alpha}")
        if min_size < 0:
            raise ValueError(f"min_size must be >= 0, got {min_size}")
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        self.alpha = float(alpha)
        self.min_size = int(min_size)
        self.max_tries = int(max_tries)

    @classmethod
    def from_options(cls, options: PartitionOptions) -> DirichletPartitioner:
        return cls(options.alpha, min_size=options.min_size)

    def split(
        self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        # Per try: assign an owner to every sample (O(n)), and only materialise the
        # index lists once a draw is accepted, so 100 tries stay cheap.
        by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
        order = np.concatenate(by_class) if by_class else np.zeros(0, dtype=np.int64)
        concentration = np.full(num_partitions, self.alpha)
        smallest = 0
        for _ in range(self.max_tries):
            owner = np.concatenate(
                [self._owners(len(idx), concentration, rng) for idx in by_class]
                or [np.zeros(0, dtype=np.int64)]
            )
            sizes = np.bincount(owner, minlength=num_partitions)
            if sizes.min() >= self.min_size:
                return _group_by(order, owner, num_partitions)
            smallest = max(smallest, int(sizes.min()))
        raise ValueError(
            f"dirichlet(alpha={self.alpha:g}) could not give each of {num_partitions} "
            f"partitions >= {self.min_size} samples of {len(labels)} in {self.max_tries} "
            f"draws (best smallest partition: {smallest}); use fewer partitions, a larger "
            "alpha, or a smaller min_size"
        )

    @staticmethod
    def _owners(n: int, concentration: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Partition id of each of ``n`` samples of one class, contiguous runs."""
        shares = rng.dirichlet(concentration)
        # Floored cumulative cut points; the last is n, so counts sum to n exactly.
        cuts = np.floor(np.cumsum(shares) * n).astype(np.int64)
        cuts[-1] = n
        counts = np.diff(cuts, prepend=0).clip(min=0)
        return np.repeat(np.arange(len(concentration)), counts)


class ShardPartitioner(Partitioner):
    """The pathological split of McMahan et al.: sort by label, cut into
    ``num_partitions * shards_per_client`` equal shards, deal each partition
    ``shards_per_client`` random shards (so it sees about that many classes)."""

    name = "shards"

    def __init__(self, shards_per_client: int) -> None:
        if shards_per_client < 1:
            raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
        self.shards_per_client = int(shards_per_client)

    @classmethod
    def from_options(cls, options: PartitionOptions) -> ShardPartitioner:
        return cls(options.shards_per_client)

    def split(
        self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        num_shards = num_partitions * self.shards_per_client
        if num_shards > len(labels):
            raise ValueError(
                f"shards: {num_partitions} partitions x {self.shards_per_client} shards = "
                f"{num_shards} shards, more than the {len(labels)} samples; use fewer "
                "partitions or shards_per_client"
            )
        # Shuffle first so the stable sort breaks ties (same label) at random.
        shuffled = rng.permutation(len(labels))
        by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
        shards = np.array_split(by_label, num_shards)
        dealt = rng.permutation(num_shards).reshape(num_partitions, self.shards_per_client)
        return [np.concatenate([shards[s] for s in row]) for row in dealt]


class NaturalPartitioner(Partitioner):
    """One partition per natural group (speaker, device, generating client).

    With fewer partitions than groups, groups are dealt round-robin in id order
    (partition ``k`` gets groups ``k, k + P, k + 2P, ...``), which needs no seed.
    """

    name = "natural"

    def __init__(self, groups: np.ndarray | None) -> None:
        if groups is None:
            raise ValueError(
                "natural partitioning needs per-sample groups; this dataset has none "
                "(use iid, dirichlet or shards)"
            )
        self.groups = np.asarray(groups)

    @classmethod
    def from_options(cls, options: PartitionOptions) -> NaturalPartitioner:
        return cls(options.groups)

    def split(
        self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        if self.groups.shape != labels.shape:
            raise ValueError(f"groups has shape {self.groups.shape} but labels {labels.shape}")
        ids, rank = np.unique(self.groups, return_inverse=True)
        if num_partitions > len(ids):
            raise ValueError(
                f"natural partitioning: the data has {len(ids)} groups, cannot make "
                f"{num_partitions} partitions; use at most {len(ids)} or another scheme"
            )
        return _group_by(np.arange(len(labels)), rank.reshape(-1) % num_partitions, num_partitions)


_SCHEMES: dict[str, type[Partitioner]] = {
    cls.name: cls
    for cls in (IidPartitioner, DirichletPartitioner, ShardPartitioner, NaturalPartitioner)
}


def partition_schemes() -> tuple[str, ...]:
    """Every partitioning scheme name, sorted."""
    return tuple(sorted(_SCHEMES))


def make_partitioner(scheme: str, options: PartitionOptions | None = None) -> Partitioner:
    """Build the partitioner of a scheme name (case-insensitive).

    Raises
    ------
    ValueError
        Unknown scheme (the message lists the valid ones) or bad settings.
    """
    cls = _SCHEMES.get(scheme.strip().lower())
    if cls is None:
        raise ValueError(
            f"unknown partitioning {scheme!r}; valid: {', '.join(partition_schemes())}"
        )
    return cls.from_options(options or PartitionOptions())


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    groups: np.ndarray | None = None,
    seed: int = 0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Split sample indices ``0 .. len(labels) - 1`` into ``num_partitions`` sets.

    Parameters
    ----------
    labels : numpy.ndarray
        Integer class label per sample, 1-D.
    num_partitions : int
        Number of partitions, >= 1.
    scheme : {"iid", "dirichlet", "shards", "natural"}
        How to split.
    alpha : float
        Dirichlet concentration (``dirichlet`` only).
    shards_per_client : int
        Shards per partition (``shards`` only).
    groups : numpy.ndarray, optional
        Group id per sample (``natural`` only).
    seed : int
        Same seed, same partitions (>= 0).
    min_size : int
        Fewest samples any partition may get.

    Returns
    -------
    list of numpy.ndarray
        ``num_partitions`` sorted int64 index arrays; together they hold every index
        exactly once.

    Raises
    ------
    ValueError
        Bad arguments, or no split meets ``min_size`` (the message says what to change).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if isinstance(num_partitions, bool) or int(num_partitions) != num_partitions:
        raise ValueError(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if len(labels) < num_partitions * min_size:
        raise ValueError(
            f"{len(labels)} samples cannot give {num_partitions} partitions {min_size}+ "
            "samples each; use fewer partitions or a smaller min_size"
        )
    options = PartitionOptions(alpha, shards_per_client, groups, min_size)
    partitioner = make_partitioner(scheme, options)
    parts = partitioner.split(labels, int(num_partitions), np.random.default_rng(seed))
    parts = [np.sort(p).astype(np.int64, copy=False) for p in parts]
    small = [k for k, p in enumerate(parts) if len(p) < min_size]
    if small:
        raise ValueError(
            f"{partitioner.name}: partitions {small[:10]} have fewer than {min_size} "
            "samples; use fewer partitions or a smaller min_size"
        )
    return parts


def load_partition(
    dataset: str,
    partition_id: int,
    num_partitions: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 0,
    data_dir: str | None = None,
    val_fraction: float = 0.1,
    min_size: int = 1,
    **dataset_options: Any,
) -> tuple[ArrayDataset, ArrayDataset]:
    """One client's (train, validation) data, cached per process.

    The dataset's train split is partitioned with :func:`partition_indices` (the same
    result on every process for the same arguments), then partition ``partition_id``
    is split again: a seeded ``val_fraction`` of it (rounded, and never all of it)
    is held out for local validation.

    Parameters
    ----------
    dataset : str
        Registry name, see :func:`fedsync.data.dataset_names`.
    partition_id : int
        Which partition, ``0 <= partition_id < num_partitions``.
    num_partitions : int
        How many partitions the train split is cut into.
    scheme, alpha, shards_per_client, seed, min_size
        As for :func:`partition_indices`; ``seed`` also seeds the dataset's own
        randomness and the validation hold-out.
    data_dir : str, optional
        As for :func:`fedsync.data.load_dataset`.
    val_fraction : float
        Share of the partition held out, in ``[0, 1)``.
    **dataset_options
        Passed to :func:`fedsync.data.load_dataset`.

    Returns
    -------
    tuple of ArrayDataset
        Read-only ``(train, validation)``; validation may be empty for tiny partitions.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions}), got {partition_id}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    splits = load_dataset(dataset, data_dir, seed=seed, **dataset_options)
    return _local_split(
        splits,
        int(partition_id),
        int(num_partitions),
        scheme.strip().lower(),
        float(alpha),
        int(shards_per_client),
        int(seed),
        int(min_size),
        float(val_fraction),
    )


@functools.lru_cache(maxsize=32)
def _partitions(
    splits: DatasetSplits,
    num_partitions: int,
    scheme: str,
    alpha: float,
    shards_per_client: int,
    seed: int,
    min_size: int,
) -> tuple[np.ndarray, ...]:
    # Keyed by the (cached, identity-hashed) splits object: every client of a process
    # shares one partitioning instead of recomputing it per partition id.
    labels = splits.train.y
    if labels.ndim == 2:
        # Sequence targets (a language model's): there is no one label per sample to
        # skew by, only positions; iid and natural splits need none.
        if scheme not in ("iid", "natural"):
            raise ValueError(
                f"{splits.name}: partitioning {scheme!r} skews labels, but its samples "
                "have a target per position; use 'iid' or 'natural'"
            )
        labels = np.zeros(len(labels), dtype=np.int64)
    parts = partition_indices(
        labels,
        num_partitions,
        scheme,
        alpha=alpha,
        shards_per_client=shards_per_client,
        groups=splits.groups,
        seed=seed,
        min_size=min_size,
    )
    return tuple(parts)


@functools.lru_cache(maxsize=256)
def _local_split(
    splits: DatasetSplits,
    partition_id: int,
    num_partitions: int,
    scheme: str,
    alpha: float,
    shards_per_client: int,
    seed: int,
    min_size: int,
    val_fraction: float,
) -> tuple[ArrayDataset, ArrayDataset]:
    parts = _partitions(splits, num_partitions, scheme, alpha, shards_per_client, seed, min_size)
    indices = parts[partition_id]
    # A stream of its own per (partition, partitioning), so a client's hold-out does not
    # depend on which other clients this process happened to serve first.
    rng = np.random.default_rng([seed, partition_id, num_partitions])
    shuffled = rng.permutation(indices)
    n_val = min(round(len(indices) * val_fraction), max(len(indices) - 1, 0))
    val, train = np.sort(shuffled[:n_val]), np.sort(shuffled[n_val:])
    return splits.train.subset(train).read_only(), splits.train.subset(val).read_only()


def clear_cache() -> None:
    """Forget cached partitions (tests; freeing memory)."""
    _local_split.cache_clear()
    _partitions.cache_clear()


def _group_by(items: np.ndarray, owner: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """Split ``items`` by the partition id in ``owner`` (same length)."""
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=num_partitions))[:-1]
    return list(np.split(items[order], bounds))
