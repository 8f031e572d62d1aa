"""The CPU kernels against numpy references, and the numba backend against torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels import dispatch
from fedsync.kernels.dispatch import NumbaCpuBackend, TorchBackend, backend_for, register_backend
from fedsync.kernels.quantize import qsgd_quantize, uniform_dequantize, uniform_quantize
from fedsync.kernels.select import (
    TILE,
    abs_moments,
    exact_topk,
    gather_abs,
    keep_top_k,
    sample_abs,
    sample_positions,
    sample_size,
    stratified_positions,
    threshold_select,
)

NUMBA = NumbaCpuBackend()
TORCH = TorchBackend()


def make_data(seed: int, n: int, kind: str) -> np.ndarray:
    """float32 test vectors with the shapes of trouble: ties, zeros, heavy tails."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(1.5, n)
    elif kind == "ties":
        x = rng.integers(-3, 4, n).astype(np.float64)
    elif kind == "sparse":
        x = rng.standard_normal(n) * (rng.random(n) < 0.003)
    elif kind == "tiny":
        x = rng.standard_normal(n) * 1e-40  # float32 subnormals
    else:
        x = np.zeros(n)
    return x.astype(np.float32)


def reference_topk(x: np.ndarray, k: int) -> np.ndarray:
    """Sort by (-|x|, position) and keep the first k: the documented tie rule."""
    order = np.lexsort((np.arange(x.size), -np.abs(x)))
    return np.sort(order[:k])


KINDS = ["normal", "heavy", "ties", "sparse", "tiny", "zeros"]
sizes = st.sampled_from([0, 1, 2, 7, TILE - 1, TILE, TILE + 1, 3 * TILE + 5, 150_000])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), sizes, st.sampled_from(KINDS), st.floats(-1.0, 4.0))
def test_threshold_select_matches_numpy(seed: int, n: int, kind: str, t: float) -> None:
    x = make_data(seed, n, kind)
    ref = np.flatnonzero(~(np.abs(x) <= np.float32(t)))
    sel = threshold_select(x, t)
    assert sel.count == ref.size
    assert sel.indices is not None and sel.values is not None
    np.testing.assert_array_equal(sel.indices, ref)
    np.testing.assert_array_equal(sel.values, x[ref])
    # Over the limit only the exact count comes back.
    if ref.size:
        probe = threshold_select(x, t, ref.size - 1)
        assert probe.count == ref.size and probe.indices is None
    # A limit that a chunk overflows but the total does not still gives every entry.
    exact = threshold_select(x, t, ref.size)
    assert exact.indices is not None
    np.testing.assert_array_equal(exact.indices, ref)


def test_threshold_select_handles_skewed_chunks() -> None:
    # All survivors in the first chunk: its share of the limit is far too small.
    x = np.zeros(1_000_000, dtype=np.float32)
    x[:5000] = 1.0
    sel = threshold_select(x, 0.5, 5000)
    assert sel.indices is not None
    np.testing.assert_array_equal(sel.indices, np.arange(5000))


def test_threshold_select_keeps_nan_so_callers_see_it() -> None:
    x = np.ones(300_000, dtype=np.float32)
    x[123_456] = np.nan
    sel = threshold_select(x, 5.0)
    assert sel.count == 1 and np.isnan(sel.values).all()  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), sizes, st.sampled_from(KINDS), st.floats(0.0, 1.0))
def test_exact_topk_matches_reference_with_ties(seed: int, n: int, kind: str, d: float) -> None:
    x = make_data(seed, n, kind)
    k = round(d * n)
    np.testing.assert_array_equal(exact_topk(x, k), reference_topk(x, k))
    got = TORCH.exact_topk(torch.from_numpy(x), k).numpy()
    np.testing.assert_array_equal(got, reference_topk(x, k))


def test_exact_topk_on_a_large_vector_uses_the_sampled_path() -> None:
    x = make_data(1, 1_000_000, "heavy")
    x[::97] = x[0]  # plenty of ties at one magnitude
    order = np.lexsort((np.arange(x.size), -np.abs(x)))  # the reference, sorted once
    for k in (1, 20, 2_000, 20_000):
        np.testing.assert_array_equal(exact_topk(x, k), np.sort(order[:k]))


def test_keep_top_k_ranks_nan_first() -> None:
    mags = np.array([1.0, np.nan, 3.0, 2.0], dtype=np.float32)
    assert keep_top_k(mags, 1).tolist() == [False, True, False, False]
    assert keep_top_k(mags, 2).tolist() == [False, True, True, False]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), sizes, st.sampled_from(KINDS))
def test_abs_moments_match_float64_sums(seed: int, n: int, kind: str) -> None:
    x = make_data(seed, n, kind)
    m = abs_moments(x)
    x64 = x.astype(np.float64)
    assert m.sum_abs == pytest.approx(np.abs(x64).sum(), rel=1e-9, abs=1e-300)
    assert m.sum_sq == pytest.approx((x64 * x64).sum(), rel=1e-9, abs=1e-300)
    assert m.finite


def test_abs_moments_flag_non_finite() -> None:
    x = np.ones(500_000, dtype=np.float32)
    x[77] = np.inf
    assert not abs_moments(x).finite


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 10**7), st.integers(1, 5000), st.integers(0, 2**64 - 1))
def test_stratified_positions_one_per_stratum(n: int, s: int, seed: int) -> None:
    s = min(s, n)
    pos = stratified_positions(n, s, seed)
    q, r = divmod(n, s)
    lo = np.arange(s) * q + np.minimum(np.arange(s), r)
    width = q + (np.arange(s) < r)
    assert ((pos >= lo) & (pos < lo + width)).all()
    np.testing.assert_array_equal(pos, stratified_positions(n, s, seed))
    x = np.arange(n, dtype=np.float32) - n / 2
    np.testing.assert_array_equal(gather_abs(x, pos), np.abs(x[pos]))
    sampled = sample_positions(n, s, seed)
    assert sampled.size == sample_size(n, s) >= s
    assert (np.diff(sampled) > 0).all() and sampled[0] >= 0 and sampled[-1] < n
    if sampled.size % 16 == 0 and sampled.size * 64 <= n:  # whole cache lines
        assert (sampled[::16] % 16 == 0).all()
        assert (np.diff(sampled.reshape(-1, 16), axis=1) == 1).all()
    else:
        np.testing.assert_array_equal(sampled, pos)
    np.testing.assert_array_equal(sample_abs(x, s, seed), np.abs(x[sampled]))
    xt = torch.from_numpy(x)
    np.testing.assert_array_equal(TORCH.sample_abs(xt, s, seed), NUMBA.sample_abs(xt, s, seed))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32),
    st.sampled_from([0, 1, 5, 1000, 70_000]),
    st.sampled_from(KINDS),
    st.integers(1, 8),
    st.sampled_from([1, 3, 64, 1024]),
)
def test_uniform_quantize_numba_equals_torch(
    seed: int, n: int, kind: str, bits: int, chunk: int
) -> None:
    x = make_data(seed, n, kind) * np.float32(1000.0)
    codes, mins, scales = uniform_quantize(x, bits, chunk)
    t_codes, t_mins, t_scales = TORCH.uniform_quantize(torch.from_numpy(x), bits, chunk)
    np.testing.assert_array_equal(codes, t_codes)
    np.testing.assert_array_equal(mins, t_mins)
    np.testing.assert_array_equal(scales, t_scales)
    assert codes.dtype == np.uint8 and (codes <= (1 << bits) - 1).all()
    out = uniform_dequantize(codes, mins, scales, chunk)
    t_out = TORCH.uniform_dequantize(codes, mins, scales, chunk, torch.device("cpu")).numpy()
    np.testing.assert_array_equal(out, t_out)
    if n:
        owner = np.arange(n) // chunk
        bound = 0.5 * scales[owner].astype(np.float64) + 2.0**-20 * (
            np.abs(mins[owner]) + np.abs(mins[owner] + scales[owner] * ((1 << bits) - 1))
        )
        assert (np.abs(out.astype(np.float64) - x) <= bound + 1e-42).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), sizes, st.sampled_from(KINDS), st.floats(0.0, 3.0))
def test_backends_select_the_same_entries(seed: int, n: int, kind: str, t: float) -> None:
    x = torch.from_numpy(make_data(seed, n, kind))
    a, b = NUMBA.threshold_select(x, t), TORCH.threshold_select(x, t)
    assert a.count == b.count
    assert a.indices is not None and b.indices is not None
    assert a.values is not None and b.values is not None
    assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values)
    assert NUMBA.abs_moments(x) == pytest.approx(TORCH.abs_moments(x), rel=1e-9, abs=1e-300)


def test_dispatch_registry_routes_by_device_type() -> None:
    assert isinstance(backend_for(torch.zeros(1)), NumbaCpuBackend)
    assert isinstance(backend_for(torch.device("meta")), TorchBackend)
    previous = register_backend("cpu", TORCH)
    try:
        assert backend_for(torch.zeros(1)) is TORCH
        assert dispatch.registered_backends()["cpu"] == "torch"
    finally:
        register_backend("cpu", previous)  # type: ignore[arg-type]
    assert isinstance(backend_for(torch.zeros(1)), NumbaCpuBackend)
    with pytest.raises(ValueError, match="device type"):
        register_backend("", TORCH)


def test_kernels_reject_wrong_arrays() -> None:
    with pytest.raises(ValueError, match="float32"):
        threshold_select(np.zeros(4, dtype=np.float64), 0.0)
    with pytest.raises(ValueError, match=r"bits must be in 1\.\.8"):
        uniform_quantize(np.zeros(4, dtype=np.float32), 9, 4)
    with pytest.raises(ValueError, match="sample size"):
        stratified_positions(10, 11, 0)


def test_one_thread_takes_the_serial_path_with_the_same_result() -> None:
    import numba

    from fedsync.kernels import quantize

    # Long enough for the parallel path of both kernels (the quantizer's threshold is
    # the larger one), so the two calls below really take different paths.
    x = make_data(5, quantize._SERIAL_BELOW + 12_345, "heavy")
    parallel = threshold_select(x, 3.0)
    parallel_q = uniform_quantize(x, 8, 1024)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        serial = threshold_select(x, 3.0)
        serial_q = uniform_quantize(x, 8, 1024)
    finally:
        numba.set_num_threads(before)
    assert serial.count == parallel.count
    assert serial.indices is not None and parallel.indices is not None
    np.testing.assert_array_equal(serial.indices, parallel.indices)
    for one, many in zip(serial_q, parallel_q, strict=True):
        np.testing.assert_array_equal(one, many)


def test_qsgd_is_unbiased_and_seeded() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, 50_000).astype(np.float32)
    codes, norms = qsgd_quantize(x, 4, 64, 5)
    level = (codes >> 1).astype(np.float64)
    sign = 1.0 - 2.0 * (codes & 1)
    err = level * np.repeat(norms.astype(np.float64), 64)[: x.size] / 4 * sign - x
    assert abs(err.mean()) < 4 * err.std() / np.sqrt(x.size)  # E[decoded] = x
    np.testing.assert_array_equal(codes, qsgd_quantize(x, 4, 64, 5)[0])
    assert not np.array_equal(codes, qsgd_quantize(x, 4, 64, 6)[0])


def test_qsgd_parallel_path_gives_the_serial_codes() -> None:
    from fedsync.kernels import quantize
    from fedsync.kernels.ordered_sums import chunk_norms
    from fedsync.kernels.philox import philox_uniform

    n = quantize._STOCHASTIC_SERIAL_BELOW + 999  # qsgd_quantize takes the parallel loop
    x = make_data(9, n, "heavy")
    codes, norms = qsgd_quantize(x, 300, 512, 42)
    assert codes.dtype == np.uint16
    np.testing.assert_array_equal(norms, chunk_norms(x, 512))
    serial = np.empty(n, dtype=np.uint16)
    quantize._qsgd_serial(x, norms, 512, np.float32(300), philox_uniform(42, n), serial)
    np.testing.assert_array_equal(codes, serial)
