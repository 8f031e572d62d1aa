"""PowerSGD: spec, round trips through the real frame, error feedback, state, the
reconstruction error next to torch's own PowerSGD hook math, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from fedsync.codecs import CodecState, UpdateCodec, tensor_specs
from fedsync.compression import (
    BuildContext,
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    PipelineConfig,
    PowerSGDConfig,
    SpecError,
)
from fedsync.compression.sparsifiers.powersgd import PowerSGD, orthonormalize
from fedsync.updates import (
    CompressedTensor,
    LowRankTensor,
    QuantizedValues,
    SparseTensor,
    TensorSpec,
    accumulate_lowrank,
    densify,
    matrix_dims,
)
from fedsync.wire import CountMismatch, PayloadError, decode_frame, encode_frame
from fedsync.wire.testing import FrameBuilder, RawTensor

# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _low_rank(m: int, n: int, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, rank, generator=g) @ torch.randn(rank, n, generator=g)


def _spectrum(m: int, n: int, seed: int, decay: float = 0.7) -> torch.Tensor:
    """A matrix with singular values ``decay**i`` (a gradient-like spectrum)."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, min(m, n), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, min(m, n), generator=g, dtype=torch.float64))
    s = decay ** torch.arange(min(m, n), dtype=torch.float64)
    return ((u * s) @ v.T).float()


def _model_update(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(16, 8, 3, 3, generator=g),
        "conv.bias": torch.randn(16, generator=g),
        "fc.weight": _spectrum(64, 200, seed),
        "fc.bias": torch.randn(64, generator=g),
        "norm": torch.randn(4, 4, generator=g),  # too small to be worth factoring
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


# --------------------------------------------------------------------------------------
# Spec and shape rules
# --------------------------------------------------------------------------------------


def test_spec_round_trip_and_defaults() -> None:
    config = PipelineConfig.from_spec("powersgd:2,min_rate=4,fallback=same+uniform:8+ef")
    assert isinstance(config.sparsifier, PowerSGDConfig)
    assert config.sparsifier.rank == 2 and config.sparsifier.fallback == "same"
    assert config.to_spec() == "powersgd:2,min_rate=4.0,fallback=same+uniform:8+ef"
    assert PipelineConfig.from_spec("powersgd").to_spec() == "powersgd:4+fp32"
    assert PipelineConfig.from_spec(config.to_spec()) == config


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("powersgd:0", "rank must be in"),
        ("powersgd:2000", "rank must be in"),
        ("powersgd:1.5", "rank must be int"),
        ("powersgd:2,min_rate=0.5", "min_rate must be in"),
        ("powersgd:2,fallback=int8", "fallback must be one of"),
        ("powersgd:2,warm=maybe", "warm must be bool"),
    ],
)
def test_bad_specs_are_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        PipelineConfig.from_spec(spec)


def test_no_density_to_override() -> None:
    with pytest.raises(SpecError, match="no density"):
        UpdateCodec("powersgd:2").with_density(0.1)


def test_worth_it_rule_follows_min_rate() -> None:
    sparsifier = PowerSGD(PowerSGDConfig(rank=4), BuildContext())
    assert sparsifier.rank_for(TensorSpec("b", (100,))) == 0  # 1-d
    assert sparsifier.rank_for(TensorSpec("s", (4, 4))) == 0  # 4*8*2 >= 16
    assert sparsifier.rank_for(TensorSpec("w", (64, 200))) == 4
    assert sparsifier.rank_for(TensorSpec("c", (16, 8, 3, 3))) == 4  # 16 x 72
    # rank 4 of a 3 x 1000 matrix: clipped to 3, then 3 * 1003 * 2 >= 3000: not worth it
    assert sparsifier.rank_for(TensorSpec("t", (3, 1000))) == 0
    strict = PowerSGD(PowerSGDConfig(rank=4, min_rate=20.0), BuildContext())
    assert strict.rank_for(TensorSpec("w", (64, 200))) == 0  # 4 * 264 * 20 > 12800
    assert strict.rank_for(TensorSpec("w", (512, 512))) == 4


# --------------------------------------------------------------------------------------
# Round trips with the real frame encoder and decoder
# --------------------------------------------------------------------------------------


def test_round_trip_types_and_fallback_scheme() -> None:
    update = _model_update()
    codec = UpdateCodec("powersgd:4+uniform:8", seed=3)
    payload = codec.encode(update)
    decoded = codec.decode(payload, expected=tensor_specs(update))
    assert isinstance(decoded["conv.weight"], LowRankTensor)
    assert isinstance(decoded["fc.weight"], LowRankTensor)
    for name in ("conv.bias", "fc.bias", "norm"):
        assert type(decoded[name]) is SparseTensor
    # the frame carries the factors (r * (m + n) codes), not the product
    _, tensors = decode_frame(payload)
    by_name = {t.spec.name: t for t in tensors}
    assert by_name["fc.weight"].index_mode == "lowrank"
    assert len(by_name["fc.weight"].values) == 4 * (64 + 200)
    assert by_name["conv.weight"].values.scheme == "uniform"
    # fallback tensors are dense fp16 by default, whatever the pipeline's quantizer
    assert by_name["fc.bias"].index_mode == "dense"
    assert by_name["fc.bias"].values.scheme == "fp16"
    # fallback=same uses the pipeline's quantizer
    same = UpdateCodec("powersgd:4,fallback=same+uniform:8")
    _, tensors = decode_frame(same.encode(update))
    assert {t.spec.name: t for t in tensors}["fc.bias"].values.scheme == "uniform"


def test_exact_on_a_matrix_of_the_same_rank() -> None:
    # One power iteration from any Q finds the column space of a rank-r matrix.
    matrix = _low_rank(120, 90, 3, seed=5)
    codec = UpdateCodec("powersgd:3")
    decoded = codec.decode(codec.encode({"w": matrix}))["w"]
    assert isinstance(decoded, LowRankTensor) and decoded.rank == 3
    assert _rel(decoded.to_dense(), matrix) < 1e-5


def test_low_rank_tensor_is_a_correct_sparse_tensor() -> None:
    matrix = _spectrum(30, 40, seed=1)
    codec = UpdateCodec("powersgd:2")
    decoded = codec.decode(codec.encode({"w": matrix}))["w"]
    assert isinstance(decoded, LowRankTensor)
    dense = decoded.to_dense()
    assert dense.shape == (30, 40)
    # Code that only knows SparseTensor (indices + values) sees the same tensor.
    rebuilt = torch.zeros(1200)
    rebuilt[decoded.indices] = decoded.values
    assert torch.equal(rebuilt.view(30, 40), dense)
    assert decoded.nnz == 1200 and decoded.factor_count == 2 * 70
    assert torch.equal(densify({"w": decoded})["w"], dense)
    with pytest.raises(AttributeError):
        decoded.values = torch.zeros(1)


@st.composite
def _updates(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(draw(st.integers(1, 3))):
        ndim = draw(st.integers(1, 4))
        shape = tuple(draw(st.integers(1, 24)) for _ in range(ndim))
        scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
        out[f"t{i}"] = torch.randn(shape, generator=g) * scale
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    update=_updates(),
    rank=st.integers(1, 6),
    quantizer=st.sampled_from(["fp32", "fp16", "uniform:8", "uniform:4,chunk=16"]),
    ef=st.booleans(),
    min_rate=st.sampled_from([1.0, 2.0]),
)
def test_property_round_trip(
    update: dict[str, torch.Tensor], rank: int, quantizer: str, ef: bool, min_rate: float
) -> None:
    spec = f"powersgd:{rank},min_rate={min_rate}+{quantizer}" + ("+ef" if ef else "")
    codec = UpdateCodec(spec, seed=7)
    sparsifier = PowerSGD(PowerSGDConfig(rank=rank, min_rate=min_rate), BuildContext())
    for _ in range(2):
        before = {k: v.clone() for k, v in codec.state.feedback.residuals.items()}
        payload = codec.encode(update)
        decoded = codec.decode(payload, expected=tensor_specs(update))
        assert len(payload) == codec.compression_stats().payload_bytes
        for name, tensor in update.items():
            spec_ = tensor_specs({name: tensor})[name]
            got = decoded[name]
            r = sparsifier.rank_for(spec_)
            assert isinstance(got, LowRankTensor) == bool(r)
            if isinstance(got, LowRankTensor):
                dims = matrix_dims(spec_.shape)
                assert dims is not None
                m, n = dims
                assert got.p.shape == (m, r) and got.q.shape == (n, r)
                assert r * (m + n) * min_rate < m * n
            dense = got.to_dense()
            assert dense.shape == tensor.shape and torch.isfinite(dense).all()
            if ef:
                # sent + new residual == input + old residual (one float32 rounding)
                old = before.get(name, torch.zeros(tensor.numel()))
                new = codec.state.feedback.residuals[name]
                lhs = dense.reshape(-1) + new
                rhs = tensor.reshape(-1) + old
                tol = 1e-5 * float(rhs.abs().max() + dense.abs().max()) + 1e-30
                assert float((lhs - rhs).abs().max()) <= tol
        # a frame that decodes also re-encodes (the encoder's contract holds)
        encode_frame(*decode_frame(payload))


def test_state_export_resumes_bit_identically() -> None:
    updates = [_model_update(seed) for seed in range(4)]
    straight = UpdateCodec("powersgd:2+fp16+ef", seed=11)
    expected = [straight.encode(u) for u in updates]
    resumed = UpdateCodec("powersgd:2+fp16+ef", seed=11)
    got = [resumed.encode(u) for u in updates[:2]]
    state = resumed.to_state()
    assert state["factors/fc.weight"].shape == (200, 2)
    assert state["factors/fc.weight"].dtype == np.float32
    fresh = UpdateCodec("powersgd:2+fp16+ef", seed=11)
    fresh.load_state(state)
    got += [fresh.encode(u) for u in updates[2:]]
    assert got == expected
    bad = dict(state)
    bad["factors/fc.weight"] = np.zeros(5, dtype=np.float32)
    with pytest.raises(ValueError, match="2-d float32"):
        CodecState.from_state(bad)


def test_warm_start_converges_and_cold_start_does_not_keep_memory() -> None:
    matrix = _spectrum(80, 120, seed=2, decay=0.8)
    warm = UpdateCodec("powersgd:2")
    cold = UpdateCodec("powersgd:2,warm=false")
    errors = []
    for _ in range(6):
        errors.append(_rel(warm.decode(warm.encode({"w": matrix}))["w"].to_dense(), matrix))
        cold.encode({"w": matrix})
    best = math.sqrt(
        sum(0.8 ** (2 * i) for i in range(2, 80)) / sum(0.8 ** (2 * i) for i in range(80))
    )
    assert errors[-1] < errors[0]
    assert errors[-1] < best * 1.01  # subspace iteration reaches the optimal rank-2 error
    assert not cold.state.factors


def test_nan_input_is_rejected_and_state_is_unchanged() -> None:
    codec = UpdateCodec("powersgd:2")
    update = {"w": _spectrum(20, 30, seed=3)}
    codec.encode(update)
    q_before = codec.state.factors["w"].clone()
    broken = {"w": update["w"].clone()}
    broken["w"][3, 4] = float("nan")
    with pytest.raises(NonFiniteInputError, match="'w'"):
        codec.encode(broken)
    assert torch.equal(codec.state.factors["w"], q_before)


def test_orthonormalize_handles_dependent_and_zero_columns() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 1, generator=g)
    p = torch.cat([a, 2 * a, torch.zeros(50, 1), torch.randn(50, 1, generator=g)], dim=1)
    out = orthonormalize(p)
    assert torch.equal(out[:, 1], torch.zeros(50)) and torch.equal(out[:, 2], torch.zeros(50))
    kept = out[:, [0, 3]]
    assert torch.allclose(kept.T @ kept, torch.eye(2), atol=1e-6)


# --------------------------------------------------------------------------------------
# Reconstruction error next to torch's PowerSGD hook math
# --------------------------------------------------------------------------------------


def _hook_steps(matrix: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of torch's powerSGD_hook for one matrix on one worker (the all-reduces
    of a single process are identities): orthogonalise Q, P = M Q, orthogonalise P,
    Q = M^T P, approximation P Q^T. Returns (approximation, new Q)."""
    q = q.clone()[None]
    _orthogonalize(q, 0)
    p = torch.bmm(matrix[None], q)
    _orthogonalize(p, 0)
    q = torch.bmm(matrix.T[None], p)
    return (p @ q.transpose(1, 2))[0], q[0]


@pytest.mark.parametrize("rank", [1, 2, 4, 8])
def test_error_matches_torch_hook_at_equal_rank(rank: int) -> None:
    # A drifting gradient-like matrix over several warm-started steps, both sides
    # starting from the same Q.
    base = _spectrum(96, 160, seed=4, decay=0.85)
    g = torch.Generator().manual_seed(9)
    q0 = torch.randn(160, rank, generator=g)
    codec = UpdateCodec(f"powersgd:{rank}")
    codec.state.factors["w"] = q0.clone()
    q_ref = q0.clone()
    for step in range(5):
        matrix = base + 0.01 * torch.randn(96, 160, generator=g)
        ours = codec.decode(codec.encode({"w": matrix}))["w"].to_dense()
        theirs, q_ref = _hook_steps(matrix, q_ref)
        e_ours, e_theirs = _rel(ours, matrix), _rel(theirs, matrix)
        assert e_ours <= e_theirs * (1 + 1e-3) + 1e-6, (step, e_ours, e_theirs)
        assert _rel(ours, theirs) < 1e-3, step


# --------------------------------------------------------------------------------------
# Server side: adding many updates by stacking factors
# --------------------------------------------------------------------------------------


def test_accumulate_lowrank_equals_dense_sum() -> None:
    codec = UpdateCodec("powersgd:3")
    terms: list[tuple[float, LowRankTensor]] = []
    for seed in range(5):
        decoded = codec.decode(codec.encode({"w": _spectrum(40, 6 * 5, seed).view(40, 6, 5)}))
        term = decoded["w"]
        assert isinstance(term, LowRankTensor)
        terms.append((0.5 + seed, term))
    buffer = torch.ones(40, 6, 5)
    want = buffer + sum(w * t.to_dense() for w, t in terms)
    got = accumulate_lowrank(buffer, terms)
    assert got is buffer
    assert torch.allclose(buffer, want, atol=1e-5)
    flat = torch.zeros(1200)
    accumulate_lowrank(flat, terms[:1])
    assert torch.allclose(flat, 0.5 * terms[0][1].to_dense().reshape(-1), atol=1e-6)
    with pytest.raises(ValueError, match="cannot hold"):
        accumulate_lowrank(torch.zeros(7), terms)


# --------------------------------------------------------------------------------------
# Bad input: typed errors that name the tensor and the field
# --------------------------------------------------------------------------------------


def _frame_with(codec: str, spec: TensorSpec, codes: np.ndarray, scheme: str = "fp32") -> bytes:
    bits = 32 if scheme == "fp32" else 16
    values = QuantizedValues(scheme, bits, codes)
    # Bypass the encoder's own checks by building the tensor the codec would send.
    return encode_frame(codec, [CompressedTensor(spec, "lowrank", None, values)])


def test_factor_of_the_wrong_shape_is_a_count_mismatch() -> None:
    update = {"fc.weight": _spectrum(64, 200, 0)}
    payload = UpdateCodec("powersgd:2").encode(update)
    _, tensors = decode_frame(payload)
    codes = tensors[0].values.codes
    # drop one row of Q: the count is no longer r * (m + n)
    short = codes[:-2]
    frame = (
        FrameBuilder(codec="powersgd:2+fp32")
        .add(
            RawTensor(
                name="fc.weight",
                shape=(64, 200),
                mode=3,
                count=len(short),
                scheme=1,
                bits=32,
                codes=short.astype("<u4").tobytes(),
            )
        )
        .build()
    )
    with pytest.raises(CountMismatch) as info:
        UpdateCodec().decode(frame)
    assert info.value.field == "value count" and "fc.weight" in str(info.value)
    assert "r * (m + n)" in str(info.value)


def test_rank_larger_than_the_matrix_is_rejected() -> None:
    count = 4 * (3 + 5)  # rank 4 of a 3 x 5 matrix
    frame = (
        FrameBuilder(codec="powersgd:4,min_rate=1.0+fp32")
        .add(
            RawTensor(
                name="tiny",
                shape=(3, 5),
                mode=3,
                count=count,
                scheme=1,
                bits=32,
                codes=np.ones(count, "<f4").tobytes(),
            )
        )
        .build()
    )
    with pytest.raises(CountMismatch) as info:
        UpdateCodec().decode(frame)
    assert "'tiny'" in str(info.value) and info.value.field == "value count"
    # and lowrank on a 1-d tensor
    frame = (
        FrameBuilder(codec="powersgd:1+fp32")
        .add(
            RawTensor(name="bias", shape=(8,), mode=3, count=9, scheme=1, bits=32, codes=bytes(36))
        )
        .build()
    )
    with pytest.raises(CountMismatch, match="2 or more dimensions"):
        UpdateCodec().decode(frame)


def test_rank_other_than_the_codecs_is_a_codec_mismatch() -> None:
    matrix = _spectrum(64, 200, 0)
    payload = UpdateCodec("powersgd:1").encode({"fc.weight": matrix})
    _, tensors = decode_frame(payload)
    lying = encode_frame("powersgd:2+fp32", tensors)  # rank-1 factors under rank 2
    with pytest.raises(CodecMismatch) as info:
        UpdateCodec().decode(lying)
    assert info.value.field == "rank" and "fc.weight" in str(info.value)
    assert info.value.expected == 2 and info.value.got == 1


@pytest.mark.parametrize(("where", "field"), [(5, "factor P"), (64 * 2 + 7, "factor Q")])
def test_nan_in_a_factor_is_non_finite_update(where: int, field: str) -> None:
    spec = TensorSpec("fc.weight", (64, 200))
    values = np.ones(2 * (64 + 200), dtype=np.float32)
    values[where] = np.nan
    frame = _frame_with("powersgd:2+fp32", spec, values.view(np.uint32))
    with pytest.raises(NonFiniteUpdate) as info:
        UpdateCodec().decode(frame, expected={"fc.weight": spec})
    assert info.value.field == field and "fc.weight" in str(info.value)
    assert isinstance(info.value, PayloadError)


def test_factored_mode_on_a_fallback_tensor_is_a_codec_mismatch() -> None:
    # 'norm' (4 x 4) is not worth factoring under min_rate=2: the codec expects dense.
    spec = TensorSpec("norm", (4, 4))
    frame = _frame_with("powersgd:1+fp32", spec, np.ones(8, np.float32).view(np.uint32))
    with pytest.raises(CodecMismatch) as info:
        UpdateCodec().decode(frame)
    assert info.value.field == "index mode" and "norm" in str(info.value)
