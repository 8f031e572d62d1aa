"""Quantizers: each keeps its stated error bound through the wire; QSGD and ternary
are unbiased; received codes and params are validated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.compression import BuildContext, CodecMismatch, NonFiniteUpdate, parse_spec
from fedsync.compression.base import Quantizer
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import decode_frame, encode_frame

QUANTIZERS = [
    "fp32",
    "fp16",
    "bf16",
    "uniform:8",
    "uniform:4,chunk=100",
    "uniform:1,chunk=7",
    "qsgd:16",
    "qsgd:1,chunk=3",
    "qsgd:1000,chunk=2048",
    "sign",
    "ternary",
    "binmean:2",
    "binmean:1",
    "binmean:8,range=3",
]


def quantizer(spec: str) -> Quantizer:
    config = parse_spec(spec).quantizer
    assert config is not None
    return config.build(BuildContext())


def values_of(seed: int, n: int, kind: str, scale: float) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(1.2, n)
    elif kind == "ties":
        x = rng.integers(-2, 3, n).astype(np.float64)
    elif kind == "const":
        x = np.full(n, rng.standard_normal())
    else:
        x = np.zeros(n)
    return torch.from_numpy((x * scale).astype(np.float32))


def through_wire(q: QuantizedValues) -> QuantizedValues:
    """Pack the codes into a frame and unpack them, as the server will."""
    n = len(q)
    tensor = CompressedTensor(TensorSpec("t", (n,)), "dense", None, q)
    codec, [back] = decode_frame(encode_frame("none+fp32", [tensor]))
    assert codec == "none+fp32"
    return back.values


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(QUANTIZERS),
    st.integers(0, 2**32),
    st.sampled_from([0, 1, 2, 3, 100, 1025, 5000]),
    st.sampled_from(["normal", "heavy", "ties", "const", "zeros"]),
    st.sampled_from([1e-30, 1e-3, 1.0, 1e4, 1e30]),
)
def test_round_trip_within_the_stated_bound(
    spec: str, seed: int, n: int, kind: str, scale: float
) -> None:
    quant = quantizer(spec)
    v = values_of(seed, n, kind, scale)
    q = quant.quantize(v, seed)
    assert q.scheme == quant.scheme and q.bits == quant.bits and len(q) == n
    back = through_wire(q)
    decoded = quant.dequantize(back, "cpu")
    assert decoded.dtype == torch.float32 and decoded.shape == (n,)
    assert torch.isfinite(decoded).all()
    error = (decoded.double() - v.double()).abs()
    bound = quant.error_bound(v, q).double()
    assert (error <= bound).all(), (error - bound).max()
    if spec == "fp32":
        assert torch.equal(decoded, v)
    # The sender's view of what it sent equals the receiver's decode.
    assert torch.equal(quant.decode(q, torch.device("cpu")), decoded)


def test_fp16_and_bf16_saturate_instead_of_overflowing() -> None:
    v = torch.tensor([1e5, -1e6, 3.4e38, 1.0])
    for spec, limit in (("fp16", 65504.0), ("bf16", float(torch.finfo(torch.bfloat16).max))):
        quant = quantizer(spec)
        decoded = quant.dequantize(quant.quantize(v, 0))
        assert torch.isfinite(decoded).all()
        assert decoded.abs().max() <= limit


@pytest.mark.parametrize("spec", ["qsgd:4,chunk=16", "qsgd:1", "ternary"])
def test_stochastic_quantizers_are_unbiased(spec: str) -> None:
    """Mean of N seeded decodes vs the input, per element.

    Each decode is within ``step`` of the input and rounds up or down, so one decode's
    standard deviation is at most ``step / 2`` (``step`` = norm/s for QSGD, max|v| for
    ternary) and the mean's at most ``step / (2 sqrt(N))``. We allow 5 of those per
    element (a false alarm has probability < 1e-6 per element, and the seeds are
    fixed, so the test is deterministic), and check the overall mean more tightly.
    """
    quant = quantizer(spec)
    v = values_of(7, 48, "heavy", 1.0)
    n_draws = 2000
    total = torch.zeros_like(v, dtype=torch.float64)
    steps = None
    for seed in range(n_draws):
        q = quant.quantize(v, seed)
        total += quant.decode(q, torch.device("cpu")).double()
        steps = quant.error_bound(v, q).double()
    assert steps is not None
    mean = total / n_draws
    sigma = steps / (2 * np.sqrt(n_draws))
    assert ((mean - v.double()).abs() <= 5 * sigma).all()
    assert abs(float((mean - v.double()).sum())) <= 5 * float(sigma.pow(2).sum().sqrt())


def test_deterministic_quantizers_are_not_unbiased_by_declaration() -> None:
    assert quantizer("qsgd:4").unbiased and quantizer("ternary").unbiased
    assert not quantizer("sign").unbiased and not quantizer("uniform:8").unbiased


def test_same_seed_same_codes_different_seed_different_codes() -> None:
    v = values_of(1, 1000, "normal", 1.0)
    for spec in ("qsgd:4", "ternary"):
        quant = quantizer(spec)
        a, b, c = quant.quantize(v, 5), quant.quantize(v, 5), quant.quantize(v, 6)
        np.testing.assert_array_equal(a.codes, b.codes)
        assert not np.array_equal(a.codes, c.codes)


def test_sign_sends_mean_magnitude() -> None:
    quant = quantizer("sign")
    v = torch.tensor([1.0, -3.0, 0.0, 4.0])
    decoded = quant.dequantize(quant.quantize(v, 0))
    assert decoded.tolist() == [2.0, -2.0, 2.0, 2.0]


def test_received_codes_and_params_are_validated() -> None:
    uniform = quantizer("uniform:8")
    good = uniform.quantize(values_of(0, 10, "normal", 1.0), 0)
    with pytest.raises(CodecMismatch, match="scheme/bits"):
        quantizer("uniform:4").dequantize(good)
    with pytest.raises(CodecMismatch, match="params differ"):
        uniform.dequantize(QuantizedValues("uniform", 8, good.codes, {"min": good.params["min"]}))
    with pytest.raises(CodecMismatch, match="wrong length"):
        uniform.dequantize(
            QuantizedValues(
                "uniform",
                8,
                good.codes,
                {"min": np.zeros(3, np.float32), "scale": good.params["scale"]},
            )
        )
    with pytest.raises(NonFiniteUpdate, match="not finite"):
        uniform.dequantize(
            QuantizedValues(
                "uniform",
                8,
                good.codes,
                {"min": np.array([np.nan], np.float32), "scale": good.params["scale"]},
            )
        )
    ternary = quantizer("ternary")
    with pytest.raises(CodecMismatch, match="code 3"):
        ternary.dequantize(
            QuantizedValues(
                "ternary", 2, np.array([0, 3], np.uint8), {"scale": np.ones(1, np.float32)}
            )
        )
    qsgd = quantizer("qsgd:2")
    with pytest.raises(CodecMismatch, match="level above"):
        qsgd.dequantize(
            QuantizedValues("qsgd", 3, np.array([6], np.uint8), {"norm": np.ones(1, np.float32)})
        )
