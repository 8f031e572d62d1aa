"""Delta downlinks with a seeded start: a device's first task starts from the initial
model it builds itself (an empty payload at version 0, a delta against version 0 later).

The encoder's rules on their own, the node's side (:func:`apply_downlink`), and a whole
run on the async loop with a fake Grid whose devices use the ClientApp's own
``apply_downlink``: one device builds another initial model than the server's, refuses
its first task with :class:`InitialModelMismatch`, and gets the whole model next.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedsync.aggregation.downlink import DownlinkEncoder, relative_gap
from fedsync.clientapp.compressed import (
    CODEC_STATE,
    DOWNLINK_BASE,
    InitialModelMismatch,
    MissingDownlinkBase,
    apply_downlink,
)
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.models.initial import state_digest
from fedsync.protocol import TrainReply, TrainTask
from fedsync.recipe import model_state
from fedsync.serverapp.run import AsyncResult
from fedsync.updates import densify
from tests.unit.test_async_run import of
from tests.unit.test_shared_downlink_run import (
    BAD_SEED,
    SHAPES,
    SPECS,
    SharedClients,
    initial,
    same,
    shared_task,
    task_identity,
)
from tests.unit.test_shared_downlink_run import run as shared_run

__all__ = ["task_identity"]  # the fixture Message() needs

DIGEST = state_digest(initial())


def encoder(**overrides: Any) -> DownlinkEncoder:
    settings: dict[str, Any] = {
        "full_codec": UpdateCodec("none+fp16"),
        "kind": "delta",
        "delta_codec": lambda _: UpdateCodec("none+uniform:8"),
        "keep_start": True,
        "initial": initial(),
        "initial_digest": DIGEST,
        **overrides,
    }
    return DownlinkEncoder(SPECS, **settings)


def moved(by: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(9)
    return {n: t + by * torch.randn(t.shape, generator=generator) for n, t in initial().items()}


# --- the server's encoder ------------------------------------------------------------------
def test_a_first_task_at_version_0_sends_nothing_and_names_the_initial_model() -> None:
    downlink = encoder()
    payload = downlink.prepare(1, initial(), 0)
    assert (payload.payload, payload.kind, payload.initial_digest) == (b"", "delta", DIGEST)
    assert payload.start is not None and same(payload.start, initial())
    downlink.commit(1)
    # the next task is a plain delta against the replica: no digest
    state = moved(0.01)
    second = downlink.prepare(1, state, 1)
    assert second.kind == "delta" and second.payload and second.initial_digest == ""
    assert second.lag < 0.01
    described = downlink.describe()
    assert described["payloads"] == {"delta": 1, "seeded": 1}
    assert described["delta_change"] == {f"p{q}": round(second.change, 6) for q in (10, 50, 90)}


def test_a_later_first_task_is_a_delta_against_version_0() -> None:
    downlink = encoder()
    state = moved(0.05)
    payload = downlink.prepare(2, state, 7)
    assert payload.kind == "delta" and payload.initial_digest == DIGEST
    full = UpdateCodec("none+fp16").encode(state)
    assert 0 < len(payload.payload) < len(full)  # 8 bits a value, not 16
    assert payload.start is not None and relative_gap(state, payload.start) == payload.lag
    # the change it carries: the whole way from version 0, of which it leaves the lag
    assert payload.change == relative_gap(state, initial()) > payload.lag > 0


def test_too_far_from_version_0_or_known_before_means_a_whole_model() -> None:
    downlink = encoder(max_lag=1e-6)
    payload = downlink.prepare(3, moved(0.5), 4)  # an 8-bit delta cannot meet the guard
    assert (payload.kind, payload.initial_digest, downlink.resyncs) == ("full", "", 1)
    downlink = encoder()
    downlink.prepare(4, initial(), 0)
    downlink.reset(4)  # its task failed: what it holds is unknown ...
    again = downlink.prepare(4, initial(), 0)
    assert (again.kind, again.initial_digest) == ("full", "")  # ... and it may not be version 0
    pruned = encoder()
    pruned.rebase(UpdateCodec("none+fp16"))  # a changed model: version 0 is no base any more
    assert pruned.prepare(5, initial(), 0).kind == "full"


def test_a_seeded_start_needs_delta_mode_and_a_digest() -> None:
    with pytest.raises(ValueError, match="seeded start"):
        encoder(kind="full")
    with pytest.raises(ValueError, match="seeded start"):
        encoder(initial_digest="")


# --- the node's side -----------------------------------------------------------------------
def context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def test_the_node_starts_from_its_own_initial_model_and_keeps_it() -> None:
    node = context()
    start = apply_downlink(b"", "delta", SPECS, node, initial_digest=DIGEST, initial=initial())
    assert same(start, initial())
    base = node.state.array_records[DOWNLINK_BASE]
    assert all(np.array_equal(base[n].numpy(), initial()[n].numpy()) for n in SHAPES)
    # a delta against version 0 with the digest: applied to version 0, not to the base
    node.state.array_records.pop(DOWNLINK_BASE)
    change = {n: t - initial()[n] for n, t in moved(0.05).items()}
    payload = UpdateCodec("none+uniform:8").encode(change)
    start = apply_downlink(payload, "delta", SPECS, node, initial_digest=DIGEST, initial=initial())
    decoded = densify(UpdateCodec().decode(payload, expected=SPECS))
    assert all(torch.equal(start[n], initial()[n] + decoded[n]) for n in SHAPES)


def test_a_node_with_another_initial_model_refuses_and_keeps_nothing() -> None:
    node = context()
    with pytest.raises(InitialModelMismatch, match="another seed, model or platform"):
        apply_downlink(b"", "delta", SPECS, node, initial_digest=DIGEST, initial=initial(1))
    with pytest.raises(InitialModelMismatch):
        apply_downlink(b"", "delta", SPECS, node, initial_digest=DIGEST, initial=None)
    assert DOWNLINK_BASE not in node.state.array_records
    # without the digest an empty delta is no seeded start: the node holds no base
    with pytest.raises(MissingDownlinkBase):
        apply_downlink(b"", "delta", SPECS, node)


# --- a whole run -----------------------------------------------------------------------------
class DeltaClients(SharedClients):
    """The shared-run devices, applying delta downlinks with ``apply_downlink``."""

    def start(
        self, task: TrainTask, context: Context, own: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        return apply_downlink(
            task.payload,
            task.downlink_kind,
            SPECS,
            context,
            initial_digest=task.initial_digest,
            initial=own,
        )


def run(
    tmp_path: Path, **overrides: Any
) -> tuple[AsyncResult, list[dict[str, Any]], SharedClients]:
    """The shared-downlink run's fleet and settings, with rotated 4-bit delta downlinks
    from the seeded start and the default lag guard."""
    settings: dict[str, Any] = {
        "downlink_kind": "delta",
        "downlink_delta_codec": "none+rht+uniform:4",
        "downlink_max_lag": 0.1,
        **overrides,
    }
    return shared_run(tmp_path, DeltaClients(), **settings)


def test_a_seeded_delta_run_starts_devices_from_version_0_and_resyncs_a_mismatch(
    tmp_path: Path,
) -> None:
    result, events, clients = run(tmp_path)
    dispatched = of(events, "dispatch")
    first: dict[int, dict[str, Any]] = {}
    for e in dispatched:
        first.setdefault(e["node"], e)
    assert any(e["version"] == 0 for e in first.values())
    for node, e in first.items():
        if e["version"] == 0:
            assert (e["downlink_kind"], e["bytes_down"]) == ("delta", 0), node
            assert e["downlink_detail"] == "seeded", node
    # a later first contact is a delta against version 0, or a whole model when that
    # delta would leave it further than the lag guard allows (a resync)
    late = [e for e in first.values() if e["version"] > 0]
    assert late and all(
        e.get("downlink_detail") == "seeded" or e["downlink_kind"] == "full" for e in late
    )
    guarded = sum(e["downlink_kind"] == "full" for e in late)
    assert guarded <= result.summary["downlink_resyncs"]
    assert clients.refused == [(BAD_SEED, "InitialModelMismatch")]
    errors = [e for e in of(events, "error") if e["node"] == BAD_SEED]
    assert len(errors) == 1 and "InitialModelMismatch" in errors[0]["reason"]
    after = [e for e in dispatched if e["node"] == BAD_SEED][1]
    assert after["downlink_kind"] == "full" and after["bytes_down"] > 0
    # every device holds what the server mirrors for it, bit for bit
    downlink = result.engine.downlink
    for node, node_context in clients.contexts.items():
        held = downlink.holds(node)
        if held is not None:
            base = node_context.state.array_records[DOWNLINK_BASE]
            assert all(np.array_equal(base[n].numpy(), held[n].cpu().numpy()) for n in SHAPES)
    summary = result.summary
    assert summary["final_accuracy"] > result.evaluations[0]["accuracy"]
    assert summary["total_bytes_down"] == sum(e["bytes_down"] for e in dispatched)
    counts = summary["downlink"]["payloads"]
    assert counts["seeded"] >= 1 and counts["full"] >= 1 and counts["delta"] >= 1


def test_without_the_seeded_start_first_tasks_carry_the_whole_model(tmp_path: Path) -> None:
    result, events, clients = run(tmp_path, downlink_seeded_start=False, max_aggregations=4)
    assert clients.refused == [] and of(events, "error") == []
    first: dict[int, dict[str, Any]] = {}
    for e in of(events, "dispatch"):
        first.setdefault(e["node"], e)
    assert all(e["downlink_kind"] == "full" and e["bytes_down"] > 0 for e in first.values())
    assert result.summary["downlink"]["seeded_start"] is False


# --- fedsync's own ClientApp ---------------------------------------------------------------------
def test_the_clientapp_starts_a_delta_run_from_its_own_seeded_model() -> None:
    run_config: dict[str, bool | float | int | str] = {"dataset": "digits", "seed": 0}

    def node() -> tuple[Context, ClientRuntime]:
        node_config: dict[str, bool | float | int | str] = {"partition-id": 1, "num-partitions": 3}
        node_context = Context(1, 1, node_config, RecordDict(), run_config)
        return node_context, ClientRuntime.from_context(node_context)

    node_context, runtime = node()
    fresh = model_state(runtime.fresh_model())  # what the server's initial_arrays are
    message = shared_task(state_digest(fresh))
    train = TrainTask.from_record(message.content)
    message.content = replace(train, downlink_kind="delta", delta_downlinks=True).to_record()
    reply = train_task(message, node_context, runtime)
    assert TrainReply.from_record(reply.content).payload  # it trained and sent an update
    base = node_context.state.array_records[DOWNLINK_BASE]  # the next delta's base
    assert all(np.array_equal(base[n].numpy(), t.numpy()) for n, t in fresh.items())
    # a server whose initial model is another: refused before anything is kept
    node_context, runtime = node()
    message = shared_task("0" * 64)
    train = TrainTask.from_record(message.content)
    message.content = replace(train, downlink_kind="delta", delta_downlinks=True).to_record()
    with pytest.raises(InitialModelMismatch):
        train_task(message, node_context, runtime)
    assert DOWNLINK_BASE not in node_context.state.array_records
    assert CODEC_STATE not in node_context.state.array_records
