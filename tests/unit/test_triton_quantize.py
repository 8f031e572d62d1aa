"""Triton quantizers against their CPU twins, bit for bit (interpreted on CPU)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from fedsync.kernels import quantize as cpu_q
from fedsync.kernels.triton import _runtime

pytestmark = pytest.mark.skipif(
    not _runtime.kernels_interpreted(), reason="needs the Triton interpreter on CPU tensors"
)

from fedsync.kernels.triton import quantize as dev  # noqa: E402


def values(seed: int, n: int) -> np.ndarray:
    """Kept values with the shapes of trouble: wide range, signed zeros, ties."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp(2 * rng.standard_normal(n))).astype(np.float32)
    if n > 400:
        x[:50] = 0.0
        x[10:20] = -0.0
        x[300:400] = rng.choice(np.array([0.0, -0.0], dtype=np.float32), 100)
    return x


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize(
    ("n", "bits", "chunk"),
    [(1, 8, 1024), (1_000, 3, 100), (5_000, 8, 1024), (9_000, 2, 5_000), (3_000, 1, 7)],
)
def test_uniform_matches_cpu(n: int, bits: int, chunk: int) -> None:
    x = values(n + bits, n)
    codes, mins, scales = dev.uniform_quantize(torch.from_numpy(x), bits, chunk)
    ref = cpu_q.uniform_quantize(x, bits, chunk)
    for got, want in zip((codes, mins, scales), ref, strict=True):
        np.testing.assert_array_equal(bits_of(got.numpy()), bits_of(want))
    back = dev.uniform_dequantize(codes, mins, scales, chunk).numpy()
    np.testing.assert_array_equal(bits_of(back), bits_of(cpu_q.uniform_dequantize(*ref, chunk)))


def test_uniform_signed_zero_min_is_the_first_occurrence() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.choice(np.array([0.0, -0.0, 1.0], dtype=np.float32), 2_000)
        _, mins, _ = dev.uniform_quantize(torch.from_numpy(x), 4, 512)
        _, ref, _ = cpu_q.uniform_quantize(x, 4, 512)
        np.testing.assert_array_equal(bits_of(mins.numpy()), bits_of(ref))


@pytest.mark.parametrize("levels", [1, 7, 127, 300])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (5_000, 512), (3_001, 64)])
def test_qsgd_matches_cpu_twin(levels: int, n: int, chunk: int) -> None:
    x = values(levels * n, n)
    seed = 987_654_321_987
    codes, norms = dev.qsgd_quantize(torch.from_numpy(x), levels, chunk, seed)
    ref_codes, ref_norms = cpu_q.qsgd_quantize(x, levels, chunk, seed)
    got = codes.numpy().view(np.uint16) if codes.dtype == torch.int16 else codes.numpy()
    assert got.dtype == ref_codes.dtype
    np.testing.assert_array_equal(got, ref_codes)
    np.testing.assert_array_equal(bits_of(norms.numpy()), bits_of(ref_norms))
    back = dev.qsgd_dequantize(codes, norms, levels, chunk)
    # The CPU decode of QSGD (as fedsync's quantizer computes it).
    c = torch.from_numpy(ref_codes.astype(np.int32))
    step = (torch.from_numpy(ref_norms) / levels)[torch.arange(n) // chunk]
    want = (c >> 1).to(torch.float32) * step * (1.0 - 2.0 * (c & 1).to(torch.float32))
    assert torch.equal(back, want)


@pytest.mark.parametrize("n", [1, 4_000])
def test_ternary_and_sign_match_cpu_twins(n: int) -> None:
    x = values(n, n)
    codes, scale = dev.ternary_quantize(torch.from_numpy(x), 77)
    ref_codes, ref_scale = cpu_q.ternary_quantize(x, 77)
    np.testing.assert_array_equal(codes.numpy(), ref_codes)
    assert bits_of(np.array([scale])).tobytes() == bits_of(np.array([ref_scale])).tobytes()
    codes, scale = dev.sign_quantize(torch.from_numpy(x))
    ref_codes, ref_scale = cpu_q.sign_quantize(x)
    np.testing.assert_array_equal(codes.numpy(), ref_codes)
    assert scale == ref_scale


def test_ternary_all_zero_sends_zeros() -> None:
    codes, scale = dev.ternary_quantize(torch.zeros(100), 1)
    assert scale == 0 and not codes.any()
