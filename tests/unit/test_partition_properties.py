"""Property tests: every scheme covers every sample exactly once, deterministically."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.data import partition_indices


@st.composite
def labelled_problems(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    n = draw(st.integers(1, 400))
    num_classes = draw(st.integers(1, 12))
    labels = np.asarray(draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)))
    num_partitions = draw(st.integers(1, min(n, 40)))
    seed = draw(st.integers(0, 2**32 - 1))
    return labels.astype(np.int64), num_partitions, seed


def check_cover(parts: list[np.ndarray], n: int, num_partitions: int) -> None:
    assert len(parts) == num_partitions
    merged = np.concatenate(parts)
    assert merged.dtype == np.int64
    assert len(merged) == n  # nothing lost, nothing twice ...
    assert np.array_equal(np.sort(merged), np.arange(n))  # ... and nothing invented
    for part in parts:
        assert np.all(np.diff(part) > 0)


@settings(max_examples=60, deadline=None)
@given(problem=labelled_problems())
def test_iid_cover(problem: tuple[np.ndarray, int, int]) -> None:
    labels, num_partitions, seed = problem
    parts = partition_indices(labels, num_partitions, "iid", seed=seed)
    check_cover(parts, len(labels), num_partitions)
    assert min(len(p) for p in parts) >= 1


@settings(max_examples=60, deadline=None)
@given(problem=labelled_problems(), alpha=st.floats(0.01, 100.0), min_size=st.integers(0, 3))
def test_dirichlet_cover_or_clear_error(
    problem: tuple[np.ndarray, int, int], alpha: float, min_size: int
) -> None:
    labels, num_partitions, seed = problem
    try:
        parts = partition_indices(
            labels, num_partitions, "dirichlet", alpha=alpha, seed=seed, min_size=min_size
        )
    except ValueError as err:
        assert "fewer partitions" in str(err)
        assert min_size > 0  # with min_size 0 every draw is acceptable
        return
    check_cover(parts, len(labels), num_partitions)
    assert min(len(p) for p in parts) >= min_size
    again = partition_indices(
        labels, num_partitions, "dirichlet", alpha=alpha, seed=seed, min_size=min_size
    )
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@settings(max_examples=60, deadline=None)
@given(problem=labelled_problems(), shards_per_client=st.integers(1, 4))
def test_shards_cover(problem: tuple[np.ndarray, int, int], shards_per_client: int) -> None:
    labels, num_partitions, seed = problem
    if num_partitions * shards_per_client > len(labels):
        with pytest.raises(ValueError, match="shards"):
            partition_indices(
                labels, num_partitions, "shards", shards_per_client=shards_per_client, seed=seed
            )
        return
    parts = partition_indices(
        labels, num_partitions, "shards", shards_per_client=shards_per_client, seed=seed
    )
    check_cover(parts, len(labels), num_partitions)


@settings(max_examples=60, deadline=None)
@given(problem=labelled_problems(), num_groups=st.integers(1, 30), data=st.data())
def test_natural_cover(
    problem: tuple[np.ndarray, int, int], num_groups: int, data: st.DataObject
) -> None:
    labels, num_partitions, seed = problem
    groups = np.asarray(
        data.draw(
            st.lists(st.integers(0, num_groups - 1), min_size=len(labels), max_size=len(labels))
        )
    )
    present = len(np.unique(groups))
    if num_partitions > present:
        with pytest.raises(ValueError, match="groups"):
            partition_indices(labels, num_partitions, "natural", groups=groups, seed=seed)
        return
    parts = partition_indices(labels, num_partitions, "natural", groups=groups, seed=seed)
    check_cover(parts, len(labels), num_partitions)
    # A group is never split across partitions.
    owner = {int(g): k for k, part in enumerate(parts) for g in groups[part]}
    assert all(owner[int(g)] == k for k, part in enumerate(parts) for g in groups[part])
