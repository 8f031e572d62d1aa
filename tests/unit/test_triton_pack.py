"""Bit packing and index sections built by Triton: the CPU's bytes (interpreted)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from fedsync.kernels import bitpack
from fedsync.kernels import index_coding as cpu_index
from fedsync.kernels.triton import _runtime
from fedsync.wire.index_coding import IndexPlan, ef_nbytes, encode_indices

pytestmark = pytest.mark.skipif(
    not _runtime.kernels_interpreted(), reason="needs the Triton interpreter on CPU tensors"
)

from fedsync.kernels.triton import pack as dev  # noqa: E402


def _unsigned(width: int) -> type:
    return np.uint8 if width <= 8 else np.uint16 if width <= 16 else np.uint64


@pytest.mark.parametrize("width", [1, 3, 4, 7, 8, 9, 12, 16, 17, 33, 56])
@pytest.mark.parametrize("n", [0, 1, 9, 2_063])
def test_pack_and_unpack_match_bitpack(width: int, n: int) -> None:
    rng = np.random.default_rng(width * 1000 + n)
    v: np.ndarray = rng.integers(0, 1 << width, n, dtype=np.uint64).astype(_unsigned(width))
    held = (
        v.astype(np.int64)
        if v.dtype == np.uint64
        else v.astype(np.int64 if width > 8 else np.uint8)
    )
    packed = dev.pack_bits(torch.from_numpy(held), width)
    ref = bitpack.pack_bits(v, width)
    np.testing.assert_array_equal(packed.numpy(), ref)
    back = dev.unpack_bits(torch.from_numpy(np.array(ref, copy=True)), n, width, torch.int64)
    np.testing.assert_array_equal(back.numpy().astype(np.uint64), v.astype(np.uint64))


def test_pack_reads_signed_storage_as_unsigned() -> None:
    codes = np.array([0, 1, 65535, 40000, 7], dtype=np.uint16)
    packed = dev.pack_bits(torch.from_numpy(codes.view(np.int16).copy()), 16)
    np.testing.assert_array_equal(packed.numpy(), bitpack.pack_bits(codes, 16))


@pytest.mark.parametrize(("numel", "n"), [(1, 1), (100, 3), (10_000, 100), (50_000, 25_000)])
def test_index_sections_match_the_wire_encoder(numel: int, n: int) -> None:
    rng = np.random.default_rng(numel + n)
    idx = np.sort(rng.choice(numel, n, replace=False)).astype(np.int64)
    t = torch.from_numpy(idx)
    bitmap = encode_indices(idx, numel, IndexPlan("bitmap", 0, (numel + 7) // 8))
    assert dev.bitmap_encode(t, numel).numpy().tobytes() == bitmap
    for low in (0, 1, 5, 12):
        want = encode_indices(idx, numel, IndexPlan("elias_fano", low, ef_nbytes(n, numel, low)))
        assert dev.elias_fano_encode(t, numel, low).numpy().tobytes() == want
    for k in (0, 2, 7, 30):
        bits = n * (k + 1) + int(cpu_index.rice_shift_sum(idx, k))
        assert dev.rice_bits(t, k) == bits
        want = encode_indices(idx, numel, IndexPlan("rice", k, (bits + 7) // 8))
        assert dev.rice_encode(t, k).numpy().tobytes() == want
