"""The DDP hook state and DeMo's arguments: validation that says why (one process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fedsync.codecs import UpdateCodec
from fedsync.compression import SpecError
from fedsync.ddp import DeMo, FedsyncHookState, FrameExchangeError, decode_and_average
from fedsync.ddp.exchange import error_record
from fedsync.updates import TensorSpec
from fedsync.wire import UnexpectedCodec


def test_state_needs_an_initialised_process_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        FedsyncHookState(spec="topk:0.01+uniform:4+ef")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"spec": "topk:2"}, SpecError, "density"),
        ({"spec": "dct:99,chunk=64"}, SpecError, "k must be in [1, chunk=64]"),
        ({"spec": 3}, SpecError, "spec string"),
        ({"seed": 1.5}, ValueError, "seed"),
        ({"limits": {}}, ValueError, "FrameLimits"),
    ],
)
def test_state_validation_says_why(group: None, kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        FedsyncHookState(**kwargs)
    assert words in str(info.value)


def test_state_starts_with_empty_stats(group: None) -> None:
    state = FedsyncHookState(spec="dct:8,chunk=64+uniform:8+demo:0.99")
    assert state.rank == 0 and state.world_size == 1
    assert state.codec.spec == "dct:8+uniform:8+demo:0.99"
    assert state.compression_stats().step == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"lr": 0.0}, ValueError, "lr"),
        ({"weight_decay": -1.0}, ValueError, "weight_decay"),
        ({"beta": 1.0}, SpecError, "beta"),
        ({"k": 65}, SpecError, "k must be"),
        ({"chunk": 1}, SpecError, "chunk"),
        ({"quantizer": "uniform:4+ef"}, SpecError, "one quantizer"),
        ({"quantizer": "topk"}, SpecError, "quantizer"),
    ],
)
def test_demo_validation_says_why(group: None, kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        DeMo([torch.nn.Parameter(torch.zeros(3))], **{"lr": 0.1, **kwargs})
    assert words in str(info.value)


def test_decode_names_the_rank_and_what_went_wrong() -> None:
    codec = UpdateCodec("none+fp32")
    good = codec.encode({"bucket0": torch.ones(4)})
    expected = {"bucket0": TensorSpec("bucket0", (4,))}
    out = decode_and_average(
        codec, [good, good], expected, device=torch.device("cpu"), where="bucket 0"
    )
    assert torch.equal(out["bucket0"], torch.ones(4))
    with pytest.raises(FrameExchangeError) as info:
        decode_and_average(
            codec,
            [good, error_record("NaN")],
            expected,
            device=torch.device("cpu"),
            where="bucket 0",
        )
    assert info.value.rank == 1 and info.value.where == "bucket 0" and "NaN" in str(info.value)
    other = codec.encode({"bucket0": torch.ones(5)})
    with pytest.raises(FrameExchangeError, match="rank 2, bucket 0: UpdateMismatch"):
        decode_and_average(
            codec, [good, good, other], expected, device=torch.device("cpu"), where="bucket 0"
        )


def test_a_frame_of_another_codec_is_refused_as_unexpected_codec() -> None:
    codec = UpdateCodec("topk:0.5+uniform:8+ef")
    expected = {"bucket0": TensorSpec("bucket0", (8,))}
    mine = codec.encode({"bucket0": torch.arange(8.0)})
    # Same model, same sparsifier, another bit width: decodable, but not this codec's.
    theirs = UpdateCodec("topk:0.5+uniform:4+ef").encode({"bucket0": torch.arange(8.0)})
    cpu = torch.device("cpu")
    out = decode_and_average(codec, [mine, mine], expected, device=cpu, where="bucket 0")
    assert out["bucket0"].count_nonzero() == 4
    with pytest.raises(FrameExchangeError, match="rank 1, bucket 0: UnexpectedCodec") as info:
        decode_and_average(codec, [mine, theirs], expected, device=cpu, where="bucket 0")
    error = info.value.error
    assert isinstance(error, UnexpectedCodec) and info.value.__cause__ is error
    assert error.field == "codec" and "topk:0.5+uniform:4+ef" in str(error)


def test_the_hook_refuses_a_frame_of_another_codec(group: None) -> None:
    theirs = UpdateCodec("none+fp16").encode({"bucket0": torch.ones(6)})
    state = FedsyncHookState(spec="none+fp32", outgoing=lambda _: theirs)
    with pytest.raises(FrameExchangeError, match="rank 0, bucket 0: UnexpectedCodec") as info:
        state.exchange("bucket0", torch.ones(6), "bucket 0")
    assert isinstance(info.value.error, UnexpectedCodec)
    state.outgoing = None  # its own frames still go through
    assert torch.equal(state.exchange("bucket0", torch.ones(6), "bucket 0"), torch.ones(6))
