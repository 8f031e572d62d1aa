"""Partitioning schemes and the per-client loader."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from fedsync.data import clear_caches, load_dataset, load_partition, partition_indices
from fedsync.data.partition import DirichletPartitioner, partition_schemes

LABELS = np.repeat(np.arange(10), 200)  # 2,000 samples, 10 balanced classes


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    clear_caches()


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every index 0..n-1 in exactly one partition; each partition sorted int64."""
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)
    merged = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    assert len(merged) == n
    np.testing.assert_array_equal(np.sort(merged), np.arange(n))


def label_skew(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean total-variation distance between each partition's labels and the global."""
    k = int(labels.max()) + 1
    pooled = np.bincount(labels, minlength=k) / len(labels)
    dist = [
        0.5 * np.abs(np.bincount(labels[p], minlength=k) / len(p) - pooled).sum()
        for p in parts
        if len(p)
    ]
    return float(np.mean(dist))


# --- iid -------------------------------------------------------------------------


def test_iid_balanced_cover() -> None:
    parts = partition_indices(LABELS, 7, "iid", seed=1)
    assert_exact_cover(parts, len(LABELS))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert label_skew(parts, LABELS) < 0.1


# --- dirichlet ---------------------------------------------------------------------


def test_dirichlet_cover_and_skew_grows_as_alpha_shrinks() -> None:
    skews = []
    for alpha in (100.0, 1.0, 0.1):
        parts = partition_indices(LABELS, 10, "dirichlet", alpha=alpha, seed=0)
        assert_exact_cover(parts, len(LABELS))
        skews.append(label_skew(parts, LABELS))
    assert skews[0] < 0.1 < skews[1] < skews[2]
    assert skews[2] > 0.5


@pytest.mark.timeout(10)
def test_dirichlet_tiny_alpha_many_clients_fails_fast_and_says_what_to_change() -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError, match="fewer partitions, a larger alpha, or a smaller min_size"):
        partition_indices(LABELS, 200, "dirichlet", alpha=0.01, seed=0, min_size=5)
    assert time.perf_counter() - start < 5.0


@pytest.mark.timeout(10)
def test_dirichlet_tiny_alpha_without_min_size_returns() -> None:
    parts = partition_indices(LABELS, 200, "dirichlet", alpha=0.01, seed=0, min_size=0)
    assert len(parts) == 200
    assert_exact_cover(parts, len(LABELS))


def test_dirichlet_rejects_bad_alpha() -> None:
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            DirichletPartitioner(alpha)


def test_dirichlet_retries_are_bounded() -> None:
    partitioner = DirichletPartitioner(0.01, min_size=1, max_tries=3)
    with pytest.raises(ValueError, match="in 3 draws"):
        partitioner.split(LABELS, 500, np.random.default_rng(0))


# --- shards ----------------------------------------------------------------------------


def test_shards_give_few_classes_each() -> None:
    parts = partition_indices(LABELS, 50, "shards", shards_per_client=2, seed=0)
    assert_exact_cover(parts, len(LABELS))
    # 100 shards of 20 samples over label-sorted data: each shard is one class.
    assert max(len(np.unique(LABELS[p])) for p in parts) <= 2
    assert {len(p) for p in parts} == {40}


def test_shards_too_many() -> None:
    with pytest.raises(ValueError, match="more than the"):
        partition_indices(np.zeros(10, dtype=np.int64), 6, "shards", shards_per_client=2)


# --- natural -----------------------------------------------------------------------------


GROUPS = np.array([2, 0, 1, 2, 2, 0, 3, 1, 3, 3])


def test_natural_one_partition_per_group() -> None:
    labels = np.zeros(len(GROUPS), dtype=np.int64)
    parts = partition_indices(labels, 4, "natural", groups=GROUPS)
    assert [p.tolist() for p in parts] == [[1, 5], [2, 7], [0, 3, 4], [6, 8, 9]]


def test_natural_fewer_partitions_merge_round_robin() -> None:
    labels = np.zeros(len(GROUPS), dtype=np.int64)
    parts = partition_indices(labels, 3, "natural", groups=GROUPS, seed=5)
    # groups 0 and 3 -> partition 0, group 1 -> 1, group 2 -> 2; the seed is irrelevant.
    assert [p.tolist() for p in parts] == [[1, 5, 6, 8, 9], [2, 7], [0, 3, 4]]
    other_seed = partition_indices(labels, 3, "natural", groups=GROUPS, seed=9)
    assert all(np.array_equal(a, b) for a, b in zip(parts, other_seed, strict=True))


def test_natural_more_partitions_than_groups() -> None:
    labels = np.zeros(len(GROUPS), dtype=np.int64)
    with pytest.raises(ValueError, match="4 groups, cannot make 5 partitions"):
        partition_indices(labels, 5, "natural", groups=GROUPS)


def test_natural_needs_groups() -> None:
    with pytest.raises(ValueError, match="needs per-sample groups"):
        partition_indices(LABELS, 2, "natural")


# --- common ------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_deterministic_per_seed(scheme: str) -> None:
    a = partition_indices(LABELS, 8, scheme, seed=11)
    b = partition_indices(LABELS, 8, scheme, seed=11)
    c = partition_indices(LABELS, 8, scheme, seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_unknown_scheme_lists_valid() -> None:
    assert partition_schemes() == ("dirichlet", "iid", "natural", "shards")
    with pytest.raises(ValueError, match="valid: dirichlet, iid, natural, shards"):
        partition_indices(LABELS, 2, "pathological-ish")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_partitions": 0}, "num_partitions"),
        ({"num_partitions": 2.5}, "num_partitions"),
        ({"num_partitions": 3000}, "cannot give 3000 partitions"),
        ({"num_partitions": 2, "seed": -1}, "seed"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition_indices(LABELS, **kwargs)  # type: ignore[arg-type]


# --- load_partition --------------------------------------------------------------------------


def test_load_partition_digits() -> None:
    train_total = len(load_dataset("digits").train)
    sizes = 0
    for pid in range(5):
        train, val = load_partition("digits", pid, 5, "dirichlet", alpha=0.5, seed=0)
        assert len(train) > 0
        assert len(val) == round((len(train) + len(val)) * 0.1)
        sizes += len(train) + len(val)
        assert not train.x.flags.writeable
    assert sizes == train_total


def test_load_partition_is_cached_and_deterministic() -> None:
    a = load_partition("digits", 1, 4, "iid", seed=3)
    assert load_partition("digits", 1, 4, "iid", seed=3) is a
    clear_caches()
    b = load_partition("digits", 1, 4, "iid", seed=3)
    assert b is not a
    np.testing.assert_array_equal(a[0].x, b[0].x)
    np.testing.assert_array_equal(a[1].y, b[1].y)


def test_load_partition_natural_synthetic() -> None:
    splits = load_dataset("synthetic", seed=0)
    assert splits.groups is not None
    train, val = load_partition("synthetic", 4, 30, "natural", seed=0)
    assert len(train) + len(val) == int(np.sum(splits.groups == 4))


def test_load_partition_bad_id() -> None:
    with pytest.raises(ValueError, match="partition_id"):
        load_partition("digits", 5, 5)
