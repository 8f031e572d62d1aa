"""Regression tests for two decoder defects: absurd numbers in a frame's codec string
and a seed-derived mask whose cost followed the declared shape, not the payload.

Both must be typed errors (or bounded work) before any quantizer or sampler runs.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
import torch

from fedsync.codecs import UpdateCodec
from fedsync.compression.base import target_count
from fedsync.compression.errors import SpecError, UnknownCodec
from fedsync.compression.quantizers.qsgd import QSGDConfig
from fedsync.compression.quantizers.uniform import UniformConfig
from fedsync.compression.spec import parse_spec
from fedsync.kernels.sample import sorted_sample
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import PayloadError, decode_frame, encode_frame

HUGE = "9" * 400


def _frame_with_codec(codec: str) -> bytes:
    """A valid frame of a real top-k update whose codec string is replaced."""
    update = {"w": torch.randn(64, 16, generator=torch.Generator().manual_seed(0))}
    _, tensors = decode_frame(UpdateCodec("topk:0.1+uniform:8").encode(update))
    return encode_frame(codec, tensors)


@pytest.mark.parametrize(
    "codec",
    [
        f"topk:0.1+uniform:{HUGE}",
        f"topk:0.1+uniform:8,chunk={2**64}",
        f"topk:0.1+uniform:8,chunk=-{HUGE}",
        f"topk:0.1+qsgd:{HUGE}",
        f"topk:0.1+qsgd:16,chunk={2**64}",
        f"mask:0.1,seed={HUGE}",
        f"dgc:0.1,iters={HUGE}+uniform:8",
        f"sidco:0.1,stages={2**63}+uniform:8",
    ],
)
def test_absurd_numbers_in_a_codec_string_are_a_typed_error(codec: str) -> None:
    payload = _frame_with_codec(codec)
    with pytest.raises(UnknownCodec) as info:
        UpdateCodec().decode(payload)
    assert isinstance(info.value, PayloadError)
    assert len(str(info.value)) < 6000  # names the field, does not echo megabytes


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformConfig(bits=10**400),
        lambda: UniformConfig(chunk=2**64),
        lambda: QSGDConfig(levels=10**400),
        lambda: QSGDConfig(chunk=2**64),
    ],
)
def test_absurd_numbers_in_a_typed_config_are_a_spec_error(make: Callable[[], object]) -> None:
    with pytest.raises(SpecError):
        make()


def test_largest_64_bit_chunk_still_parses() -> None:
    config = parse_spec(f"topk:0.1+uniform:8,chunk={2**63 - 1}")
    assert config.quantizer.chunk == 2**63 - 1  # type: ignore[union-attr]


def mask_frame(numel: int, density: float, bits: int) -> tuple[bytes, int]:
    """A frame a hostile sender could write: one ``mask:`` tensor of a huge declared
    shape whose codes are all there is to it."""
    count = target_count(numel, density)
    chunks = -(-count // 1024)
    tensor = CompressedTensor(
        TensorSpec("w", (numel,)),
        "mask",
        None,
        QuantizedValues(
            "uniform",
            bits,
            np.zeros(count, dtype=np.uint8),
            {"min": np.zeros(chunks, np.float32), "scale": np.ones(chunks, np.float32)},
        ),
    )
    return encode_frame(f"mask:{density}+uniform:{bits}", [tensor]), count


def test_derived_mask_costs_memory_per_value_not_per_declared_element() -> None:
    # 16M declared elements, 6 % kept: numpy's choice() would allocate arange(16M)
    # (128 MB); the frame itself is 0.5 MB.
    payload, count = mask_frame(1 << 24, 0.06, 4)
    UpdateCodec().decode(mask_frame(1 << 12, 0.5, 4)[0])  # compile the kernels untraced
    tracemalloc.start()
    try:
        decoded = UpdateCodec().decode(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded["w"].nnz == count
    assert peak < 40 * count + 4 * len(payload), (peak, count)


@pytest.mark.parametrize(
    ("n", "k"), [(0, 0), (1, 1), (10, 3), (10, 7), (1000, 1000), (50_000, 49_999)]
)
def test_sorted_sample_is_a_sorted_subset(n: int, k: int) -> None:
    out = sorted_sample(np.random.default_rng(n + k), n, k)
    assert out.dtype == np.int64 and out.shape == (k,)
    assert np.all(np.diff(out) > 0)
    assert k == 0 or (out[0] >= 0 and out[-1] < n)


def test_sorted_sample_is_uniform() -> None:
    rng = np.random.default_rng(5)
    for k in (2, 7):  # the Floyd path and the complement path
        hits = np.zeros(9)
        for _ in range(6000):
            hits[sorted_sample(rng, 9, k)] += 1
        expected = 6000 * k / 9
        # Binomial spread per position is below sqrt(6000 * 7/9 * 2/9) ~ 32.
        assert np.all(np.abs(hits - expected) < 160), hits


def test_sorted_sample_rejects_impossible_sizes() -> None:
    with pytest.raises(ValueError):
        sorted_sample(np.random.default_rng(0), 5, 6)
