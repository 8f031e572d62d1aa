"""Philox and the fixed-order sums: the CPU twins against the Triton kernels.

The Triton side runs interpreted on CPU tensors (``TRITON_INTERPRET=1``, set before
any kernel module is imported); the CPU side needs no Triton at all.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.triton import ordered
from kernels.triton.philox import philox_u32, philox_uniform, split_seed

pytest.importorskip("triton")

import triton
import triton.language as tl

from kernels.triton import _runtime

interpreted = pytest.mark.skipif(
    not _runtime.kernels_interpreted(), reason="needs the Triton interpreter on CPU tensors"
)


@triton.jit
def _randint_kernel(out_ptr, seed, start, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + start
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.randint(seed, offs).to(tl.int64))


@interpreted
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 + 7, 2**63 - 1])
@pytest.mark.parametrize("start", [0, 2**32 - 5, 2**40 + 3])
def test_philox_is_tl_randint(seed: int, start: int) -> None:
    out = torch.zeros(64, dtype=torch.int64)
    _randint_kernel[(1,)](out, seed, start, BLOCK=64)
    np.testing.assert_array_equal(out.numpy().astype(np.uint32), philox_u32(seed, 64, start))


def test_philox_uniforms_are_exact_24_bit_floats() -> None:
    u = philox_uniform(7, 200_000)  # parallel path
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    np.testing.assert_array_equal(u * np.float32(2**24), np.floor(u * np.float32(2**24)))
    assert abs(float(u.mean()) - 0.5) < 0.005
    # A slice of the stream is the stream of the slice (counter-based).
    np.testing.assert_array_equal(philox_uniform(7, 100, start=1000), u[1000:1100])
    np.testing.assert_array_equal(philox_uniform(7, 10), philox_uniform(7, 10))
    assert not np.array_equal(philox_uniform(7, 10), philox_uniform(8, 10))


def test_philox_rejects_seeds_a_kernel_cannot_take() -> None:
    with pytest.raises(ValueError):
        split_seed(-1)
    with pytest.raises(ValueError):
        split_seed(2**63)
    assert split_seed(2**32 + 5) == (5, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-(2.0**100), 2.0**100, width=32), max_size=300))
def test_ordered_sums_are_close_to_exact(values: list[float]) -> None:
    x = np.asarray(values, dtype=np.float32)
    s_abs, s_sq = ordered.ordered_abs_moments(x, lanes=7, lanes2=3)
    x64 = x.astype(np.float64)
    exact_abs = math.fsum(np.abs(x64).tolist())
    exact_sq = math.fsum((x64 * x64).tolist())
    assert s_abs == pytest.approx(exact_abs, rel=1e-12, abs=0)
    assert s_sq == pytest.approx(exact_sq, rel=1e-12, abs=0)


def test_ordered_sums_propagate_non_finite() -> None:
    x = np.ones(1000, dtype=np.float32)
    x[500] = np.nan
    assert not math.isfinite(ordered.ordered_abs_moments(x)[0])
    x[500] = np.inf
    assert ordered.ordered_abs_moments(x)[1] == math.inf


def test_chunk_norms_sum_in_index_order() -> None:
    x = np.random.default_rng(0).standard_normal(1030).astype(np.float32)
    sums = ordered.chunk_sumsq(x, 512)
    for c in range(3):
        acc = 0.0
        for v in x[c * 512 : (c + 1) * 512].astype(np.float64):
            acc += v * v
        assert sums[c] == acc
    np.testing.assert_array_equal(ordered.chunk_norms(x, 512), np.sqrt(sums).astype(np.float32))


@interpreted
@pytest.mark.parametrize(
    ("n", "lanes", "lanes2"),
    [(1, ordered.LANES, ordered.LANES2), (5000, ordered.LANES, ordered.LANES2), (20_011, 999, 17)],
)
def test_device_sums_have_the_cpu_bits(n: int, lanes: int, lanes2: int) -> None:
    from kernels.triton import reduce

    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp(4 * rng.standard_normal(n))).astype(np.float32)
    t = torch.from_numpy(x)
    assert reduce.abs_moments(t, lanes, lanes2) == ordered.ordered_abs_moments(x, lanes, lanes2)
    assert reduce.abs_sum(t, lanes, lanes2) == ordered.ordered_abs_sum(x, lanes, lanes2)
    np.testing.assert_array_equal(reduce.chunk_sumsq(t, 300).numpy(), ordered.chunk_sumsq(x, 300))
    np.testing.assert_array_equal(reduce.chunk_norms(t, 300).numpy(), ordered.chunk_norms(x, 300))


@interpreted
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_moments_have_the_cpu_bits(dtype: type) -> None:
    from kernels.triton import reduce

    rng = np.random.default_rng(7)
    x: np.ndarray = (rng.standard_normal(30_001) * 3).astype(dtype)
    x[:5] = -0.0
    got = reduce.moments(torch.from_numpy(x), 1_001, 9)
    assert got == ordered.ordered_moments(x, 1_001, 9)
    assert got[0] == pytest.approx(math.fsum(x.astype(np.float64).tolist()), rel=1e-9)
