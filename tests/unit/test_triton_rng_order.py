"""Philox and the fixed-order sums: the CPU twins against the Triton kernels.

The Triton side runs interpreted on CPU tensors (``TRITON_INTERPRET=1``, set before
any kernel module is imported). The CPU twins' own properties are checked, without
Triton, in ``test_philox_ordered_sums.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import numpy as np
import pytest
import torch

from fedsync.kernels import ordered_sums as ordered
from fedsync.kernels.philox import philox_u32

pytest.importorskip("triton")

import triton
import triton.language as tl

from fedsync.kernels.triton import _runtime

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


@interpreted
@pytest.mark.parametrize(
    ("n", "lanes", "lanes2"),
    [(1, ordered.LANES, ordered.LANES2), (5000, ordered.LANES, ordered.LANES2), (20_011, 999, 17)],
)
def test_device_sums_have_the_cpu_bits(n: int, lanes: int, lanes2: int) -> None:
    from fedsync.kernels.triton import reduce

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
    from fedsync.kernels.triton import reduce

    rng = np.random.default_rng(7)
    x: np.ndarray = (rng.standard_normal(30_001) * 3).astype(dtype)
    x[:5] = -0.0
    got = reduce.moments(torch.from_numpy(x), 1_001, 9)
    assert got == ordered.ordered_moments(x, 1_001, 9)
    assert got[0] == pytest.approx(math.fsum(x.astype(np.float64).tolist()), rel=1e-9)
