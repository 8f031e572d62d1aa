"""Decode + scatter-add on the device: the CPU buffer's bits (interpreted)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from fedsync.kernels.quantize import uniform_dequantize, uniform_quantize
from fedsync.kernels.triton import _runtime

pytestmark = pytest.mark.skipif(
    not _runtime.kernels_interpreted(), reason="needs the Triton interpreter on CPU tensors"
)

from fedsync.kernels.triton import scatter as dev  # noqa: E402


def test_many_updates_accumulate_like_index_add() -> None:
    rng = np.random.default_rng(5)
    numel = 40_000
    acc = torch.zeros(numel)
    ref = torch.zeros(numel)
    for u in range(12):
        k = int(rng.integers(1, 3_000))
        idx = torch.from_numpy(np.sort(rng.choice(numel, k, replace=False)).astype(np.int64))
        vals = rng.standard_normal(k).astype(np.float32)
        w = float(rng.random())
        if u % 2:
            dev.scatter_add_(acc, idx, torch.from_numpy(vals), w)
            ref.index_add_(0, idx, torch.from_numpy(vals), alpha=w)
        else:
            c, lo, sc = uniform_quantize(vals, 4, 256)
            dev.scatter_add_uniform_(
                acc, idx, torch.from_numpy(c), torch.from_numpy(lo), torch.from_numpy(sc), 256, w
            )
            ref.index_add_(0, idx, torch.from_numpy(uniform_dequantize(c, lo, sc, 256)), alpha=w)
    dense = torch.from_numpy(rng.standard_normal(numel).astype(np.float32))
    dev.scatter_add_(acc, None, dense, 0.37)
    ref.index_add_(0, torch.arange(numel), dense, alpha=0.37)
    assert torch.equal(acc, ref)


def test_scatter_checks_its_arguments() -> None:
    with pytest.raises(ValueError):
        dev.scatter_add_(torch.zeros(4, dtype=torch.float64), None, torch.zeros(4), 1.0)
    with pytest.raises(ValueError):
        dev.scatter_add_(torch.zeros(4), None, torch.zeros(3), 1.0)
    with pytest.raises(ValueError):
        dev.scatter_add_(torch.zeros(4), torch.tensor([0, 1]), torch.zeros(3), 1.0)
