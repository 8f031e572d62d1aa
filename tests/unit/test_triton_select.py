"""Triton selection, sampling and exact top-k against the CPU kernels, bit for bit.

Interpreted on CPU tensors (``TRITON_INTERPRET=1`` before any kernel import).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from fedsync.kernels import select as cpu
from fedsync.kernels.dispatch import NumbaCpuBackend
from fedsync.kernels.triton import _runtime

pytestmark = pytest.mark.skipif(
    not _runtime.kernels_interpreted(), reason="needs the Triton interpreter on CPU tensors"
)

from fedsync.kernels.triton import select as dev  # noqa: E402
from fedsync.kernels.triton.backend import TritonBackend  # noqa: E402


def data(seed: int, n: int, kind: str = "normal") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ties":
        return rng.integers(-3, 4, n).astype(np.float32)
    if kind == "bunched":  # every large value in the first blocks: regions overflow
        x = rng.standard_normal(n).astype(np.float32)
        x[: n // 30] = 5.0
        return x
    return rng.standard_normal(n).astype(np.float32)


def assert_same_selection(x: np.ndarray, t: float, limit: int | None) -> dev.DeviceSelection:
    got = dev.threshold_select(torch.from_numpy(x), t, limit)
    ref = cpu.threshold_select(x, t, limit)
    assert got.count == ref.count
    if ref.indices is None:
        assert got.indices is None and got.values is None
    else:
        assert got.indices is not None and got.values is not None
        np.testing.assert_array_equal(got.indices.numpy(), ref.indices)
        np.testing.assert_array_equal(
            got.values.numpy().view(np.uint32), np.asarray(ref.values).view(np.uint32)
        )
    return got


@pytest.mark.parametrize(
    ("n", "t", "limit", "kind"),
    [
        (1, 0.5, None, "normal"),
        (5_000, 2.0, None, "normal"),
        (60_000, 2.5, 1_000, "normal"),  # over the limit: count only
        (60_000, 2.5, 60_000, "normal"),  # limit near n: exact two-pass path
        (60_000, 3.0, 500, "normal"),  # regions path
        (60_000, 3.5, 4_000, "bunched"),  # regions overflow: exact repair pass
        (60_000, -1.0, None, "normal"),  # negative threshold keeps all
        (60_000, 1.0, 30_000, "ties"),
    ],
)
def test_threshold_select_matches_cpu(n: int, t: float, limit: int | None, kind: str) -> None:
    x = data(n, n, kind)
    x[n // 2] = np.nan  # NaN is kept (not |x| <= t), on every backend
    got = assert_same_selection(x, t, limit)
    if kind == "bunched":
        assert got.overflowed


def test_threshold_select_empty_and_float32_rounding() -> None:
    empty = dev.threshold_select(torch.zeros(0), 0.0)
    assert empty.count == 0 and empty.indices is not None and empty.indices.numel() == 0
    # A float64 threshold between two float32 values is rounded first, as on the CPU.
    x = np.array([1.0, np.nextafter(np.float32(1.0), np.float32(2.0))], dtype=np.float32)
    assert_same_selection(x, 1.0 + 2.0**-30, None)


@pytest.mark.parametrize(("n", "s", "seed"), [(1_000, 1_000, 0), (200_000, 5_000, 1234)])
def test_stratified_sample_matches_cpu(n: int, s: int, seed: int) -> None:
    x = data(seed, n)
    positions, mags = dev.stratified_positions(torch.from_numpy(x), s, seed)
    ref = cpu.stratified_positions(n, s, seed)
    np.testing.assert_array_equal(positions.numpy(), ref)
    np.testing.assert_array_equal(mags.numpy(), np.abs(x[ref]))


@pytest.mark.parametrize(
    ("n", "s", "seed"), [(1_000, 1_000, 0), (200_000, 3_000, 7), (9_999, 50, 3)]
)
def test_threshold_sample_matches_cpu(n: int, s: int, seed: int) -> None:
    """Sparse samples take whole cache lines on both sides, dense ones single values."""
    x = data(seed, n)
    positions, mags = dev.sample_positions(torch.from_numpy(x), s, seed)
    ref = cpu.sample_positions(n, s, seed)
    np.testing.assert_array_equal(positions.numpy(), ref)
    np.testing.assert_array_equal(mags.numpy(), np.abs(x[ref]))
    np.testing.assert_array_equal(
        TritonBackend().sample_abs(torch.from_numpy(x), s, seed), cpu.sample_abs(x, s, seed)
    )


@pytest.mark.parametrize(
    ("n", "k", "kind"),
    [
        (1_000, 1, "normal"),
        (1_000, 999, "normal"),
        (150_000, 10, "normal"),  # sample-guided path
        (150_000, 1_500, "normal"),
        (150_000, 1_500, "ties"),  # ties go to lower positions on both sides
        (150_000, 30_000, "normal"),  # k > n/8: torch.topk over everything
    ],
)
def test_exact_topk_matches_cpu(n: int, k: int, kind: str) -> None:
    x = data(k, n, kind)
    np.testing.assert_array_equal(
        dev.exact_topk(torch.from_numpy(x), k).numpy(), cpu.exact_topk(x, k)
    )


def test_exact_topk_ranks_nan_first() -> None:
    x = data(3, 150_000)
    x[[10, 20_000]] = np.nan
    got = dev.exact_topk(torch.from_numpy(x), 100).numpy()
    np.testing.assert_array_equal(got, cpu.exact_topk(x, 100))
    assert {10, 20_000} <= set(got.tolist())


def test_backend_agrees_with_numba_backend() -> None:
    x = torch.from_numpy(data(9, 50_000))
    tri, numba = TritonBackend(), NumbaCpuBackend()
    a, b = tri.threshold_select(x, 2.0, 5_000), numba.threshold_select(x, 2.0, 5_000)
    assert a.count == b.count
    assert a.indices is not None and b.indices is not None
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(tri.exact_topk(x, 77), numba.exact_topk(x, 77))
    assert tri.all_finite(x) and not tri.all_finite(torch.tensor([1.0, float("inf")]))
