"""Error feedback: conservation of mass, momentum correction, plain-dict state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.codecs import CodecState, UpdateCodec, tensor_specs
from fedsync.compression import ErrorFeedback, ErrorFeedbackState, build_pipeline, parse_spec
from fedsync.updates import densify

SPECS = [
    "topk:0.05+fp32+ef",
    "randomk:0.05+ternary+ef",
    "dgc:0.01+qsgd:4+ef",
    "sidco:0.02,dist=gpd+sign+ef",
    "mask:0.1,seed=1+uniform:2+ef",
    "none+bf16+ef",
    "topk:0.1+uniform:3,chunk=16+ef:momentum=0.9",
    "dgc:0.01+fp16+ef:momentum=0.5,masking=false",
]


def update_of(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(64, 3, 9, 9, generator=g) * scale,
        "fc.weight": torch.randn(10, 2000, generator=g).to(torch.float16) * scale,
        "fc.bias": torch.randn(10, generator=g, dtype=torch.float64) * scale,
        "scalar": torch.randn((), generator=g) * scale,
        "empty": torch.zeros(0, 4),
    }


def dense_state(state: ErrorFeedbackState, table: str, update: dict[str, torch.Tensor]) -> dict:
    stored = getattr(state, table)
    return {
        name: stored[name].reshape(t.shape).clone() if name in stored else torch.zeros(t.shape)
        for name, t in update.items()
    }


@settings(max_examples=24, deadline=None)
@given(st.sampled_from(SPECS), st.integers(0, 1000))
def test_sent_plus_residual_is_input_plus_old_residual(spec: str, seed: int) -> None:
    codec = UpdateCodec(spec, seed=seed)
    assert codec.config.feedback is not None
    momentum = codec.config.feedback.momentum
    masking = codec.config.feedback.masking
    for step in range(3):
        update = update_of(seed * 10 + step)
        old_r = dense_state(codec.state.feedback, "residuals", update)
        old_u = dense_state(codec.state.feedback, "momenta", update)
        payload = codec.encode(update)
        sent = densify(codec.decode(payload, expected=tensor_specs(update)))
        new_r = dense_state(codec.state.feedback, "residuals", update)
        for name, x in update.items():
            x32 = x.float()
            if momentum > 0:
                velocity = momentum * old_u[name] + x32
                incoming = old_r[name] + velocity
                if masking:
                    new_u = dense_state(codec.state.feedback, "momenta", update)[name]
                    assert torch.all(new_u[sent[name] != 0] == 0)
            else:
                incoming = old_r[name] + x32
            scale = float(incoming.abs().max()) if incoming.numel() else 0.0
            torch.testing.assert_close(
                sent[name] + new_r[name], incoming, rtol=0, atol=4e-7 * scale + 1e-30
            )


def test_error_feedback_wraps_any_compressor() -> None:
    pipeline = build_pipeline(parse_spec("topk:0.1+sign"))
    ef = ErrorFeedback(pipeline)
    x = torch.randn(1000)
    tensors = ef.compress_update({"x": x}, seed=0)
    assert len(tensors) == 1 and len(tensors[0].values) == 100
    residual = ef.state.residuals["x"]
    sent = pipeline.decompress(tensors[0]).to_dense()
    torch.testing.assert_close(sent + residual, x, rtol=0, atol=1e-6)


def test_state_round_trips_through_a_plain_dict() -> None:
    codec = UpdateCodec("dgc:0.01+uniform:4+ef:momentum=0.9", seed=3)
    for step in range(2):
        codec.encode(update_of(step))
    plain = codec.to_state()
    assert all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in plain.items())
    assert {"codec/step", "residual/conv.weight", "momentum/fc.bias"} <= set(plain)
    state = CodecState.from_state(plain)
    assert "conv.weight" in state.feedback.residuals and "fc.bias" in state.feedback.momenta
    again = state.to_state()
    assert list(again) == list(plain)  # the same keys, in the same order
    for key, value in again.items():
        np.testing.assert_array_equal(value, plain[key])
        assert value.dtype == plain[key].dtype
    # A fresh codec restored from the dict continues exactly like the original.
    twin = UpdateCodec("dgc:0.01+uniform:4+ef:momentum=0.9", seed=3)
    twin.load_state(plain)
    nxt = update_of(99)
    assert twin.encode(nxt) == codec.encode(nxt)


def test_state_rejects_bad_arrays_and_model_changes() -> None:
    with pytest.raises(ValueError, match="1-d float32"):
        CodecState.from_state({"residual/w": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="1-d float32"):
        CodecState.from_state({"momentum/w": np.zeros(2, np.float64)})
    codec = UpdateCodec("topk:0.1+ef")
    codec.encode({"w": torch.randn(10)})
    with pytest.raises(ValueError, match="the model changed"):
        codec.encode({"w": torch.randn(11)})
    codec.state.feedback.reset()
    codec.encode({"w": torch.randn(11)})


def test_with_density_shares_the_residual() -> None:
    base = UpdateCodec("topk:0.01+fp32+ef", seed=0)
    task = base.with_density(0.5)
    x = {"w": torch.randn(1000)}
    task.encode(x)
    assert "w" in base.state.feedback.residuals
    assert base.to_state()["codec/step"][0] == 1
    assert base.compression_stats().updates == 1
