"""Mutation fuzzing of the decoder: bad bytes raise PayloadError, and only that.

Thousands of frames derived from valid ones (truncated, bit-flipped, overwritten,
spliced, shuffled; each both as is and *resealed*, i.e. with length and CRC fixed
up so the parser's deeper checks must catch the fault), plus hand-made hostile
frames: huge declared sizes (must fail before allocating, checked with
``tracemalloc``), Rice unary runs that never end. The corpus holds context-coded
sections too (mutations make them decode past their end, leave bytes over, or
disagree with their count); digest-only frames are mutated and decoded against the
specs they were made for. Frames carrying a frame seed (the ``rht`` rotation's) are in
the corpus, and rotated codec frames go through the whole receiver (frame, codec,
inverse rotation). Through the codec: codec strings with absurd numbers, and
seed-derived masks whose memory must follow the payload, not the declared shape.
Bounded: a fixed seed and count, about 30 s on the 2-core CI box.
"""

from __future__ import annotations

import functools
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.codecs import UpdateCodec
from fedsync.updates import (
    CompressedTensor,
    IndexMode,
    QuantizedValues,
    TensorSpec,
    lowrank_rank,
    matrix_dims,
)
from fedsync.wire import (
    FrameLimits,
    LimitExceeded,
    PayloadError,
    SchemaMismatch,
    SchemaRequired,
    TruncatedPayload,
    decode_frame,
    encode_frame,
)
from fedsync.wire.layout import FLAG_SEED, FLAG_TABLE, FORMAT_VERSION, HEADER_BYTES, MAGIC
from fedsync.wire.testing import FrameBuilder, reseal
from tests.unit.test_codec_bad_input import mask_frame

MUTATIONS_PER_KIND = 15_000
CODEC_MUTATIONS_PER_KIND = 600
# These wall-clock bounds catch hangs and unbounded loops (a regression would take
# minutes), not speed: they are generous so a loaded 2-core machine never trips them.
SLOWEST_DECODE_S = 5.0
HOSTILE_DECODE_S = 2.0


def _tensor(
    rng: np.random.Generator,
    name: str,
    shape: tuple[int, ...],
    mode: IndexMode,
    density: float,
    bits: int,
    n_params: int = 1,
) -> CompressedTensor:
    numel = int(np.prod(shape))
    count = numel if mode == "dense" else round(density * numel)
    indices = None
    if mode == "explicit":
        indices = np.sort(rng.choice(numel, count, replace=False))
    codes = rng.integers(0, 1 << bits, count, dtype=np.uint64)
    params = {f"p{i}": rng.standard_normal(3).astype(np.float32) for i in range(n_params)}
    return CompressedTensor(
        TensorSpec(name, shape), mode, indices, QuantizedValues("uniform", bits, codes, params)
    )


@functools.cache
def _corpus() -> tuple[bytes, ...]:
    rng = np.random.default_rng(2024)
    frames = []
    for coding in ("bitmap", "elias_fano", "rice", "context"):
        for density, bits in ((0.01, 3), (0.1, 8), (0.5, 1), (0.03, 17)):
            tensor = _tensor(rng, "w", (40, 50), "explicit", density, bits)
            frames.append(encode_frame("topk", [tensor], index_coding=coding))
    frames.append(encode_frame("dense", [_tensor(rng, "d", (7, 3), "dense", 1.0, 32, 2)]))
    frames.append(encode_frame("mask", [_tensor(rng, "m", (300,), "mask", 0.2, 5, 0)]))
    frames.append(encode_frame("all", [_tensor(rng, "a", (64,), "explicit", 1.0, 2, 0)]))
    frames.append(encode_frame("scalar", [_tensor(rng, "s", (), "explicit", 1.0, 12)]))
    frames.append(encode_frame("empty", [_tensor(rng, "e", (0, 5), "explicit", 0.0, 4)]))
    frames.append(
        encode_frame(
            "multi",
            [
                _tensor(rng, "conv.weight", (8, 3, 3, 3), "explicit", 0.05, 4),
                _tensor(rng, "conv.bias", (8,), "dense", 1.0, 16, 0),
                _tensor(rng, "fc.weight", (10, 200), "explicit", 0.002, 7, 2),
                _tensor(rng, "fc.bias", (10,), "mask", 0.5, 3),
            ],
        )
    )
    frames.append(encode_frame("", []))
    # A frame seed (flag bit 1, 8 bytes after the codec), on every tensor of a frame.
    seeded = [
        _tensor(rng, "conv.weight", (8, 3, 3, 3), "dense", 1.0, 4),
        _tensor(rng, "fc.weight", (10, 200), "explicit", 0.05, 3),
    ]
    for tensor in seeded:
        tensor.seed = 0xF00DFACE12345678
    frames.append(encode_frame("seeded", seeded))
    # PowerSGD factors (index mode lowrank): hand-made, and from the real codec with
    # factored, fallback and error-feedback tensors in one frame.
    frames.append(encode_frame("lowrank", [_lowrank(rng, "f", (12, 5, 2), 3, 8)]))
    frames.append(
        UpdateCodec("powersgd:2+uniform:6,chunk=32+ef", seed=1).encode(
            {
                "conv.weight": torch.from_numpy(rng.standard_normal((8, 3, 3, 3)).astype("f4")),
                "conv.bias": torch.from_numpy(rng.standard_normal(8).astype("f4")),
                "fc.weight": torch.from_numpy(rng.standard_normal((10, 40)).astype("f4")),
            }
        )
    )
    frames.extend(_codec_frames())
    return tuple(frames)


CODEC_SPECS = (
    "dct:4,chunk=32+fp32+demo:0.9",
    "dct:2,chunk=16+uniform:6",
    "none+rht:16+uniform:4+ef",
    "topk:0.3+rht:64+uniform:3,chunk=64",
)
"""Stages whose receiver does more than scatter (the DCT inverse, the inverse rotation
with its frame seed; 216 and 10 values leave a last block to rotate twice): fuzzed
through the codec."""


@functools.cache
def _codec_frames() -> tuple[bytes, ...]:
    gen = torch.Generator().manual_seed(7)
    update = {"conv.weight": torch.randn(8, 3, 3, 3, generator=gen), "fc.bias": torch.randn(10)}
    return tuple(UpdateCodec(spec, seed=1).encode(update) for spec in CODEC_SPECS)


def _lowrank(
    rng: np.random.Generator, name: str, shape: tuple[int, ...], rank: int, bits: int
) -> CompressedTensor:
    dims = matrix_dims(shape)
    assert dims is not None
    count = rank * sum(dims)
    codes = rng.integers(0, 1 << bits, count, dtype=np.uint64)
    params = {"min": rng.standard_normal(1).astype(np.float32)}
    return CompressedTensor(
        TensorSpec(name, shape), "lowrank", None, QuantizedValues("uniform", bits, codes, params)
    )


def _check_decoded(codec: str, tensors: list[CompressedTensor]) -> None:
    """Whatever the decoder accepts must satisfy every contract the encoder checks."""
    for tensor in tensors:
        numel = tensor.spec.numel
        count = len(tensor.values)
        assert int(tensor.values.codes.max(initial=0)) >> tensor.values.bits == 0
        if tensor.index_mode == "explicit":
            assert tensor.indices is not None and tensor.indices.shape == (count,)
            assert np.all(np.diff(tensor.indices) > 0)
            assert count == 0 or (tensor.indices[0] >= 0 and tensor.indices[-1] < numel)
        elif tensor.index_mode == "lowrank":
            assert tensor.indices is None
            assert lowrank_rank(tensor.spec.shape, count) is not None
        else:
            assert tensor.indices is None
            assert count == numel if tensor.index_mode == "dense" else count <= numel
    # And must encode again (the encoder would raise ValueError on a broken contract).
    encode_frame(codec, tensors)


class _Stats:
    def __init__(self) -> None:
        self.decoded = 0
        self.rejected: dict[str, int] = {}
        self.slowest = 0.0


def _try(payload: bytes, stats: _Stats, what: str) -> None:
    start = time.perf_counter()
    try:
        codec, tensors = decode_frame(payload)
    except PayloadError as error:
        assert str(error), what
        name = type(error).__name__
        stats.rejected[name] = stats.rejected.get(name, 0) + 1
    except Exception as error:  # anything but PayloadError is the bug this hunts
        pytest.fail(f"{what}: {type(error).__name__} escaped: {error!r}\npayload={payload.hex()}")
    else:
        stats.decoded += 1
        _check_decoded(codec, tensors)
    stats.slowest = max(stats.slowest, time.perf_counter() - start)


def _position(rng: np.random.Generator, size: int) -> int:
    # Half the hits go to the header and table, where the interesting checks are.
    if rng.random() < 0.5:
        return int(rng.integers(0, min(size, 96)))
    return int(rng.integers(0, size))


def _flip(rng: np.random.Generator, frame: bytes, other: bytes) -> bytes:
    out = bytearray(frame)
    for _ in range(int(rng.integers(1, 4))):
        pos = _position(rng, len(out))
        out[pos] ^= 1 << int(rng.integers(0, 8))
    return bytes(out)


def _overwrite(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    out = bytearray(frame)
    pos = _position(rng, len(out))
    values = [0x00, 0xFF, 0x7F, 0x80, 0x01, int(rng.integers(0, 256))]
    for i in range(int(rng.integers(1, 5))):
        if pos + i < len(out):
            out[pos + i] = values[int(rng.integers(0, len(values)))]
    return bytes(out)


def _truncate(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    return frame[: int(rng.integers(0, len(frame)))]


def _insert(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    pos = _position(rng, len(frame))
    junk = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
    return frame[:pos] + junk + frame[pos:]


def _delete(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    pos = _position(rng, len(frame))
    return frame[:pos] + frame[pos + int(rng.integers(1, 9)) :]


def _splice(rng: np.random.Generator, frame: bytes, other: bytes) -> bytes:
    return frame[: _position(rng, len(frame))] + other[int(rng.integers(0, len(other))) :]


def _duplicate(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    start = _position(rng, len(frame))
    stop = min(len(frame), start + int(rng.integers(1, 32)))
    return frame[:stop] + frame[start:stop] + frame[stop:]


def _random(rng: np.random.Generator, frame: bytes, _: bytes) -> bytes:
    size = int(rng.integers(0, 2 * len(frame) + 1))
    noise = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    flags = (FLAG_TABLE, FLAG_SEED)
    header = MAGIC + bytes([FORMAT_VERSION, sum(f for f in flags if rng.random() < 0.5)])
    return header + noise if rng.random() < 0.7 else noise


MUTATORS: dict[str, Callable[[np.random.Generator, bytes, bytes], bytes]] = {
    "flip": _flip,
    "overwrite": _overwrite,
    "truncate": _truncate,
    "insert": _insert,
    "delete": _delete,
    "splice": _splice,
    "duplicate": _duplicate,
    "random": _random,
}


def test_corpus_is_valid() -> None:
    for frame in _corpus():
        _check_decoded(*decode_frame(frame))


@pytest.mark.parametrize("kind", sorted(MUTATORS))
def test_mutated_frames_raise_only_payload_error(kind: str) -> None:
    corpus = _corpus()
    rng = np.random.default_rng(sorted(MUTATORS).index(kind))
    mutate = MUTATORS[kind]
    stats = _Stats()
    for i in range(MUTATIONS_PER_KIND):
        frame = corpus[i % len(corpus)]
        other = corpus[int(rng.integers(0, len(corpus)))]
        mutated = mutate(rng, frame, other)
        _try(mutated, stats, f"{kind} #{i}")
        _try(reseal(mutated), stats, f"{kind} #{i} resealed")
    assert stats.slowest < SLOWEST_DECODE_S, stats.slowest
    # The resealed half must reach past the checksum into the parser's own checks.
    assert set(stats.rejected) - {"ChecksumMismatch"}, stats.rejected


@settings(max_examples=1500, deadline=None)
@given(body=st.binary(max_size=200), sealed=st.booleans(), table=st.booleans(), seed=st.booleans())
def test_arbitrary_bodies_behind_a_valid_header(
    body: bytes, sealed: bool, table: bool, seed: bool
) -> None:
    # Hypothesis shrinks any failure to a minimal body, which random mutation cannot.
    # The header is the current version's, so the body reaches the parser (not only the
    # version check); with and without the tensor table and the frame seed.
    flags = (FLAG_TABLE if table else 0) | (FLAG_SEED if seed else 0)
    frame = MAGIC + bytes([FORMAT_VERSION, flags]) + bytes(8) + body + bytes(4)
    _try(reseal(frame) if sealed else frame, _Stats(), "hypothesis body")


@settings(max_examples=1500, deadline=None)
@given(
    index=st.integers(0, len(_corpus()) - 1),
    edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_byte_edits_of_valid_frames_resealed(index: int, edits: list[tuple[int, int]]) -> None:
    frame = bytearray(_corpus()[index])
    for position, value in edits:
        frame[position % len(frame)] = value
    _try(reseal(bytes(frame)), _Stats(), "hypothesis edit")


def test_every_truncation_of_a_small_frame() -> None:
    stats = _Stats()
    for frame in _corpus()[-3:]:
        for size in range(len(frame)):
            _try(frame[:size], stats, f"truncated to {size}")
            _try(reseal(frame[:size]), stats, f"truncated to {size}, resealed")
    assert stats.decoded == 0


def test_every_single_bit_flip_of_a_small_frame_resealed() -> None:
    frame = encode_frame(
        "f",
        [
            CompressedTensor(
                TensorSpec("w", (6, 6)),
                "explicit",
                np.array([1, 7, 8, 30]),
                QuantizedValues(
                    "ternary", 2, np.array([0, 1, 2, 1]), {"scale": np.ones(1, np.float32)}
                ),
            )
        ],
    )
    stats = _Stats()
    for bit in range(8 * len(frame)):
        flipped = bytearray(frame)
        flipped[bit // 8] ^= 1 << (bit % 8)
        _try(bytes(flipped), stats, f"bit {bit}")
        _try(reseal(bytes(flipped)), stats, f"bit {bit} resealed")
    assert stats.rejected.get("ChecksumMismatch", 0) > 0


# --------------------------------------------------------------------------------------
# Hostile frames by hand: huge declared sizes fail fast, without allocating.
# --------------------------------------------------------------------------------------

PERMISSIVE = FrameLimits(
    max_payload_bytes=1 << 40,
    max_tensors=1 << 40,
    max_numel=(1 << 56) - 1,
    max_total_values=1 << 56,
    max_name_length=1 << 40,
    max_codec_length=1 << 40,
    max_params=1 << 40,
)

HOSTILE = {
    "dense 2**50 values": (
        FrameBuilder().add(shape=(1 << 25, 1 << 25), count=1 << 50).build(),
        LimitExceeded,
        TruncatedPayload,
    ),
    "bitmap over 2**40 elements": (
        FrameBuilder()
        .add(shape=(1 << 40,), mode=0, count=1 << 20, coding=2, index_nbytes=1 << 37, codes=b"")
        .build(),
        LimitExceeded,
        TruncatedPayload,
    ),
    "rice with 2**27 positions": (
        FrameBuilder()
        .add(
            shape=(1 << 33,),
            mode=0,
            count=1 << 27,
            coding=4,
            coding_param=6,
            index_nbytes=(1 << 27) * 7 // 8,
            codes=b"",
        )
        .build(),
        TruncatedPayload,
        TruncatedPayload,
    ),
    "lowrank factors of rank 2**20": (
        FrameBuilder()
        .add(shape=(1 << 20, 1 << 20), mode=3, count=(1 << 20) * (1 << 21), codes=b"")
        .build(),
        LimitExceeded,
        TruncatedPayload,
    ),
    "param of 2**40 floats": (
        FrameBuilder().add(params=[("s", 1 << 40)]).build(),
        TruncatedPayload,
        TruncatedPayload,
    ),
    "2**40 tensors": (
        FrameBuilder().add().build(tensor_count=1 << 40),
        LimitExceeded,
        PayloadError,
    ),
    "codec of 2**40 bytes": (
        FrameBuilder(codec=b"").build()[:HEADER_BYTES] + b"\x80\x80\x80\x80\x80\x20" + bytes(8),
        LimitExceeded,
        TruncatedPayload,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_huge_declared_sizes_fail_before_allocating(name: str) -> None:
    frame, default_error, permissive_error = HOSTILE[name]
    frame = reseal(frame)
    for limits, error in ((FrameLimits(), default_error), (PERMISSIVE, permissive_error)):
        tracemalloc.start()
        try:
            start = time.perf_counter()
            with pytest.raises(error):
                decode_frame(frame, limits=limits)
            elapsed = time.perf_counter() - start
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 256 * 1024, (name, peak)
        assert elapsed < HOSTILE_DECODE_S, (name, elapsed)


def test_rice_unary_run_that_never_ends() -> None:
    # 2 positions in 2**34 elements with k = 0 may legally take up to ~2**34 bits, so a
    # 1 MiB section of zeros passes the size check; the decoder must stop at its end.
    section = bytes(1 << 20)
    frame = (
        FrameBuilder()
        .add(
            shape=(1 << 34,),
            mode=0,
            count=2,
            coding=4,
            coding_param=0,
            index=section,
            codes=b"\x00\x00",
        )
        .build()
    )
    start = time.perf_counter()
    with pytest.raises(TruncatedPayload, match="stream ends after 0 of 2 positions"):
        decode_frame(frame)
    assert time.perf_counter() - start < HOSTILE_DECODE_S


# --------------------------------------------------------------------------------------
# Through the codec: codec strings with absurd numbers, declared sizes against what the
# decoder may spend. Only PayloadError may escape UpdateCodec.decode.
# --------------------------------------------------------------------------------------

CODEC_TEMPLATES = (
    "topk:0.1+uniform:{}",
    "topk:0.1+uniform:8,chunk={}",
    "topk:0.1+qsgd:{}",
    "topk:0.1+qsgd:8,chunk={}",
    "topk:{}+uniform:8",
    "mask:0.1,seed={}+uniform:8",
    "mask:{}+uniform:8",
    "dgc:0.1,iters={}+uniform:8",
    "sidco:0.1,stages={}+uniform:8",
    "randomk:{}+fp16",
    "topk:0.1+rht:{}+uniform:8",
    "none+rht:{}+uniform:8",
)
ABSURD_NUMBERS = st.one_of(
    st.integers(-(1 << 300), 1 << 300).map(str),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 0, -1]).map(str),
    st.text(alphabet="0123456789", min_size=18, max_size=600),
    st.text(alphabet="0123456789.-e+", min_size=1, max_size=40),
)


@functools.cache
def _topk_tensors() -> list[CompressedTensor]:
    update = torch.from_numpy(np.random.default_rng(3).standard_normal((32, 16)).astype("f4"))
    return decode_frame(UpdateCodec("topk:0.1+uniform:8").encode({"w": update}))[1]


@settings(max_examples=400, deadline=None)
@given(template=st.sampled_from(CODEC_TEMPLATES), number=ABSURD_NUMBERS)
def test_codec_strings_with_absurd_numbers_raise_only_payload_error(
    template: str, number: str
) -> None:
    payload = encode_frame(template.format(number), _topk_tensors())
    try:
        UpdateCodec().decode(payload)
    except PayloadError as error:
        assert str(error)
    except Exception as error:  # the bug this hunts: OverflowError, numba typing errors
        pytest.fail(f"{template.format(number)!r}: {type(error).__name__} escaped: {error!r}")


@settings(max_examples=40, deadline=None)
@given(
    log_numel=st.integers(10, 22),
    density=st.sampled_from([0.01, 0.06, 0.1, 0.3, 0.5, 0.9, 1.0]),
    bits=st.sampled_from([1, 4, 8]),
)
def test_derived_mask_memory_follows_the_payload_not_the_shape(
    log_numel: int, density: float, bits: int
) -> None:
    payload, count = mask_frame(1 << log_numel, density, bits)
    UpdateCodec().decode(mask_frame(64, 0.5, bits)[0])  # compile the kernels untraced
    tracemalloc.start()
    try:
        UpdateCodec().decode(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Positions (8 B), the sampler's table (< 22 B) per value, and small constants.
    assert peak < 40 * count + 4 * len(payload) + (1 << 20), (log_numel, density, peak)


# --------------------------------------------------------------------------------------
# Digest-only frames: mutated, decoded against the specs they were made for.
# --------------------------------------------------------------------------------------


@functools.cache
def _digest_corpus() -> tuple[tuple[bytes, tuple[TensorSpec, ...]], ...]:
    rng = np.random.default_rng(77)
    out = []
    groups = [
        [
            _tensor(rng, "conv.weight", (8, 3, 3, 3), "explicit", 0.05, 4),
            _tensor(rng, "conv.bias", (8,), "dense", 1.0, 16, 0),
            _tensor(rng, "fc.weight", (10, 200), "explicit", 0.01, 8, 2),
        ],
        [
            _tensor(rng, "m", (300,), "mask", 0.2, 5, 1),
            _tensor(rng, "a", (64,), "explicit", 0.5, 2),
        ],
    ]
    for tensors in groups:
        specs = tuple(t.spec for t in tensors)
        out.append((encode_frame("digest", tensors, schema="digest"), specs))
    return tuple(out)


@pytest.mark.parametrize("kind", sorted(MUTATORS))
def test_mutated_digest_frames_raise_only_payload_error(kind: str) -> None:
    corpus = _digest_corpus()
    rng = np.random.default_rng(100 + sorted(MUTATORS).index(kind))
    mutate = MUTATORS[kind]
    rejected: dict[str, int] = {}
    for i in range(2000):
        frame, specs = corpus[i % len(corpus)]
        mutated = mutate(rng, frame, corpus[int(rng.integers(0, len(corpus)))][0])
        for payload in (mutated, reseal(mutated)):
            try:
                codec, tensors = decode_frame(payload, expected=specs)
            except PayloadError as error:
                rejected[type(error).__name__] = rejected.get(type(error).__name__, 0) + 1
            except Exception as error:
                pytest.fail(f"{kind} #{i}: {type(error).__name__} escaped: {error!r}")
            else:
                _check_decoded(codec, tensors)
    assert set(rejected) - {"ChecksumMismatch"}, rejected


def test_digest_frames_need_and_check_the_specs() -> None:
    frame, specs = _digest_corpus()[0]
    with pytest.raises(SchemaRequired, match="expected="):
        decode_frame(frame)
    other = (TensorSpec(specs[0].name, (9, 3, 3, 3)), *specs[1:])
    with pytest.raises(SchemaMismatch, match="schema digest"):
        decode_frame(frame, expected=other)
    with pytest.raises(SchemaMismatch):
        decode_frame(frame, expected=specs[:-1])
    # A table frame is checked against expected specs too, and order does not matter.
    _, tensors = decode_frame(frame, expected=specs[::-1])
    table = encode_frame("t", tensors)
    assert decode_frame(table, expected=specs[::-1])[1][0].spec.name == tensors[0].spec.name
    with pytest.raises(SchemaMismatch, match="shape or dtype"):
        decode_frame(table, expected=other)


@pytest.mark.parametrize("kind", sorted(MUTATORS))
def test_mutated_codec_frames_raise_only_payload_error(kind: str) -> None:
    """Mutated DCT / DeMo / rotated frames through the whole receiver (frame, codec,
    inverse)."""
    corpus = _codec_frames()
    rng = np.random.default_rng(100 + sorted(MUTATORS).index(kind))
    mutate = MUTATORS[kind]
    codec = UpdateCodec()
    expected = {
        "conv.weight": TensorSpec("conv.weight", (8, 3, 3, 3)),
        "fc.bias": TensorSpec("fc.bias", (10,)),
    }
    rejected: set[str] = set()
    for i in range(CODEC_MUTATIONS_PER_KIND):
        frame = corpus[i % len(corpus)]
        other = corpus[int(rng.integers(0, len(corpus)))]
        for payload in (mutate(rng, frame, other), reseal(mutate(rng, frame, other))):
            try:
                codec.decode(payload, expected=expected)
            except PayloadError as error:
                rejected.add(type(error).__name__)
            except Exception as error:  # anything but PayloadError is the bug this hunts
                pytest.fail(f"{kind} #{i}: {type(error).__name__} escaped: {error!r}")
    assert rejected - {"ChecksumMismatch"}, rejected
