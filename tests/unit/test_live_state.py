"""The uplink codec's memory stays live on the node's device between tasks.

The real ClientApp path (:func:`fedsync.clients.app.train_task` on digits, as in
``test_client_state``), with the live state switched on for the CPU (it is on for
accelerators only; the CPU stands in here), must send exactly what a node reloading
``context.state`` sends, keep the very same residual tensors from task to task, and
fall back to the saved copy whenever it cannot prove the live state is that copy's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import fedsync.clientapp.compressed as compressed
import fedsync.clientapp.node_store as node_store
from fedsync.clientapp.node_store import LIVE, LIVE_TOKEN, LiveStates, keeps_live_state
from fedsync.codecs import UpdateCodec
from tests.unit import test_client_state as client_state
from tests.unit.test_client_state import fresh_context, task, uplink

# The same node, tasks and reference frames as there (fixtures are found by name).
_task_identity = client_state._task_identity
reference = client_state.reference


@pytest.fixture
def live_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveStates]:
    states = LiveStates()
    monkeypatch.setattr(compressed, "keeps_live_state", lambda device: True)
    monkeypatch.setattr(node_store, "LIVE", states)
    yield states


def _residuals(states: LiveStates) -> dict[str, torch.Tensor]:
    [(_, state)] = states._states.values()
    return dict(state.feedback.residuals)


def test_only_accelerators_keep_it_live() -> None:
    assert not keeps_live_state(torch.device("cpu"))
    assert keeps_live_state(torch.device("cuda", 0))
    assert len(LIVE) == 0  # nothing on a CPU run of the suite filed a state


def test_live_state_sends_the_same_bytes_and_keeps_the_same_tensors(
    live_on_cpu: LiveStates, reference: tuple[bytes, bytes]
) -> None:
    context = fresh_context(None)
    assert uplink(task(1), context) == reference[0]
    first = _residuals(live_on_cpu)
    assert first and LIVE_TOKEN in context.state.config_records
    assert uplink(task(2), context) == reference[1]
    second = _residuals(live_on_cpu)
    assert all(second[name] is first[name] for name in first)  # never rebuilt


def test_a_restarted_process_or_context_falls_back_to_the_saved_copy(
    live_on_cpu: LiveStates, reference: tuple[bytes, bytes]
) -> None:
    context = fresh_context(None)
    uplink(task(1), context)
    first = _residuals(live_on_cpu)
    live_on_cpu._states.clear()  # a new executor process: nothing live
    assert uplink(task(2), context) == reference[1]
    assert all(_residuals(live_on_cpu)[n] is not first[n] for n in first)


def test_a_token_that_does_not_match_is_not_trusted(live_on_cpu: LiveStates) -> None:
    context = fresh_context(None)
    uplink(task(1), context)
    codec = UpdateCodec("topk:0.05+uniform:4+ef")
    key = next(iter(live_on_cpu._states))
    context.state.config_records[LIVE_TOKEN]["token"] = "someone-else"
    assert not live_on_cpu.take(key, context, codec)
    assert codec.state.feedback.residuals == {}
    assert len(live_on_cpu) == 0  # taken out either way


def test_a_task_that_fails_after_taking_leaves_nothing_live(live_on_cpu: LiveStates) -> None:
    context = fresh_context(None)
    uplink(task(1), context)
    key = next(iter(live_on_cpu._states))
    assert live_on_cpu.take(key, context, UpdateCodec("topk:0.05+uniform:4+ef"))
    # ... the task fails before its save: the next one must reload the saved copy.
    assert not live_on_cpu.take(key, context, UpdateCodec("topk:0.05+uniform:4+ef"))


def test_at_most_limit_states_are_kept() -> None:
    states = LiveStates(limit=2)
    for i in range(3):
        context = fresh_context(None)
        states.keep(("run", i), context, UpdateCodec("topk:0.05+uniform:4+ef"))
    assert len(states) == 2 and ("run", 0) not in states._states


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_node_keeps_its_residual_on_the_device(reference: tuple[bytes, bytes]) -> None:
    states = LiveStates()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_store, "LIVE", states)
        context = fresh_context(None, device="cuda")
        uplink(task(1), context)
        first = _residuals(states)
        uplink(task(2), context)
        second = _residuals(states)
    assert all(t.device.type == "cuda" for t in second.values())
    assert all(second[name] is first[name] for name in first)
