"""The codec's sender memory survives a SuperNode restart when ``state-dir`` is set.

These run the real ClientApp path (:func:`fedsync.clients.app.train_task`: decode
the downlink, train on digits, error-feedback encode) with hand-built Flower Messages.
A "restart" is a fresh ``Context`` (empty ``context.state``), as a restarted SuperNode
gets; the reference is the same node without a restart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsync import protocol
from fedsync.clientapp.compressed import CODEC_STATE
from fedsync.clientapp.node_store import JOURNAL, NodeStore
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.config import RunConfig
from fedsync.persist import file_digest, load_arrays, save_arrays
from fedsync.protocol import TrainTask
from fedsync.recipe import model_for, model_state
from fedsync.updates import TensorSpec

RUN_CONFIG: dict[str, Any] = {"dataset": "digits", "seed": 0}


@pytest.fixture(scope="module", autouse=True)
def _task_identity() -> Iterator[None]:
    # Flower sets these in a ClientApp process; Message() needs them. Module scope:
    # the reference fixture below builds messages too.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_run_id", "_node_id", "_task_id"):
            patch.setattr(TaskIdentity, name, 1)
        yield


UPLINK = "topk:0.05+uniform:4+ef"  # coarse, so a good share of each update stays behind


def global_model() -> dict[str, torch.Tensor]:
    return model_state(model_for(RunConfig.from_run_config(RUN_CONFIG).training))


def task(
    number: int,
    *,
    job: str = "job-1",
    version: int = 0,
    delta_downlinks: bool = False,
    payload: bytes | None = None,
    downlink_kind: str = "full",
) -> Message:
    """A compressed train task; by default with a full fp32 downlink of the initial model."""
    if payload is None:
        payload = UpdateCodec("none+fp32").encode(global_model())
    train = TrainTask(
        payload=payload,
        downlink_kind=downlink_kind,
        version=version,
        uplink_codec=UPLINK,
        task_seed=1000 + number,
        job=job,
        local_epochs=1,
        local_steps=3,
        batch_size=32,
        learning_rate=0.1,
        momentum=0.9,
        proximal_mu=0.0,
        delta_downlinks=delta_downlinks,
    )
    message = Message(train.to_record(), dst_node_id=1, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = f"task-{number}"
    return message


def fresh_context(state_dir: Path | None, **node: Any) -> Context:
    """What a (re)started SuperNode's ClientApp gets: an empty ``context.state``."""
    node_config: dict[str, Any] = {"partition-id": 1, "num-partitions": 3, **node}
    if state_dir is not None:
        node_config["state-dir"] = str(state_dir)
    return Context(
        run_id=7, node_id=1, node_config=node_config, state=RecordDict(), run_config=RUN_CONFIG
    )


def uplink(message: Message, context: Context) -> bytes:
    reply = train_task(message, context, ClientRuntime.from_context(context))
    return bytes(reply.content.array_records[protocol.UPLINK][protocol.PAYLOAD].numpy().tobytes())


def journal(folder: Path) -> list[dict[str, Any]]:
    path = folder / JOURNAL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference() -> tuple[bytes, bytes]:
    """Tasks 1 and 2 on one node that never restarts (``context.state`` alone)."""
    context = fresh_context(None)
    return uplink(task(1), context), uplink(task(2), context)


def test_a_restarted_node_sends_exactly_what_it_would_have_sent(
    tmp_path: Path, reference: tuple[bytes, bytes]
) -> None:
    first = uplink(task(1), fresh_context(tmp_path))
    assert first == reference[0]
    store_file = tmp_path / "codec-job-1-p1.npz"
    before_restart = file_digest(store_file)
    arrays, meta = load_arrays(store_file)
    unsent = sum(float(np.square(a).sum()) for k, a in arrays.items() if k.startswith("residual/"))
    assert unsent > 0.0 and meta["step"] == 1  # there is mass left to carry over

    second = uplink(task(2), fresh_context(tmp_path))  # the restarted node

    # Bit for bit what the node would have sent without a restart: its residual (the
    # mass the first update did not carry) went out with this update.
    assert second == reference[1]
    [restore] = journal(tmp_path)
    assert restore["sha256"] == before_restart and restore["step"] == 1
    assert load_arrays(store_file)[1]["step"] == 2


def test_without_a_state_dir_the_residual_is_lost(
    tmp_path: Path, reference: tuple[bytes, bytes]
) -> None:
    uplink(task(1), fresh_context(None))
    assert uplink(task(2), fresh_context(None)) != reference[1]


def test_another_job_starts_from_a_clean_residual(tmp_path: Path) -> None:
    uplink(task(1, job="job-1"), fresh_context(tmp_path))
    other = uplink(task(2, job="job-2"), fresh_context(tmp_path))
    assert journal(tmp_path) == []
    assert other == uplink(task(2, job="job-2"), fresh_context(None))
    assert (tmp_path / "codec-job-2-p1.npz").exists() and (tmp_path / "codec-job-1-p1.npz").exists()


def test_context_state_is_the_fast_path(tmp_path: Path, reference: tuple[bytes, bytes]) -> None:
    context = fresh_context(tmp_path)
    uplink(task(1), context)
    assert CODEC_STATE in context.state.array_records
    (tmp_path / "codec-job-1-p1.npz").write_bytes(b"not read")
    assert uplink(task(2), context) == reference[1]
    assert journal(tmp_path) == []  # the file was never read


def test_a_faulty_node_corrupts_the_wire_not_its_memory(
    tmp_path: Path, reference: tuple[bytes, bytes]
) -> None:
    """Node config ``fault``: the reply is corrupt; the residual moves on as if sent."""
    context = fresh_context(tmp_path, fault="nan")
    sent = uplink(task(1), context)
    with pytest.raises(ValueError, match="not finite"):
        UpdateCodec().decode(sent, tensor_specs(global_model()))
    assert len(sent) == len(reference[0]) and sent != reference[0]
    honest = fresh_context(None)
    uplink(task(1), honest)
    mine = context.state.array_records[CODEC_STATE]
    theirs = honest.state.array_records[CODEC_STATE]
    for key in theirs:
        np.testing.assert_array_equal(mine[key].numpy(), theirs[key].numpy())


# --- the store on its own ---------------------------------------------------------------------
SPECS = {"w": TensorSpec("w", (4, 2)), "b": TensorSpec("b", (2,))}


def state(step: int) -> dict[str, np.ndarray]:
    return {
        "codec/step": np.array([step], dtype=np.int64),
        "residual/w": np.arange(8, dtype=np.float32),
        "residual/b": np.ones(2, dtype=np.float32),
    }


def store(folder: Path, *, job: str = "j", partition_id: int = 0) -> NodeStore:
    """The store of a node with ``state-dir`` = ``folder`` and a fresh context."""
    context = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config={})
    return NodeStore(context, job=job, partition_id=partition_id, folder=folder)


def test_store_round_trip(tmp_path: Path) -> None:
    saver = store(tmp_path / "node", job="a/b c", partition_id=3)
    path = saver.durable_path(CODEC_STATE)
    assert path is not None and path.name == "codec-a_b_c-p3.npz"
    assert saver.get(CODEC_STATE, specs=SPECS) is None  # nothing yet
    saver.put(CODEC_STATE, state(5), task="v1/9")
    loaded = store(tmp_path / "node", job="a/b c", partition_id=3).get(CODEC_STATE, specs=SPECS)
    assert loaded is not None and set(loaded) == set(state(5))
    np.testing.assert_array_equal(loaded["residual/w"], state(5)["residual/w"])
    [entry] = journal(tmp_path / "node")
    assert entry["step"] == 5 and entry["saved_by_task"] == "v1/9" and entry["job"] == "a/b c"
    assert entry["kind"] == CODEC_STATE


@pytest.mark.parametrize(
    ("write", "why"),
    [
        (lambda p: p.write_bytes(b"\x00" * 10), "not a readable"),
        (lambda p: save_arrays(p, state(1), {"format": 1, "job": "other", "partition": 0}), "job"),
        (
            lambda p: save_arrays(
                p,
                {"residual/w": np.zeros(3, np.float32)},
                {"format": 1, "job": "j", "partition": 0},
            ),
            "does not fit",
        ),
        (lambda p: save_arrays(p, state(1), {"format": 9, "job": "j", "partition": 0}), "format"),
        (
            lambda p: save_arrays(
                p,
                {"residual/w": np.zeros(8, np.float64), "residual/b": np.zeros(2, np.float32)},
                {"format": 1, "job": "j", "partition": 0},
            ),
            "float32",
        ),
    ],
)
def test_store_ignores_files_that_do_not_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, write: Any, why: str
) -> None:
    reader = store(tmp_path)
    path = reader.durable_path(CODEC_STATE)
    assert path is not None
    write(path)
    assert reader.get(CODEC_STATE, specs=SPECS) is None
    assert why in caplog.text
    assert journal(tmp_path) == []


def test_no_state_dir_or_no_job_keeps_no_files(tmp_path: Path) -> None:
    assert NodeStore.of(fresh_context(None), job="j").durable_path(CODEC_STATE) is None
    assert NodeStore.of(fresh_context(None, **{"state-dir": ""}), job="j").folder is None
    assert store(tmp_path, job="").durable_path(CODEC_STATE) is None  # a dense task
