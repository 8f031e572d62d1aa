"""fedsync.codecs, the public codec API: the doc's example runs, state dicts round-trip,
error-feedback memory survives state_dict/load_state_dict, and bad frames are typed."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsync.codecs import (
    Codec,
    PayloadError,
    SpecError,
    TensorSpec,
    UnexpectedCodec,
    UpdateMismatch,
    codec_names,
    float_tensors,
    payload_to_array,
    tensor_specs,
)
from fedsync.wire import SchemaRequired

DOC = Path(__file__).resolve().parents[2] / "docs" / "codecs.md"
SPEC = "topk:0.1+uniform:8+ef"


class LeNet(nn.Module):
    """Conv + BatchNorm (an integer buffer) + linear: a real state dict."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def _model(seed: int = 0) -> LeNet:
    torch.manual_seed(seed)
    model = LeNet()
    model(torch.randn(4, 1, 28, 28))  # moves BatchNorm's buffers (num_batches_tracked = 1)
    return model


def _update(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(t.shape, generator=generator).to(t.dtype) if t.is_floating_point() else t
        for name, t in model.state_dict().items()
    }


def test_the_docs_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/codecs.md should hold exactly one python example"
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "docs_codecs_example"})


def test_codec_names_lists_every_kind() -> None:
    names = codec_names()
    assert list(names) == ["sparsifier", "rotation", "quantizer", "feedback"]
    assert names["rotation"] == ["rht"]
    assert {"topk", "dgc", "none", "powersgd"} <= set(names["sparsifier"])
    assert {"fp32", "fp16", "uniform", "qsgd"} <= set(names["quantizer"])
    assert "ef" in names["feedback"]
    with pytest.raises(SpecError, match=r"sparsifier: .*topk"):
        Codec("nosuch:0.1")


def test_lossless_round_trip_of_a_state_dict() -> None:
    model = _model()
    state = model.state_dict()
    payload = Codec("none+fp32").compress(state)
    out = Codec("none+fp32").decompress(payload, like=state)
    floats = float_tensors(state)
    assert "bn1.num_batches_tracked" in state and "bn1.num_batches_tracked" not in floats
    assert list(out) == list(floats)  # every float tensor, in order; nothing else
    for name, tensor in floats.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name
    # The receiver's model takes it (the integer buffer stays its own).
    receiver = LeNet()
    receiver.load_state_dict(out, strict=False)
    assert torch.equal(receiver.fc1.weight, model.fc1.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lossy_round_trip_keeps_shapes_and_dtypes(dtype: torch.dtype) -> None:
    model = _model().to(dtype)
    update = _update(model, seed=1)
    sender, receiver = Codec(SPEC, seed=3), Codec(SPEC)
    payload = sender.compress(update)
    out = receiver.decompress(payload, like=model.state_dict())
    assert list(out) == list(float_tensors(update))
    for name, tensor in out.items():
        assert tensor.dtype == dtype and tensor.shape == update[name].shape
        kept = int((tensor != 0).sum())
        assert 0 < kept <= max(1, round(0.1 * tensor.numel())) + 1, (name, kept)
    stats = sender.compression_stats()
    assert stats.payload_bytes == len(payload) and stats.compression_ratio > 5


def test_decompress_accepts_specs_and_uint8_arrays() -> None:
    model = _model()
    update = _update(model, seed=2)
    payload = Codec(SPEC).compress(update)
    specs = tensor_specs(model.state_dict())
    assert specs["fc1.weight"] == TensorSpec("fc1.weight", (32, 256), "float32")
    from_specs = Codec(SPEC).decompress(payload_to_array(payload), like=specs)
    from_state = Codec(SPEC).decompress(payload, like=model.state_dict())
    assert from_specs.keys() == from_state.keys()
    assert all(torch.equal(from_specs[k], from_state[k]) for k in from_specs)


@pytest.mark.parametrize(
    "spec", ["topk:0.1+uniform:8+ef", "randomk:0.1+qsgd:7+ef", "powersgd:2+uniform:8+ef"]
)
def test_error_feedback_state_carries_into_a_fresh_codec(spec: str) -> None:
    model = _model()
    first, second, third = (_update(model, seed=s) for s in (10, 11, 12))
    original = Codec(spec, seed=5)
    original.compress(first)
    state = original.state_dict()
    assert int(state["codec/step"]) == 1
    residual = state["residual/fc1.weight"]
    assert residual.dtype == torch.float32 and residual.device.type == "cpu"
    assert residual.abs().sum() > 0  # something was held back
    assert not any(k.endswith("num_batches_tracked") for k in state)

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    resumed = Codec(spec, seed=5)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    fresh = Codec(spec, seed=5)  # same spec and seed, no memory

    expected = original.compress(second)
    assert resumed.compress(second) == expected
    assert fresh.compress(second) != expected  # the memory is what made the bytes
    assert resumed.compress(third) == original.compress(third)
    # The state dict is a copy: changing it does not touch the codec.
    state["residual/fc1.weight"].zero_()
    assert original.state_dict()["residual/fc1.weight"].abs().sum() > 0


def test_load_state_dict_refuses_foreign_keys_and_values() -> None:
    codec = Codec(SPEC)
    with pytest.raises(ValueError, match=r"unexpected key 'fc1\.weight'"):
        codec.load_state_dict({"fc1.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="float32"):
        codec.load_state_dict({"residual/w": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(TypeError, match="tensor or array"):
        codec.load_state_dict({"residual/w": [0.0]})  # type: ignore[dict-item]
    codec.load_state_dict({"codec/step": np.array([4]), "residual/w": np.zeros(3, np.float32)})
    assert int(codec.state_dict()["codec/step"]) == 4


@pytest.mark.parametrize(
    "other", ["topk:0.2+uniform:8+ef", "topk:0.1+uniform:4+ef", "topk:0.1+uniform:8", "none+fp32"]
)
def test_another_codecs_frame_is_unexpected_codec(other: str) -> None:
    model = _model()
    payload = Codec(other).compress(_update(model, seed=3))
    with pytest.raises(UnexpectedCodec) as info:
        Codec(SPEC).decompress(payload, like=model.state_dict())
    assert info.value.field == "codec"
    assert repr(Codec(other).spec) in str(info.value) and repr(SPEC) in str(info.value)


def test_truncated_or_corrupt_payload_is_payload_error_only() -> None:
    model = _model()
    like = model.state_dict()
    payload = Codec(SPEC).compress(_update(model, seed=4))
    receiver = Codec(SPEC)
    for cut in sorted({0, 1, 5, 12, len(payload) // 2, len(payload) - 4, len(payload) - 1}):
        with pytest.raises(PayloadError):
            receiver.decompress(payload[:cut], like=like)
    rng = np.random.default_rng(0)
    for position in rng.integers(0, len(payload), size=16):
        damaged = bytearray(payload)
        damaged[int(position)] ^= 0x5A
        with pytest.raises(PayloadError):
            receiver.decompress(bytes(damaged), like=like)


def test_wrong_like_is_update_mismatch() -> None:
    model = _model()
    update = _update(model, seed=5)
    payload = Codec(SPEC).compress(update)
    receiver = Codec(SPEC)
    wrong_shape = dict(model.state_dict())
    wrong_shape["fc2.weight"] = torch.zeros(10, 33)
    with pytest.raises(UpdateMismatch):
        receiver.decompress(payload, like=wrong_shape)
    wrong_dtype = dict(model.state_dict())
    wrong_dtype["fc2.bias"] = torch.zeros(10, dtype=torch.float16)
    with pytest.raises(UpdateMismatch):
        receiver.decompress(payload, like=wrong_dtype)
    missing = {k: v for k, v in model.state_dict().items() if k != "fc2.bias"}
    with pytest.raises(UpdateMismatch):
        receiver.decompress(payload, like=missing)
    with pytest.raises(ValueError, match="needs like="):
        receiver.decompress(payload)
    with pytest.raises(ValueError, match="spec of 'b'"):
        receiver.decompress(payload, like={"a": TensorSpec("b", (1,))})
    with pytest.raises(TypeError, match="TensorSpec"):
        receiver.decompress(payload, like={"a": np.zeros(1)})  # type: ignore[arg-type]


def test_codecs_built_with_like_send_a_digest() -> None:
    model = _model()
    like = model.state_dict()
    update = _update(model, seed=6)
    digest = Codec(SPEC, like=like).compress(update)
    table = Codec(SPEC).compress(update)
    assert len(digest) < len(table)
    out = Codec(SPEC, like=like).decompress(digest)
    assert out.keys() == float_tensors(like).keys()
    # A receiver that knows the model only as like= at the call resolves it too ...
    assert Codec(SPEC).decompress(digest, like=like).keys() == out.keys()
    # ... a receiver with another model refuses it, one with no model cannot read it.
    other = _model().to(torch.float16).state_dict()
    with pytest.raises(UpdateMismatch):
        Codec(SPEC).decompress(digest, like=other)
    with pytest.raises(SchemaRequired):
        Codec(SPEC).update_codec.decode(digest)
    with pytest.raises(ValueError, match="specs"):
        Codec(SPEC, like=like).compress({"fc1.weight": update["fc1.weight"]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_stay_on_the_device() -> None:
    model = _model()
    update = _update(model, seed=7)
    like = {k: v.cuda() for k, v in model.state_dict().items()}
    payload = Codec(SPEC, seed=1).compress({k: v.cuda() for k, v in update.items()})
    assert Codec(SPEC, seed=1).compress(update) == payload  # same bytes as on the CPU
    receiver = Codec(SPEC)
    out = receiver.decompress(payload, like=like)
    assert all(t.device.type == "cuda" for t in out.values())
    on_host = receiver.decompress(payload, like=like, device="cpu")
    assert all(torch.equal(on_host[k], out[k].cpu()) for k in out)
