"""The ``rht`` rotation stage: the transform, its signs, the codec path and bad frames.

* the FWHT against a dense float64 Hadamard matrix, orthonormal and its own inverse;
  the whole rotation (blocks plus the overlapping last block) against the matrix it
  documents, orthonormal, inverted exactly; slabs change nothing;
* the signs: the C ``lowbias32`` (numpy uint32), no int64 overflow, balanced, any
  slice drawable alone; everything on the values' device (``meta`` stands in for one);
* through the codec, on heavy-tailed tensors: ``none+rht+uniform:b`` against
  ``none+uniform:b``, the same payload bytes plus the seed and the longer codec name;
  error feedback with the rotation tracks the sum of the inputs;
* bad frames and inputs: a missing or unexpected frame seed (a frame of no tensors
  too), an absurd block, values that overflow when rotated or unrotated: only typed
  errors.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.compression import (
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    SpecError,
    UnknownCodec,
    parse_spec,
)
from fedsync.compression.rotations import hadamard
from fedsync.compression.rotations.hadamard import (
    MAX_BLOCK,
    RandomizedHadamard,
    RHTConfig,
    block_for,
    fwht,
    lowbias32,
    rademacher_signs,
)
from fedsync.compression.seeding import derive_seed
from fedsync.wire import PayloadError, decode_frame, encode_frame, inspect_frame
from fedsync.wire.layout import FLAG_SEED
from fedsync.wire.testing import FrameBuilder


def _hadamard(n: int) -> np.ndarray:
    """Sylvester's Hadamard matrix of size ``n`` (float64, entries +-1)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


# --------------------------------------------------------------------------------------
# The transform
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64, 256])
def test_fwht_is_the_dense_orthonormal_hadamard(n: int) -> None:
    x = torch.from_numpy(np.random.default_rng(n).standard_normal((5, n)).astype(np.float32))
    want = x.double().numpy() @ _hadamard(n).T / np.sqrt(n)
    got = fwht(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-5)
    # Its matrix (the transform of the identity) is orthonormal, in float64.
    matrix = fwht(torch.eye(n)).double().numpy()
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(n), rtol=0, atol=1e-6)
    # Its own inverse, to float32 rounding; the input is not changed.
    before = x.clone()
    torch.testing.assert_close(fwht(fwht(x)), x, rtol=0, atol=1e-5)
    assert torch.equal(x, before)


def test_fwht_needs_a_power_of_two() -> None:
    for n in (0, 3, 12):
        with pytest.raises(ValueError, match="power-of-two"):
            fwht(torch.zeros(2, n))


def _dense_rotation(n: int, block: int, name: str, seed: int) -> np.ndarray:
    """The rotation of ``n`` values as the float64 matrix the module docstring
    describes: blocks of ``H D / sqrt(b)``, then the last ``b`` values once more."""
    b = block_for(n, block)
    key = derive_seed(seed, name, "rht")
    last = derive_seed(seed, name, "rht", "last")
    h = _hadamard(b) / np.sqrt(b)
    first = np.eye(n)
    signs = rademacher_signs(key, 0, n).double().numpy()
    for start in range(0, n - n % b, b):
        rows = slice(start, start + b)
        first[rows, rows] = h * signs[rows][None, :]
    second = np.eye(n)
    if n % b:
        rows = slice(n - b, n)
        second[rows, rows] = h * rademacher_signs(last, 0, b).double().numpy()[None, :]
    return second @ first


@pytest.mark.parametrize(("n", "block"), [(1, 4), (3, 4), (8, 8), (13, 8), (40, 16), (97, 1024)])
def test_rotation_is_the_documented_orthonormal_matrix(n: int, block: int) -> None:
    rotation = RandomizedHadamard(RHTConfig(block))
    want = _dense_rotation(n, block, "layer.w", 11)
    np.testing.assert_allclose(want @ want.T, np.eye(n), rtol=0, atol=1e-12)
    got = torch.stack([rotation.rotate("layer.w", e, 11) for e in torch.eye(n)], dim=1)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-6)
    back = torch.stack([rotation.unrotate("layer.w", e, 11) for e in torch.eye(n)], dim=1)
    np.testing.assert_allclose(back.double().numpy(), want.T, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 1000, 1024, 1025, 5000, 70_001])
def test_unrotate_inverts_rotate(n: int) -> None:
    x = torch.from_numpy(np.random.default_rng(n).standard_t(2.0, n).astype(np.float32))
    rotation = RandomizedHadamard(RHTConfig())
    y = rotation.rotate("w", x, 3)
    assert y.shape == x.shape and y.dtype == torch.float32
    if n:
        # Orthonormal: the norm is kept, to float32 rounding of the sums.
        assert abs(float(y.double().norm() / x.double().norm()) - 1.0) < 1e-6
    back = rotation.unrotate("w", y, 3)
    if n:
        assert float((back - x).abs().max()) <= 1e-6 * float(x.abs().max())
    # Another seed or another tensor name is another rotation.
    if n > 2:
        assert not torch.equal(rotation.rotate("w", x, 4), y)
        assert not torch.equal(rotation.rotate("v", x, 3), y)


def test_slabs_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0))
    rotation = RandomizedHadamard(RHTConfig(256))
    whole = rotation.rotate("w", x, 9)
    monkeypatch.setattr(hadamard, "SLAB", 1024)  # 19 slabs of 4 blocks and a short one
    assert torch.equal(rotation.rotate("w", x, 9), whole)
    assert torch.equal(
        rotation.unrotate("w", whole, 9), RandomizedHadamard(RHTConfig(256)).unrotate("w", whole, 9)
    )


def test_heavy_coordinates_are_spread() -> None:
    # One coordinate 1000x the others: after the rotation no coordinate of its block
    # holds more than a few times its fair share of the block's energy.
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 0.01
    x[1234] = 10.0
    y = RandomizedHadamard(RHTConfig(1024)).rotate("w", x, 0)
    block = y[1024:2048]
    assert float(block.abs().max()) < 4 * float(block.norm()) / 1024**0.5
    assert float(x[1024:2048].abs().max()) > 30 * float(x[1024:2048].norm()) / 1024**0.5


# --------------------------------------------------------------------------------------
# The signs
# --------------------------------------------------------------------------------------


def _lowbias32_reference(x: np.ndarray) -> np.ndarray:
    """The C reference on uint32 (numpy wraps the products mod 2**32)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x21F0AAAD)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0xD35A2D97)
        x ^= x >> np.uint32(15)
    return x


def test_lowbias32_is_the_reference_without_overflow() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([[0, 1, 2**31 - 1, 2**31, 2**32 - 1], rng.integers(0, 2**32, 10_000)])
    got = lowbias32(torch.from_numpy(x.astype(np.int64)))
    assert got.dtype == torch.int64
    assert int(got.min()) >= 0 and int(got.max()) < 2**32
    np.testing.assert_array_equal(got.numpy().astype(np.uint32), _lowbias32_reference(x))
    # The largest intermediate product stays below 2**63: (2**32 - 1) * 0xFFFF < 2**48.
    assert (2**32 - 1) * 0xFFFF < 2**63


def test_signs_are_balanced_and_sliceable() -> None:
    signs = rademacher_signs(12345, 0, 1 << 20)
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    # Balanced and uncorrelated at lags 1 and 32 (the hash's word size), within 5 sigma.
    bound = 5 / (1 << 10)
    assert abs(float(signs.mean())) < bound
    for lag in (1, 31, 32, 33):
        assert abs(float((signs[lag:] * signs[:-lag]).mean())) < bound
    # Any slice is drawn alone, at any offset within a word.
    for start, count in ((0, 1), (5, 100), (31, 2), (32, 64), (1000, 999)):
        assert torch.equal(rademacher_signs(12345, start, count), signs[start : start + count])
    assert rademacher_signs(12345, 7, 0).numel() == 0
    # Other keys differ; a key above 2**63 (a hostile u64 frame seed) is fine.
    assert not torch.equal(rademacher_signs(12346, 0, 256), signs[:256])
    assert rademacher_signs((1 << 64) - 1, 0, 64).abs().eq(1).all()


def test_everything_stays_on_the_values_device() -> None:
    # Only torch ops on the values' device: a meta tensor has no data, so anything that
    # reads values on the host (.item(), .numpy(), a host kernel) would fail here.
    # (test_device_resident counts host copies of the whole codec path with it.)
    rotation = RandomizedHadamard(RHTConfig(8))
    x = torch.empty(13, device="meta")
    assert rotation.rotate("w", x, 1).device.type == "meta"
    assert rotation.unrotate("w", x, 1).device.type == "meta"
    assert rademacher_signs(1, 3, 50, "meta").device.type == "meta"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rotates_bit_for_bit_as_the_cpu() -> None:
    x = torch.randn(70_001, generator=torch.Generator().manual_seed(2))
    rotation = RandomizedHadamard(RHTConfig())
    y = rotation.rotate("w", x.cuda(), 5)
    assert y.is_cuda and torch.equal(y.cpu(), rotation.rotate("w", x, 5))
    assert torch.equal(rotation.unrotate("w", y, 5).cpu(), rotation.unrotate("w", y.cpu(), 5))


# --------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------


def test_spec_places_the_rotation_between_sparsifier_and_quantizer() -> None:
    assert parse_spec("none+rht+uniform:4").to_spec() == "none+rht:1024+uniform:4"
    assert parse_spec("rht:block=64+uniform:4+ef").to_spec() == "none+rht:64+uniform:4+ef"
    config = parse_spec("topk:0.1+rht:256+uniform:4,chunk=256")
    assert config.rotation == RHTConfig(256)
    assert config.with_bits(2).to_spec() == "topk:0.1+rht:256+uniform:2,chunk=256"
    assert [s.kind for s in config.stages] == ["sparsifier", "rotation", "quantizer"]
    assert parse_spec("none+uniform:4").rotation is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("none+rht:3+uniform:4", "power of two"),
        ("none+rht:1+uniform:4", "power of two"),
        (f"none+rht:{2 * MAX_BLOCK}+uniform:4", "power of two in [2, 65536]"),
        ("none+rht:block=true+uniform:4", "block must be int"),
        ("none+uniform:4+rht", "out of order"),
        ("none+rht+rht", "repeated or out of order"),
        ("none+rht:seed=3", "unknown key 'seed'"),
    ],
)
def test_bad_rotation_specs(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(spec)


# --------------------------------------------------------------------------------------
# Through the codec
# --------------------------------------------------------------------------------------


def _heavy_tailed() -> dict[str, torch.Tensor]:
    """Two heavy-tailed 256 x 256 deltas and a Gaussian one, fixed seeds."""
    t = np.random.default_rng(0).standard_t(2.0, size=(256, 256)).astype(np.float32)
    rng = np.random.default_rng(1)
    outliers = rng.standard_normal((256, 256)).astype(np.float32)
    outliers.reshape(-1)[rng.choice(outliers.size, 16, replace=False)] *= 100.0
    gauss = np.random.default_rng(2).standard_normal((256, 256)).astype(np.float32)
    return {
        "student_t2": torch.from_numpy(t),
        "outliers": torch.from_numpy(outliers),
        "gauss": torch.from_numpy(gauss),
    }


def _round_trip(spec: str, x: torch.Tensor) -> tuple[float, bytes]:
    """Relative L2 error of one encode + decode of ``x``, and the frame."""
    update = {"w": x}
    payload = UpdateCodec(spec, seed=0, specs=tensor_specs(update)).encode(update)
    decoded = UpdateCodec(spec, specs=tensor_specs(update)).decode(payload, own_spec_only=True)
    return float((decoded["w"].to_dense() - x).norm() / x.norm()), payload


# Measured (these seeds; relative L2 error, plain -> rotated, bits 2 / 3 / 4):
# student_t2 2.99 -> 0.531, 1.12 -> 0.229, 0.533 -> 0.107;
# outliers   0.939 -> 0.455, 0.745 -> 0.181, 0.529 -> 0.085;
# gauss      0.643 -> 0.644, 0.273 -> 0.273, 0.127 -> 0.128.
@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("name", ["student_t2", "outliers"])
def test_rotation_cuts_the_error_on_heavy_tails(name: str, bits: int) -> None:
    x = _heavy_tailed()[name]
    plain, plain_frame = _round_trip(f"none+uniform:{bits}", x)
    rotated, rotated_frame = _round_trip(f"none+rht+uniform:{bits}", x)
    assert rotated < 0.35 * plain, (plain, rotated)
    if bits == 4:
        assert rotated < 0.15, rotated
    # Same codes and params; the frame adds the seed and the longer codec name.
    extra = len("none+rht:1024+uniform:4") - len("none+uniform:4")
    assert len(rotated_frame) == len(plain_frame) + 8 + extra
    (plain_layout,) = inspect_frame(plain_frame, expected=tensor_specs({"w": x}))[1]
    (rotated_layout,) = inspect_frame(rotated_frame, expected=tensor_specs({"w": x}))[1]
    assert rotated_layout == plain_layout


def test_rotation_costs_nothing_on_a_gaussian() -> None:
    x = _heavy_tailed()["gauss"]
    plain, _ = _round_trip("none+uniform:4", x)
    rotated, _ = _round_trip("none+rht+uniform:4", x)
    assert abs(rotated / plain - 1.0) < 0.02, (plain, rotated)


def test_error_feedback_with_rotation_tracks_the_sum_of_the_inputs() -> None:
    # 40 rounds of Student-t(2) deltas at 2 bits: what the receiver summed plus the
    # sender's residual is the sum of the inputs, and the residual stays bounded, so
    # the error of the sum shrinks relative to the sum as rounds go by.
    sender, receiver = UpdateCodec("none+rht+uniform:2+ef", seed=5), UpdateCodec()
    plain = UpdateCodec("none+rht+uniform:2", seed=5)
    rng = np.random.default_rng(3)
    total = torch.zeros(64, 256)
    decoded = torch.zeros(64, 256)
    decoded_plain = torch.zeros(64, 256)
    errors, residuals = [], []
    for _ in range(40):
        x = torch.from_numpy(rng.standard_t(2.0, size=(64, 256)).astype(np.float32))
        total += x
        decoded += receiver.decode(sender.encode({"w": x}))["w"].to_dense()
        decoded_plain += receiver.decode(plain.encode({"w": x}))["w"].to_dense()
        errors.append(float((decoded - total).norm() / total.norm()))
        residuals.append(float(sender.state.feedback.residuals["w"].norm()))
    residual = sender.state.feedback.residuals["w"].view(64, 256)
    assert float((decoded + residual - total).norm() / total.norm()) < 1e-5
    without = float((decoded_plain - total).norm() / total.norm())
    # Measured: 0.093 with feedback (0.132 after 10 rounds), 0.446 without; the
    # residual's norm peaks at 512 in the first 20 rounds and at 333 in the last 20
    # (one input's is about 390).
    assert errors[-1] < 0.15, errors[-1]
    assert errors[-1] < 0.3 * without, (errors[-1], without)
    assert errors[-1] < errors[9], (errors[9], errors[-1])
    assert max(residuals[20:]) < 1.2 * max(residuals[:20]), residuals


@pytest.mark.parametrize(
    "spec",
    [
        "topk:0.1+rht:256+uniform:4,chunk=256+ef",
        "mask:0.3,seed=1+rht+sign+ef",
        "powersgd:2+rht:64+uniform:8",
        "dct:4,chunk=64+rht+uniform:8",
        "none+rht+fp32",
    ],
)
def test_rotation_composes_with_every_index_mode(spec: str) -> None:
    # The rotation acts on the kept values: positions and counts are the unrotated
    # pipeline's, so the frames of the same spec without it have the same layouts.
    g = torch.Generator().manual_seed(4)
    update = {"w": torch.randn(48, 70, generator=g), "b": torch.randn(7, generator=g)}
    plain_spec = spec.replace("+rht:256", "").replace("+rht:64", "").replace("+rht", "")
    rotated = UpdateCodec(spec, seed=2).encode(update)
    plain = UpdateCodec(plain_spec, seed=2).encode(update)
    assert [replace(t, coding_param=0) for t in inspect_frame(rotated)[1]] == [
        replace(t, coding_param=0) for t in inspect_frame(plain)[1]
    ]
    decoded = UpdateCodec().decode(rotated)
    assert set(decoded) == {"w", "b"}
    if spec == "none+rht+fp32":  # lossless values: the rotation alone, inverted
        for name, x in update.items():
            torch.testing.assert_close(decoded[name].to_dense(), x, rtol=0, atol=1e-5)


def test_sender_sees_what_the_receiver_decodes() -> None:
    # Error feedback subtracts Pipeline.sent: it must be the receiver's decode exactly.
    sender = UpdateCodec("none+rht:128+uniform:3,chunk=128+ef", seed=1)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(6)) ** 3
    decoded = UpdateCodec().decode(sender.encode({"w": x}))["w"].to_dense()
    residual = sender.state.feedback.residuals["w"]
    assert torch.equal(x - decoded, residual)


# --------------------------------------------------------------------------------------
# Bad frames and inputs: typed errors only
# --------------------------------------------------------------------------------------


def _frame(spec: str, update: dict[str, torch.Tensor]) -> bytes:
    return UpdateCodec(spec, seed=1).encode(update)


def test_a_rotated_frame_without_its_seed_is_refused() -> None:
    update = {"w": torch.randn(300)}
    codec, tensors = decode_frame(_frame("none+rht+uniform:4", update))
    stripped = encode_frame(codec, [replace(t, seed=None) for t in tensors])
    with pytest.raises(CodecMismatch, match="field 'seed'") as info:
        UpdateCodec().decode(stripped)
    assert "expected a frame seed, got none" in str(info.value)
    assert isinstance(info.value, PayloadError)


def test_a_seed_without_a_rotation_is_refused() -> None:
    update = {"w": torch.randn(300)}
    codec, tensors = decode_frame(_frame("none+uniform:4", update))
    seeded = encode_frame(codec, [replace(t, seed=7) for t in tensors])
    with pytest.raises(CodecMismatch, match="expected none, got a frame seed"):
        UpdateCodec().decode(seeded)


@pytest.mark.parametrize("spec", ["none+rht+uniform:4", "none+rht+fp32"])
def test_the_seed_rule_holds_for_a_frame_of_no_tensors(spec: str) -> None:
    # The sender writes a rotating codec's seed with no tensor to carry it; the
    # receiver checks the rule once per frame, on the header, not per tensor.
    payload = UpdateCodec(spec, seed=1).encode({})
    assert payload[5] & FLAG_SEED
    assert UpdateCodec().decode(payload) == {}
    assert UpdateCodec(spec).decode(payload, own_spec_only=True) == {}
    stripped = FrameBuilder(codec=UpdateCodec(spec).spec).build()
    with pytest.raises(CodecMismatch, match="expected a frame seed, got none"):
        UpdateCodec().decode(stripped)
    # Before the schema: a digest-only frame is refused on its header, not for
    # the specs it would need.
    digest_only = FrameBuilder(codec=UpdateCodec(spec).spec, digest=bytes(8)).build()
    with pytest.raises(CodecMismatch, match="field 'seed'"):
        UpdateCodec().decode(digest_only)
    # And the other way: a seed in a frame of a codec that does not rotate.
    seeded = FrameBuilder(codec="none+fp32", seed=5).build()
    with pytest.raises(CodecMismatch, match="expected none, got a frame seed"):
        UpdateCodec().decode(seeded)
    # A codec that does not rotate writes what it always wrote.
    assert UpdateCodec("none+fp32").encode({}) == encode_frame("none+fp32", [])


@pytest.mark.parametrize("block", ["3", "131072", "0", str(2**63), "9" * 40, "-4"])
def test_absurd_blocks_in_a_frame_are_unknown_codecs(block: str) -> None:
    _, tensors = decode_frame(_frame("none+rht+uniform:4", {"w": torch.randn(64)}))
    payload = encode_frame(f"none+rht:{block}+uniform:4", tensors)
    with pytest.raises(UnknownCodec):
        UpdateCodec().decode(payload)


def test_a_frame_under_another_block_decodes_to_other_values_not_an_error() -> None:
    # The block is the codec's: a frame relabelled with another one is well formed and
    # decodes (to the wrong values); own_spec_only is what holds a receiver to its spec.
    x = torch.randn(4096, generator=torch.Generator().manual_seed(8))
    _, tensors = decode_frame(_frame("none+rht+fp32", {"w": x}))
    relabelled = encode_frame("none+rht:64+fp32", tensors)
    assert not torch.allclose(UpdateCodec().decode(relabelled)["w"].to_dense(), x, atol=1e-3)
    with pytest.raises(PayloadError, match="another codec"):
        UpdateCodec("none+rht+fp32").decode(relabelled, own_spec_only=True)


def test_values_that_overflow_when_rotated_are_refused_by_both_ends() -> None:
    # The sender: the block sums of 1e37 leave float32.
    with pytest.raises(NonFiniteInputError, match="overflows float32 when rotated"):
        UpdateCodec("none+rht+fp32").encode({"w": torch.full((1024,), 1e37)})
    # The receiver: finite fp32 codes whose inverse rotation overflows.
    _, tensors = decode_frame(_frame("none+rht+fp32", {"w": torch.randn(1024)}))
    (tensor,) = tensors
    huge = np.full(1024, 1e37, dtype=np.float32).view(np.uint32)
    hostile = replace(tensor, values=replace(tensor.values, codes=huge))
    with pytest.raises(NonFiniteUpdate, match="inverse rotation overflows"):
        UpdateCodec().decode(encode_frame("none+rht:1024+fp32", [hostile]))


def test_a_non_finite_value_in_a_rotated_frame_is_refused_before_the_inverse() -> None:
    _, (tensor,) = decode_frame(_frame("none+rht+fp32", {"w": torch.randn(64)}))
    codes = np.asarray(tensor.values.codes).copy()
    codes[5] = np.float32(np.nan).view(np.uint32)
    hostile = replace(tensor, values=replace(tensor.values, codes=codes))
    with pytest.raises(NonFiniteUpdate, match="decoded values hold NaN or Inf"):
        UpdateCodec().decode(encode_frame("none+rht:1024+fp32", [hostile]))
