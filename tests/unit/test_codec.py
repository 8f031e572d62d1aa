"""UpdateCodec: compress -> encode -> decode -> decompress for every compressor, and
everything the decoder refuses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.codecs import (
    CodecMismatch,
    NonFiniteUpdate,
    PayloadError,
    UnknownCodec,
    UpdateCodec,
    UpdateMismatch,
    array_to_payload,
    payload_to_array,
    tensor_specs,
)
from fedsync.compression import (
    NonFiniteInputError,
    PipelineConfig,
    SpecError,
    TopKConfig,
    UniformConfig,
    build_pipeline,
    parse_spec,
    target_count,
)
from fedsync.compression.pipeline import flatten
from fedsync.compression.seeding import derive_seed
from fedsync.kernels.dispatch import TorchBackend, register_backend
from fedsync.updates import CompressedTensor, IndexMode, QuantizedValues, TensorSpec
from fedsync.wire import SchemaRequired, UnexpectedCodec, decode_frame, encode_frame

SPARSIFIERS = [
    "none",
    "topk:{d}",
    "randomk:{d}",
    "dgc:{d}",
    "sidco:{d},dist=exp",
    "sidco:{d},dist=gpd",
    "sidco:{d},dist=gamma-gpd",
    "mask:{d},seed=3",
    "chunktopk:4,block=8",
]
QUANTIZERS = [
    "fp32",
    "fp16",
    "bf16",
    "uniform:8",
    "uniform:2,chunk=5",
    "qsgd:16",
    "qsgd:2,chunk=3",
    "sign",
    "ternary",
    "binmean:2",
    "binmean:8,range=3",
]
SHAPES = [(), (0,), (0, 3), (1,), (7,), (3, 4), (2, 3, 4), (1, 100_000), (300, 70)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tensor_of(seed: int, shape: tuple[int, ...], dtype: torch.dtype, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        x = torch.randn(shape, generator=g)
    elif kind == "ties":
        x = torch.randint(-2, 3, shape, generator=g).float()
    else:
        x = torch.randn(shape, generator=g) ** 3 * 100  # heavy-ish tail
    return x.to(dtype)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(SPARSIFIERS),
    st.sampled_from(QUANTIZERS),
    st.sampled_from([0.001, 0.05, 0.5, 1.0]),
    st.sampled_from(SHAPES),
    st.sampled_from(DTYPES),
    st.sampled_from(["normal", "ties", "heavy"]),
    st.integers(0, 2**31),
)
def test_every_compressor_round_trips_through_the_wire(
    sparsifier: str, quantizer: str, d: float, shape, dtype, kind: str, seed: int
) -> None:
    spec = f"{sparsifier.format(d=d)}+{quantizer}"
    pipeline = build_pipeline(parse_spec(spec))
    x = tensor_of(seed, shape, dtype, kind)
    tspec, flat = flatten("t", x)
    assert tspec.dtype == str(dtype).removeprefix("torch.")
    compressed = pipeline.compress(tspec, flat, seed)
    q = compressed.tensor.values
    payload = encode_frame(parse_spec(spec).to_spec(), [compressed.tensor])
    codec_string, [received] = decode_frame(payload)
    sparse = build_pipeline(parse_spec(codec_string)).decompress(received)
    assert sparse.spec == tspec
    numel = tspec.numel
    index = sparse.indices.numpy()
    assert (np.diff(index) > 0).all() and (index.size == 0 or index[-1] < numel)
    if numel:
        assert sparse.nnz >= 1
    if sparsifier == "none":
        assert sparse.nnz == numel and received.index_mode == "dense"
    if sparsifier.startswith(("topk", "randomk", "mask")):
        assert sparse.nnz == target_count(numel, d)
    if sparsifier.startswith("mask"):
        assert received.index_mode == "mask" and received.indices is None
    # Values: exact for fp32, within the quantizer's stated bound otherwise.
    original = flat[sparse.indices]
    if quantizer == "fp32":
        assert torch.equal(sparse.values, original)
    bound = pipeline.quantizer.error_bound(original, q).double()
    assert ((sparse.values.double() - original.double()).abs() <= bound).all()
    # The sender's view of what it sent equals what the receiver decoded.
    assert torch.equal(pipeline.sent(compressed), sparse.values)
    assert sparse.to_dense().shape == shape


def sample_update(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(200, 300, generator=g),
        "layer.bias": torch.randn(300, generator=g, dtype=torch.float64),
        "head.weight": torch.randn(1, 20_000, generator=g).to(torch.bfloat16),
        "scale": torch.randn((), generator=g),
        "empty": torch.zeros(0),
    }


ALL_SPECS = [
    "topk:0.01+uniform:8+ef",
    "dgc:0.01,sample=0.05+qsgd:16+ef:momentum=0.9",
    "sidco:0.01,dist=gpd+sign+ef",
    "none+fp16",
    "mask:0.1,seed=3+uniform:4",
    "randomk:0.02+ternary",
    "sidco:0.02,dist=gamma-gpd+bf16",
]


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_same_seed_same_bytes_and_decodes(spec: str) -> None:
    update = sample_update()
    a, b = UpdateCodec(spec, seed=11), UpdateCodec(spec, seed=11)
    first = a.encode(update)
    assert first == b.encode(update)
    # The step counter varies later encodes; an explicit seed pins them.
    assert a.encode(update, seed=5) == b.encode(update, seed=5)
    decoded = UpdateCodec().decode(first, expected=tensor_specs(update))
    assert sorted(decoded) == sorted(update)
    assert decoded["empty"].nnz == 0 and decoded["scale"].nnz == 1


def test_stochastic_specs_differ_across_seeds() -> None:
    update = sample_update()
    for spec in ("randomk:0.02+fp32", "topk:0.1+qsgd:4", "topk:0.1+ternary"):
        assert UpdateCodec(spec, seed=1).encode(update) != UpdateCodec(spec, seed=2).encode(update)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_torch_backend_writes_the_same_bytes_as_numba(spec: str) -> None:
    """The torch backend stands in for a GPU here: same spec, same seed, same bytes."""
    update = sample_update(3)
    numba_bytes = UpdateCodec(spec, seed=4).encode(update)
    previous = register_backend("cpu", TorchBackend())
    try:
        torch_bytes = UpdateCodec(spec, seed=4).encode(update)
    finally:
        register_backend("cpu", previous)  # type: ignore[arg-type]
    assert numba_bytes == torch_bytes


def test_fixed_mask_sends_no_indices() -> None:
    update = sample_update()
    payload = UpdateCodec("mask:0.05,seed=3+uniform:8").encode(update)
    _, tensors = decode_frame(payload)
    assert all(t.index_mode == "mask" and t.indices is None for t in tensors)
    topk = UpdateCodec("topk:0.05+uniform:8").encode(update)
    assert len(payload) < len(topk)  # same values, no positions


def test_explicit_masks_on_both_sides() -> None:
    update = sample_update()
    g = torch.Generator().manual_seed(0)
    masks = {"layer.weight": torch.rand(200, 300, generator=g) < 0.05}
    sender = UpdateCodec("mask+fp32", masks=masks)
    assert sender.spec.startswith("mask:digest=")
    payload = sender.encode(update)
    decoded = UpdateCodec(masks=masks).decode(payload, expected=tensor_specs(update))
    w = decoded["layer.weight"]
    assert torch.equal(w.indices, masks["layer.weight"].reshape(-1).nonzero().view(-1))
    assert torch.equal(w.values, update["layer.weight"].reshape(-1)[w.indices])
    assert decoded["layer.bias"].nnz == 300  # no mask: sent whole
    with pytest.raises(UnknownCodec, match="need the shared masks"):
        UpdateCodec().decode(payload)
    other = {"layer.weight": ~masks["layer.weight"]}
    with pytest.raises(UnknownCodec, match="digest"):
        UpdateCodec(masks=other).decode(payload)


def test_per_task_density_and_bits_decode_with_any_codec() -> None:
    update = sample_update()
    base = UpdateCodec("dgc:0.001+uniform:8+ef", seed=0)
    task = base.with_density(0.05).with_bits(3)
    assert task.spec == "dgc:0.05+uniform:3+ef"
    payload = task.encode(update)
    decoded = base.decode(payload, expected=tensor_specs(update))
    k = target_count(60_000, 0.05)
    assert 0.8 * k <= decoded["layer.weight"].nnz <= 1.25 * k
    stats = base.compression_stats()
    assert stats.payload_bytes == len(payload) and stats.updates == 1
    assert stats.nnz == sum(t.nnz for t in decoded.values())
    assert stats.dense_bytes == 4 * sum(t.numel() for t in update.values())
    assert stats.compression_ratio == pytest.approx(stats.dense_bytes / len(payload))
    assert set(stats.as_dict()) >= {"payload_bytes", "nnz", "density", "compression_ratio"}


def test_own_spec_only_refuses_other_codecs_on_the_header(built_pipelines: list[str]) -> None:
    """The receiver that assigned a spec takes frames of that spec (written any way that
    parses to it) and refuses any other before its schema or a pipeline for it."""
    update = sample_update()
    specs = tensor_specs(update)
    task = UpdateCodec("TOPK:0.050+uniform:8+ef")  # not canonical: the codec's spec is
    assert task.spec == "topk:0.05+uniform:8+ef"
    own = UpdateCodec("topk:0.05+uniform:8+ef", seed=2).encode(update)
    no_ef = UpdateCodec("topk:0.05+uniform:8", seed=2).encode(update)  # same values
    denser = task.with_density(0.1).encode(update)
    wrong_model = UpdateCodec("none+fp16").encode({"other": torch.zeros(3)})
    built = built_pipelines
    built.clear()  # from here on: the builds of the decoding below
    assert task.decode(own, specs, own_spec_only=True)["layer.weight"].nnz > 0
    for frame, got in (
        (no_ef, "topk:0.05+uniform:8"),
        (denser, "topk:0.1+uniform:8+ef"),
        (wrong_model, "none+fp16"),  # the codec is read first: not an UpdateMismatch
    ):
        with pytest.raises(UnexpectedCodec) as info:
            task.decode(frame, specs, own_spec_only=True)
        assert info.value.field == "codec" and info.value.got == repr(got)
        assert info.value.expected == repr(task.spec)
    assert built == ["topk:0.05+uniform:8+ef"]  # the decoder of the task's spec, once
    assert task.decode(denser, specs)["layer.weight"].nnz > 0  # without it: any codec


def test_decode_frame_checks_the_codec_before_the_schema() -> None:
    payload = UpdateCodec("topk:0.05+uniform:8").encode(sample_update())
    codec, _ = decode_frame(payload, expected_codec="topk:0.05+uniform:8")
    assert codec == "topk:0.05+uniform:8"
    with pytest.raises(UnexpectedCodec, match="another codec"):
        decode_frame(payload, expected_codec="none+fp32")
    with pytest.raises(UnexpectedCodec):  # the schema would not match either
        decode_frame(payload, expected={"x": TensorSpec("x", (2,))}, expected_codec="x")


def test_typed_config_and_spec_give_the_same_bytes() -> None:
    update = sample_update()
    typed = UpdateCodec(PipelineConfig(TopKConfig(0.01), UniformConfig(8)))
    assert typed.spec == "topk:0.01+uniform:8"
    assert typed.encode(update) == UpdateCodec("topk:0.01+uniform:8").encode(update)


def test_payload_array_round_trip() -> None:
    payload = UpdateCodec("topk:0.01+uniform:8").encode(sample_update())
    array = payload_to_array(payload)
    assert array.dtype == np.uint8 and array.ndim == 1 and array.flags.writeable
    assert array_to_payload(array) == payload
    assert sorted(UpdateCodec().decode(array)) == sorted(sample_update())
    with pytest.raises(ValueError, match="1-d uint8"):
        array_to_payload(array.astype(np.int16))


# -- what the decoder refuses ---------------------------------------------------------


def frame(codec: str, *tensors: CompressedTensor) -> bytes:
    return encode_frame(codec, list(tensors))


def fp32_tensor(
    name: str, values: Sequence[float] | np.ndarray, index: np.ndarray | None = None, numel: int = 0
) -> CompressedTensor:
    array = np.asarray(values, dtype=np.float32)
    mode: IndexMode = "dense" if index is None else "explicit"
    n = numel or array.size
    return CompressedTensor(
        TensorSpec(name, (n,)), mode, index, QuantizedValues("fp32", 32, array.view(np.uint32))
    )


def test_expected_model_mismatches() -> None:
    update = sample_update()
    payload = UpdateCodec("topk:0.1").encode(update)
    expected = tensor_specs(update)
    missing = dict(expected)
    missing["extra"] = TensorSpec("extra", (3,))
    with pytest.raises(UpdateMismatch, match="not the expected model's"):
        UpdateCodec().decode(payload, expected=missing)
    fewer = dict(expected)
    del fewer["scale"]
    with pytest.raises(UpdateMismatch):
        UpdateCodec().decode(payload, expected=fewer)
    reshaped = dict(expected)
    reshaped["layer.weight"] = TensorSpec("layer.weight", (300, 200))
    with pytest.raises(UpdateMismatch, match="shape or dtype"):
        UpdateCodec().decode(payload, expected=reshaped)
    retyped = dict(expected)
    retyped["layer.bias"] = TensorSpec("layer.bias", (300,), "float32")
    with pytest.raises(UpdateMismatch, match="shape or dtype"):
        UpdateCodec().decode(payload, expected=retyped)


def test_non_finite_decoded_values_are_refused() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        payload = frame("none+fp32", fp32_tensor("w", [1.0, bad, 3.0]))
        with pytest.raises(NonFiniteUpdate, match="NaN or Inf"):
            UpdateCodec().decode(payload)
    # fp16 codes for Inf
    inf16 = np.array([0x7C00], dtype=np.uint16)
    t = CompressedTensor(TensorSpec("w", (1,)), "dense", None, QuantizedValues("fp16", 16, inf16))
    with pytest.raises(NonFiniteUpdate):
        UpdateCodec().decode(frame("none+fp16", t))


def test_frames_that_contradict_their_codec() -> None:
    # More values than topk:0.1 would ever send.
    idx = np.arange(0, 100, 2, dtype=np.int64)
    payload = frame("topk:0.1+fp32", fp32_tensor("w", np.ones(50), idx, numel=100))
    with pytest.raises(CodecMismatch, match="more values than"):
        UpdateCodec().decode(payload)
    # Dense codes under a sparsifier that sends positions.
    with pytest.raises(CodecMismatch, match="index mode"):
        UpdateCodec().decode(frame("topk:1.0+fp32", fp32_tensor("w", np.ones(4))))
    # 8-bit codes in a frame that says uniform:4.
    codes = QuantizedValues(
        "uniform",
        8,
        np.zeros(4, np.uint8),
        {"min": np.zeros(1, np.float32), "scale": np.ones(1, np.float32)},
    )
    t = CompressedTensor(TensorSpec("w", (4,)), "dense", None, codes)
    with pytest.raises(CodecMismatch, match="scheme/bits"):
        UpdateCodec().decode(frame("none+uniform:4", t))
    # A mask tensor with the wrong number of values.
    q = QuantizedValues("fp32", 32, np.zeros(3, np.uint32))
    t = CompressedTensor(TensorSpec("w", (1000,)), "mask", None, q)
    with pytest.raises(CodecMismatch, match="shared mask"):
        UpdateCodec().decode(frame("mask:0.1,seed=1+fp32", t))
    # A huge declared tensor is refused on its count, before any mask is drawn.
    huge = CompressedTensor(TensorSpec("w", (1 << 33,)), "mask", None, q)
    with pytest.raises(CodecMismatch, match="shared mask"):
        UpdateCodec().decode(frame("mask:1.0,seed=1+fp32", huge))
    # An explicit mask of another shape.
    masks = {"w": torch.ones(10, dtype=torch.bool)}
    digest_spec = UpdateCodec("mask+fp32", masks=masks).spec
    with pytest.raises(CodecMismatch, match="entries"):
        UpdateCodec(masks=masks).decode(frame(digest_spec, t))


def test_unknown_or_malformed_codec_strings() -> None:
    with pytest.raises(UnknownCodec, match="unknown stage 'zstd'"):
        UpdateCodec().decode(frame("zstd:9", fp32_tensor("w", [1.0])))
    with pytest.raises(UnknownCodec, match="density must be in"):
        UpdateCodec().decode(frame("topk:7+fp32", fp32_tensor("w", [1.0], np.array([0]))))


def test_garbage_is_a_payload_error() -> None:
    payload = UpdateCodec("topk:0.1+uniform:8").encode(sample_update())
    for broken in (b"", b"garbage" * 10, payload[:-5], payload[:30] + b"\x00" + payload[31:]):
        with pytest.raises(PayloadError):
            UpdateCodec().decode(broken)


def test_encode_rejects_what_it_cannot_send() -> None:
    codec = UpdateCodec("topk:0.5")
    with pytest.raises(NonFiniteInputError):
        codec.encode({"w": torch.tensor([1.0, float("nan"), 2.0])})
    with pytest.raises(ValueError, match="only floating tensors"):
        codec.encode({"steps": torch.tensor([3])})
    with pytest.raises(SpecError):
        UpdateCodec("topk:5")
    with pytest.raises(SpecError, match="needs masks"):
        UpdateCodec("mask")
    with pytest.raises(ValueError, match="seed must be an int"):
        UpdateCodec(seed=1.5)  # type: ignore[arg-type]


def test_derive_seed_is_pinned() -> None:
    # BLAKE2b, not hash(): the same in every process. A pinned value, because a change
    # here silently changes every stochastic payload ever written.
    assert derive_seed(0, "w") == 2886932253226512315
    assert derive_seed(0, "ab", "c") != derive_seed(0, "a", "bc")
    assert 0 <= derive_seed(-5, "x", 3) < 2**63


# --------------------------------------------------------------------------------------
# Frames for a receiver that knows the model: the schema digest instead of the table.
# --------------------------------------------------------------------------------------


def test_codec_with_specs_writes_digest_frames() -> None:
    g = torch.Generator().manual_seed(4)
    update = {
        "conv.weight": torch.randn(8, 3, 3, 3, generator=g),
        "fc.weight": torch.randn(10, 200, generator=g),
        "fc.bias": torch.randn(10, generator=g),
    }
    specs = tensor_specs(update)
    sender = UpdateCodec("topk:0.05+uniform:8", seed=1, specs=specs)
    table_sender = UpdateCodec("topk:0.05+uniform:8", seed=1)
    digest_frame, table_frame = sender.encode(update), table_sender.encode(update)
    # Same values and positions; only the table's bytes are gone (names, shapes).
    assert len(digest_frame) < len(table_frame)
    want = table_sender.decode(table_frame)
    for got in (
        UpdateCodec(specs=specs).decode(digest_frame),  # the receiver's own specs
        UpdateCodec().decode(digest_frame, expected=dict(reversed(specs.items()))),
    ):
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name].indices, want[name].indices)
            assert torch.equal(got[name].values, want[name].values)
    with pytest.raises(SchemaRequired, match="expected="):
        UpdateCodec().decode(digest_frame)
    other = dict(specs, **{"fc.bias": TensorSpec("fc.bias", (11,))})
    with pytest.raises(UpdateMismatch, match="schema digest"):
        UpdateCodec().decode(digest_frame, expected=other)
    with pytest.raises(ValueError, match="not the codec's specs"):
        sender.encode({"fc.bias": update["fc.bias"]})
    # Copies for other densities keep writing digest frames.
    denser = sender.with_density(0.1).encode(update)
    assert len(denser) < len(table_sender.with_density(0.1).encode(update))
    with pytest.raises(ValueError, match="schema"):
        UpdateCodec("topk:0.1+fp32", schema="digest")
