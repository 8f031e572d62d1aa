"""Frame round trips, the byte layout, exact sizes and the encoder's input checks."""

from __future__ import annotations

import struct
import zlib
from dataclasses import replace
from typing import get_args

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsync.updates import (
    CompressedTensor,
    IndexMode,
    QuantizedValues,
    TensorSpec,
    matrix_dims,
)
from fedsync.wire import (
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MAGIC,
    decode_frame,
    encode_frame,
    index_bits_for,
    inspect_frame,
    schema_digest,
)
from fedsync.wire.index_coding import choose_index_coding
from fedsync.wire.layout import FLAG_SEED, FLAG_TABLE
from fedsync.wire.registry import DTYPE_CODES, INDEX_CODINGS, SCHEME_CODES

# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------

SPECIAL_SHAPES = [(), (0,), (0, 5), (5, 0, 3), (1,), (1, 4000), (3000, 1), (1, 1, 1, 1, 7)]


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, ...]:
    if draw(st.booleans()):
        return draw(st.sampled_from(SPECIAL_SHAPES))
    return tuple(draw(st.lists(st.integers(0, 12), min_size=0, max_size=4)))


@st.composite
def compressed_tensors(draw: st.DrawFn, name: str) -> CompressedTensor:
    shape = draw(shapes())
    spec = TensorSpec(name, shape, draw(st.sampled_from(sorted(DTYPE_CODES))))
    numel = spec.numel
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mode = draw(st.sampled_from(get_args(IndexMode)))
    density = draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)))
    count = numel if mode == "dense" else round(density * numel)
    dims = matrix_dims(shape)
    if mode == "lowrank":
        if dims is None or min(dims) == 0:
            mode = "dense"  # factors need a matrix with no empty dimension
            count = numel
        else:
            count = draw(st.integers(1, min(dims))) * sum(dims)
    indices = None
    if mode == "explicit":
        indices = np.sort(rng.choice(numel, count, replace=False)).astype(np.int64)
    bits = draw(st.integers(1, 32))
    codes = rng.integers(0, 1 << bits, count, dtype=np.uint64)
    # Any unsigned or signed dtype wide enough for the codes is accepted on the way in.
    wide_enough = [
        d
        for d in (np.uint8, np.uint16, np.uint32, np.uint64, np.int64)
        if np.iinfo(d).bits - (np.iinfo(d).min < 0) >= bits
    ]
    codes = codes.astype(draw(st.sampled_from(wide_enough)))
    params = {
        draw(st.text(max_size=6)): rng.standard_normal(draw(st.integers(0, 5))).astype(np.float32)
        for _ in range(draw(st.integers(0, 3)))
    }
    values = QuantizedValues(draw(st.sampled_from(sorted(SCHEME_CODES))), bits, codes, params)
    return CompressedTensor(spec, mode, indices, values)


@st.composite
def frames(draw: st.DrawFn) -> tuple[str, list[CompressedTensor]]:
    names = draw(st.lists(st.text(max_size=12), min_size=0, max_size=4, unique=True))
    return draw(st.text(max_size=40)), [draw(compressed_tensors(name)) for name in names]


def assert_same_tensor(got: CompressedTensor, want: CompressedTensor) -> None:
    assert got.spec == TensorSpec(want.spec.name, tuple(want.spec.shape), want.spec.dtype)
    assert got.index_mode == want.index_mode
    if want.indices is None:
        assert got.indices is None
    else:
        assert got.indices is not None and got.indices.dtype == np.int64
        np.testing.assert_array_equal(got.indices, want.indices)
    assert got.values.scheme == want.values.scheme
    assert got.values.bits == want.values.bits
    bits = want.values.bits
    expected_dtype = np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32
    assert got.values.codes.dtype == expected_dtype
    np.testing.assert_array_equal(got.values.codes, np.asarray(want.values.codes, np.uint64))
    assert list(got.values.params) == list(want.values.params)
    for key, array in want.values.params.items():
        # Bitwise, so NaN payloads and signed zeros count too.
        np.testing.assert_array_equal(
            got.values.params[key].view(np.uint32), np.asarray(array, np.float32).view(np.uint32)
        )


# --------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames())
def test_decode_inverts_encode(case: tuple[str, list[CompressedTensor]]) -> None:
    codec, tensors = case
    payload = encode_frame(codec, tensors)
    got_codec, got = decode_frame(payload)
    assert got_codec == codec
    assert len(got) == len(tensors)
    for got_tensor, want in zip(got, tensors, strict=True):
        assert_same_tensor(got_tensor, want)
    # Encoding is a function of the contents: the decoded tensors encode to the same bytes.
    assert encode_frame(got_codec, got) == payload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compressed_tensors("w"))
def test_chosen_coding_is_the_smallest_and_sizes_are_exact(tensor: CompressedTensor) -> None:
    if tensor.index_mode != "explicit":
        return
    assert tensor.indices is not None
    numel = tensor.spec.numel
    shape = tensor.spec.shape
    bits = index_bits_for(tensor.indices, numel, shape=shape)
    auto = encode_frame("c", [tensor])
    forced = {coding: encode_frame("c", [tensor], index_coding=coding) for coding in bits}
    assert set(bits) <= set(INDEX_CODINGS)
    # The frame size difference between two codings is exactly their bit difference.
    base = min(bits, key=lambda c: (bits[c], INDEX_CODINGS.index(c)))
    for coding, payload in forced.items():
        assert 8 * (len(payload) - len(forced[base])) == bits[coding] - bits[base]
    # The encoder's choice is the smallest it tried (context only where it looked
    # worth trying) and never worse than the codings other than context.
    choice = choose_index_coding(np.asarray(tensor.indices, np.int64), numel, shape=shape)
    assert auto == forced[choice.coding]
    assert bits[choice.coding] <= min(v for c, v in bits.items() if c != "context")
    _, (layout,) = inspect_frame(auto)
    assert layout.coding == choice.coding
    for payload in forced.values():
        _, got = decode_frame(payload)
        assert_same_tensor(got[0], tensor)


@pytest.mark.parametrize("bits", range(1, 33))
def test_every_bit_width_in_every_mode(bits: int) -> None:
    rng = np.random.default_rng(bits)
    numel = 257  # odd, so no mode ends on a byte boundary by accident
    kept = np.sort(rng.choice(numel, 40, replace=False))
    extremes = np.array([0, (1 << bits) - 1], dtype=np.uint64)
    tensors = []
    for mode, count in (("explicit", 40), ("dense", numel), ("mask", 40)):
        codes = np.concatenate([extremes, rng.integers(0, 1 << bits, count - 2, dtype=np.uint64)])
        tensors.append(
            CompressedTensor(
                TensorSpec(mode, (numel,)),
                mode,  # type: ignore[arg-type]
                kept if mode == "explicit" else None,
                QuantizedValues("uniform", bits, codes),
            )
        )
    _, got = decode_frame(encode_frame("b", tensors))
    for got_tensor, want in zip(got, tensors, strict=True):
        assert_same_tensor(got_tensor, want)


def test_decode_accepts_any_bytes_like_payload() -> None:
    tensor = CompressedTensor(
        TensorSpec("w", (3,)),
        "dense",
        None,
        QuantizedValues("fp16", 16, np.arange(3, dtype=np.uint16)),
    )
    payload = encode_frame("fp16", [tensor])
    as_array = np.frombuffer(payload, dtype=np.uint8)
    for form in (payload, bytearray(payload), memoryview(payload), as_array, as_array.copy()):
        codec, (got,) = decode_frame(form)
        assert codec == "fp16"
        assert_same_tensor(got, tensor)


def test_empty_frame() -> None:
    payload = encode_frame("", [])
    assert len(payload) == 14 + 3 + 4  # codec length, tensor count, format count
    assert decode_frame(payload) == ("", [])


# --------------------------------------------------------------------------------------
# The byte layout, pinned by a frame written out by hand.
# --------------------------------------------------------------------------------------


def _golden_tensors() -> list[CompressedTensor]:
    return [
        CompressedTensor(
            TensorSpec("w", (2, 3), "float16"),
            "explicit",
            np.array([1, 4]),
            QuantizedValues(
                "uniform", 4, np.array([3, 10], np.uint8), {"s": np.array([1.5], np.float32)}
            ),
        ),
        CompressedTensor(
            TensorSpec("b", (3,)),
            "dense",
            None,
            QuantizedValues(
                "uniform", 4, np.array([1, 2, 3], np.uint8), {"s": np.array([2.0], np.float32)}
            ),
        ),
    ]


def _sealed(flags: int, body: bytes) -> bytes:
    head = MAGIC + bytes([FORMAT_VERSION, flags]) + struct.pack("<Q", 14 + len(body) + 4)
    return head + body + struct.pack("<I", zlib.crc32(head + body))


# Index candidates for {1, 4} in 6: bitmap 1 byte; Elias-Fano L=1: 1 + 1 bytes plus
# its parameter byte; Rice k=1 (gaps 1, 2: 5 bits) 1 byte plus parameter and length.
# Bitmap wins. Both tensors share one format (uniform, 4 bits, one param "s" of one
# float), so the format table holds it once and no entry names a format.
_GOLDEN_FORMATS = b"".join(
    [
        b"\x01",  # format count
        bytes([4, 4]),  # scheme uniform, 4 bits
        b"\x01" + b"\x01s" + b"\x02",  # one param "s", 1 float in every tensor (L = 1 + 1)
    ]
)
_GOLDEN_ENTRIES_AND_DATA = b"".join(
    [
        bytes([0x02]),  # "w": mode explicit (0) << 4 | coding bitmap (2)
        b"\x02",  # value count
        bytes([0x10]),  # 'b': mode dense (1) << 4 | coding none (0); count implied
        struct.pack("<f", 1.5),  # 'w' param data
        bytes([0b0001_0010]),  # bitmap: bits 1 and 4
        bytes([0xA3]),  # codes 3, 10 at 4 bits, little-endian
        struct.pack("<f", 2.0),  # 'b' param data
        bytes([0x21, 0x03]),  # codes 1, 2, 3 at 4 bits
    ]
)


def test_golden_frame_layout_with_table() -> None:
    payload = encode_frame("topk", _golden_tensors())
    body = b"".join(
        [
            b"\x04topk",  # codec
            b"\x02",  # tensor count
            b"\x01w" + bytes([2]) + bytes([2, 2, 3]),  # name, dtype float16, ndim, shape
            b"\x01b" + bytes([1]) + bytes([1, 3]),  # name, dtype float32, ndim, shape
            _GOLDEN_FORMATS,
            _GOLDEN_ENTRIES_AND_DATA,
        ]
    )
    assert payload == _sealed(FLAG_TABLE, body)


def test_golden_frame_layout_with_digest() -> None:
    tensors = _golden_tensors()
    payload = encode_frame("topk", tensors, schema="digest")
    # Name order: 'b' before 'w'; the entries and data follow it.
    reordered = _golden_tensors()[::-1]
    table_frame = encode_frame("topk", reordered)
    body = b"".join(
        [
            b"\x04topk",
            schema_digest([t.spec for t in tensors]),
            _GOLDEN_FORMATS,
            bytes([0x10]),  # 'b' first
            bytes([0x02]) + b"\x02",  # then "w"
            struct.pack("<f", 2.0) + bytes([0x21, 0x03]),
            struct.pack("<f", 1.5) + bytes([0b0001_0010]) + bytes([0xA3]),
        ]
    )
    assert payload == _sealed(0, body)
    # The table costs its count, 6 + 5 bytes of entries; the digest 8.
    assert len(table_frame) - len(payload) == 1 + 6 + 5 - 8


def test_golden_frame_layout_with_seed() -> None:
    # A rotation's frame seed: flag bit 1 and 8 bytes after the codec, once per frame;
    # everything else is the seedless frame's, byte for byte.
    seed = 0x0123456789ABCDEF
    payload = encode_frame("topk", [replace(t, seed=seed) for t in _golden_tensors()])
    body = b"".join(
        [
            b"\x04topk",
            bytes.fromhex("efcdab8967452301"),  # the seed, u64 little-endian
            b"\x02",
            b"\x01w" + bytes([2]) + bytes([2, 2, 3]),
            b"\x01b" + bytes([1]) + bytes([1, 3]),
            _GOLDEN_FORMATS,
            _GOLDEN_ENTRIES_AND_DATA,
        ]
    )
    assert payload == _sealed(FLAG_TABLE | FLAG_SEED, body)
    assert len(payload) == len(encode_frame("topk", _golden_tensors())) + 8
    assert [t.seed for t in decode_frame(payload)[1]] == [seed, seed]
    digest = encode_frame(
        "topk", [replace(t, seed=seed) for t in _golden_tensors()], schema="digest"
    )
    assert digest[5] == FLAG_SEED
    specs = [t.spec for t in _golden_tensors()]
    assert [t.seed for t in decode_frame(digest, expected=specs)[1]] == [seed, seed]


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ((1, None), "differs from the first tensor's 1"),
        ((None, 1), "differs from the first tensor's None"),
        ((1, 2), "frame seed 2 differs"),
        ((-1, -1), "must be an int in [0, 2**64)"),
        ((1 << 64, 1 << 64), "must be an int in [0, 2**64)"),
    ],
)
def test_frame_seed_must_be_one_valid_seed(seeds: tuple[int | None, ...], message: str) -> None:
    tensors = [replace(t, seed=s) for t, s in zip(_golden_tensors(), seeds, strict=True)]
    with pytest.raises(ValueError) as info:
        encode_frame("topk", tensors)
    assert message in str(info.value)


def test_a_given_frame_seed_travels_without_tensors_and_binds_every_tensor() -> None:
    # A rotating codec's frame carries its seed even with no tensor to carry it.
    payload = encode_frame("c", [], seed=0x0123456789ABCDEF)
    assert payload == _sealed(
        FLAG_TABLE | FLAG_SEED, b"\x01c" + bytes.fromhex("efcdab8967452301") + b"\x00\x00"
    )
    assert decode_frame(payload) == ("c", [])
    assert encode_frame("c", []) == _sealed(FLAG_TABLE, b"\x01c\x00\x00")  # as before
    # With tensors: the same bytes as their own seed gives, and it must be theirs.
    seeded = [replace(t, seed=7) for t in _golden_tensors()]
    assert encode_frame("topk", seeded, seed=7) == encode_frame("topk", seeded)
    for tensors in (seeded, _golden_tensors()):
        with pytest.raises(ValueError, match="differs from the frame's 8"):
            encode_frame("topk", tensors, seed=8)
    with pytest.raises(ValueError, match=r"must be an int in \[0, 2\*\*64\)"):
        encode_frame("c", [], seed=1 << 64)


# --------------------------------------------------------------------------------------
# inspect_frame
# --------------------------------------------------------------------------------------


def test_inspect_frame_reports_real_byte_counts() -> None:
    rng = np.random.default_rng(3)
    numel = 100_000
    indices = np.sort(rng.choice(numel, 1000, replace=False))
    codes = rng.integers(0, 8, 1000).astype(np.uint8)
    tensor = CompressedTensor(
        TensorSpec("fc.weight", (100, 1000)),
        "explicit",
        indices,
        QuantizedValues("qsgd", 3, codes, {"norm": np.ones(1, np.float32)}),
    )
    payload = encode_frame("topk(0.01)+qsgd(3)", [tensor])
    codec, (layout,) = inspect_frame(payload)
    assert codec == "topk(0.01)+qsgd(3)"
    assert layout.coding == "rice"
    assert layout.codes_nbytes == 375
    assert layout.params_nbytes == 4
    assert 8 * layout.index_nbytes <= index_bits_for(indices, numel)["rice"]


# --------------------------------------------------------------------------------------
# Encoder input checks (ValueError naming the tensor)
# --------------------------------------------------------------------------------------


def _tensor(**overrides: object) -> CompressedTensor:
    fields: dict[str, object] = {
        "spec": TensorSpec("w", (4,)),
        "index_mode": "explicit",
        "indices": np.array([0, 2]),
        "values": QuantizedValues("uniform", 4, np.array([1, 2], np.uint8)),
    }
    fields.update(overrides)
    return CompressedTensor(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (_tensor(spec=TensorSpec("w", (4,), "int8")), "unknown dtype 'int8'"),
        (_tensor(spec=TensorSpec("w", (-1,))), r"ints in \[0, "),
        (_tensor(spec=TensorSpec("w", (1 << 30, 1 << 30))), "exceeds the format"),
        (_tensor(index_mode="sparse"), "unknown index mode 'sparse'"),
        (_tensor(values=QuantizedValues("fp8", 8, np.zeros(2, np.uint8))), "unknown scheme 'fp8'"),
        (_tensor(values=QuantizedValues("uniform", 0, np.zeros(2, np.uint8))), "bits must be"),
        (_tensor(values=QuantizedValues("uniform", 33, np.zeros(2, np.uint8))), "bits must be"),
        (_tensor(values=QuantizedValues("uniform", 3, np.array([1, 8]))), "code 8 does not fit 3"),
        (_tensor(values=QuantizedValues("uniform", 3, np.array([1, -1]))), "non-negative"),
        (_tensor(values=QuantizedValues("uniform", 3, np.array([1.0, 2.0]))), "integers"),
        (_tensor(values=QuantizedValues("uniform", 3, np.zeros((1, 2), np.uint8))), "one-dim"),
        (_tensor(indices=None), "needs indices"),
        (_tensor(indices=np.array([2, 0])), "strictly increasing"),
        (_tensor(indices=np.array([0, 4])), r"outside \[0, 4\)"),
        (_tensor(indices=np.array([0, 1, 2])), "3 indices but 2 codes"),
        (_tensor(index_mode="dense"), "carries no indices"),
        (_tensor(index_mode="dense", indices=None), "dense mode needs 4 codes, got 2"),
        (
            _tensor(
                index_mode="mask",
                indices=None,
                values=QuantizedValues("sign", 1, np.zeros(5, np.uint8)),
            ),
            "mask mode has 5 codes for 4",
        ),
    ],
)
def test_encoder_rejects_broken_tensors(tensor: CompressedTensor, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        encode_frame("c", [tensor])
    assert "tensor" in str(info.value)


def test_encoder_rejects_duplicate_names_and_non_str_codec() -> None:
    with pytest.raises(ValueError, match="duplicate tensor name"):
        encode_frame("c", [_tensor(), _tensor()])
    with pytest.raises(ValueError, match="codec must be a str"):
        encode_frame(b"c", [_tensor()])  # type: ignore[arg-type]


def test_frame_within_default_limits_for_a_large_tensor() -> None:
    numel = 10_000_000
    rng = np.random.default_rng(0)
    indices = np.sort(rng.choice(numel, 100_000, replace=False))
    codes = rng.integers(0, 256, 100_000).astype(np.uint8)
    tensor = CompressedTensor(
        TensorSpec("big", (numel,)), "explicit", indices, QuantizedValues("uniform", 8, codes)
    )
    payload = encode_frame("c", [tensor])
    assert len(payload) < DEFAULT_LIMITS.max_payload_bytes
    _, (got,) = decode_frame(payload)
    assert_same_tensor(got, tensor)
