"""The CPU twins' generator and sums on their own (no Triton needed).

:mod:`fedsync.kernels.philox` draws the uniforms of the stochastic quantizers and
:mod:`fedsync.kernels.ordered_sums` adds in one fixed order; ``test_triton_rng_order.py``
checks the Triton kernels against them bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels import ordered_sums as ordered
from fedsync.kernels.philox import philox_uniform, split_seed


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
