"""A device's inner optimizer carried across tasks, its schedule, and its persistence.

The node-level tests run the real ClientApp path (:func:`fedsync.clients.app.train_task`)
with hand-built Flower Messages on digits; a restart is a fresh ``Context``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict

from fedsync import protocol
from fedsync.clientapp.node_store import INNER_OPTIMIZER, NodeStore
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.data import ArrayDataset
from fedsync.models import build_model
from fedsync.models.training import InnerOptimizer, LearningRateSchedule, train
from fedsync.persist import load_arrays
from fedsync.protocol import TrainTask
from fedsync.recipe import model_for, model_state
from tests.unit.test_async_run import task_identity as task_identity  # autouse: Message()

ADAMW: dict[str, Any] = {
    "dataset": "digits",
    "seed": 0,
    "client-optimizer": "adamw",
    "learning-rate": 0.003,
}


def data(n: int = 64, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    return ArrayDataset(
        rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)
    )


def small_model() -> torch.nn.Module:
    return build_model("mlp", 3, (8,), seed=1, hidden=(16,))


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# --- the trainer -------------------------------------------------------------------------


def test_two_tasks_with_a_kept_optimizer_are_one_run_of_adamw() -> None:
    # Full-batch steps: the batch order cannot matter, so two tasks of 3 steps with the
    # optimizer kept must land where one task of 6 steps does (up to float summation).
    dataset = data()
    kwargs: dict[str, Any] = {"batch_size": 64, "lr": 0.01, "optimizer": "adamw"}
    once = small_model()
    train(once, dataset, epochs=6, **kwargs)

    kept, inner = small_model(), InnerOptimizer()
    train(kept, dataset, epochs=3, inner=inner, seed=1, **kwargs)
    assert inner.steps == 3 and float(inner.state[0]["step"]) == 3.0  # type: ignore[index]
    train(kept, dataset, epochs=3, inner=inner, seed=2, **kwargs)
    assert inner.steps == 6 and float(inner.state[0]["step"]) == 6.0  # type: ignore[index]
    torch.testing.assert_close(flat(kept), flat(once), atol=1e-6, rtol=1e-5)

    fresh = small_model()
    train(fresh, dataset, epochs=3, seed=1, **kwargs)
    train(fresh, dataset, epochs=3, seed=2, **kwargs)
    # A fresh AdamW per task restarts its bias correction: a visibly different model.
    assert float((flat(fresh) - flat(once)).abs().max()) > 1e-3


def test_a_state_of_another_model_is_refused_before_any_step() -> None:
    inner = InnerOptimizer()
    train(small_model(), data(), epochs=1, optimizer="adamw", inner=inner)
    other = build_model("mlp", 3, (8,), seed=1, hidden=(32,))
    before = flat(other).clone()
    with pytest.raises(ValueError, match="shape"):
        train(other, data(), epochs=1, optimizer="adamw", inner=inner)
    assert torch.equal(flat(other), before)


def test_the_schedule_warms_up_then_decays_to_its_floor() -> None:
    schedule = LearningRateSchedule(warmup_steps=4, decay_steps=14, floor=0.1)
    assert [schedule.factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule.factor(4) == 1.0
    assert schedule.factor(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert schedule.factor(14) == pytest.approx(0.1) and schedule.factor(99) == pytest.approx(0.1)
    assert LearningRateSchedule(warmup_steps=2).factor(50) == 1.0
    for bad in ({"warmup_steps": -1}, {"warmup_steps": 5, "decay_steps": 5}, {"floor": 1.5}):
        with pytest.raises(ValueError):
            LearningRateSchedule(**bad)


def test_the_schedule_runs_on_the_devices_step_count_across_tasks() -> None:
    # Plain SGD without momentum: each step moves by lr * factor * grad; with the
    # schedule at factor 0 ... the second task must continue where the first stopped.
    schedule = LearningRateSchedule(warmup_steps=0, decay_steps=4, floor=0.0)
    inner = InnerOptimizer()
    model = small_model()
    train(model, data(), epochs=4, batch_size=64, lr=0.5, inner=inner, schedule=schedule)
    assert inner.steps == 4
    after_decay = flat(model).clone()
    train(model, data(), epochs=3, batch_size=64, lr=0.5, inner=inner, schedule=schedule)
    assert inner.steps == 7
    assert torch.equal(flat(model), after_decay)  # the rate reached its floor, 0


# --- the node: context.state, state-dir, run config --------------------------------------


def task(number: int, run_config: dict[str, Any]) -> Message:
    start = model_state(model_for(RunConfig.from_run_config(run_config).training))
    message = Message(
        TrainTask(
            payload=UpdateCodec("none+fp32").encode(start),
            downlink_kind="full",
            version=0,
            uplink_codec="none+fp32",
            task_seed=100 + number,
            job="job-1",
            local_epochs=1,
            local_steps=4,
            batch_size=32,
            learning_rate=0.003,
            momentum=0.0,
            proximal_mu=0.0,
        ).to_record(),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    message.metadata.__dict__["_message_id"] = f"task-{number}"
    return message


def context(run_config: dict[str, Any], state_dir: Path | None = None) -> Context:
    node: dict[str, Any] = {"partition-id": 0, "num-partitions": 2}
    if state_dir is not None:
        node["state-dir"] = str(state_dir)
    return Context(run_id=7, node_id=1, node_config=node, state=RecordDict(), run_config=run_config)


def uplink(message: Message, ctx: Context) -> bytes:
    reply = train_task(message, ctx, ClientRuntime.from_context(ctx))
    return bytes(reply.content.array_records[protocol.UPLINK][protocol.PAYLOAD].numpy().tobytes())


def test_a_node_keeps_its_optimizer_and_a_restarted_one_reads_it_back(tmp_path: Path) -> None:
    keep = {**ADAMW, "client-optimizer-state": "keep"}
    same_node = context(keep)
    reference = [uplink(task(n, keep), same_node) for n in (1, 2)]
    assert INNER_OPTIMIZER in same_node.state.array_records

    first = uplink(task(1, keep), context(keep, tmp_path))
    restarted = context(keep, tmp_path)
    second = uplink(task(2, keep), restarted)
    assert [first, second] == reference  # bit for bit, through the file
    arrays, meta = load_arrays(tmp_path / "optim-job-1-p0.npz")
    assert meta["step"] == 8 and int(arrays["steps"][0]) == 8
    assert {k.split("/")[1] for k in arrays if "/" in k} == {"step", "exp_avg", "exp_avg_sq"}

    reset = {**ADAMW, "client-optimizer-state": "reset"}
    fresh_each_task = context(reset)
    assert uplink(task(1, reset), fresh_each_task) == reference[0]
    assert uplink(task(2, reset), fresh_each_task) != reference[1]


def restored(job: str, state_dir: Path, *, keep_moments: bool = True) -> InnerOptimizer:
    """The inner optimizer a restarted node (a fresh context) reads back for ``job``."""
    arrays = NodeStore.of(context(ADAMW, state_dir), job=job).get(INNER_OPTIMIZER)
    return InnerOptimizer.from_arrays(arrays, keep_moments=keep_moments)


def test_a_persisted_state_of_another_job_is_ignored(tmp_path: Path) -> None:
    inner = InnerOptimizer()
    train(small_model(), data(), epochs=1, optimizer="adamw", inner=inner)
    NodeStore.of(context(ADAMW, tmp_path), job="job-0").put(INNER_OPTIMIZER, inner.to_arrays())
    (tmp_path / "optim-job-0-p0.npz").rename(tmp_path / "optim-job-1-p0.npz")
    fresh = restored("job-1", tmp_path)
    assert fresh.state is None and fresh.steps == 0

    NodeStore.of(context(ADAMW, tmp_path), job="job-1").put(INNER_OPTIMIZER, inner.to_arrays())
    again = restored("job-1", tmp_path)
    assert again.steps == inner.steps and again.state is not None
    steps_only = restored("job-1", tmp_path, keep_moments=False)
    assert steps_only.state is None and steps_only.steps == inner.steps


def test_the_arrays_round_trip_and_a_dense_task_keeps_no_file(tmp_path: Path) -> None:
    inner = InnerOptimizer()
    train(small_model(), data(), epochs=1, optimizer="adamw", inner=inner)
    back = InnerOptimizer.from_arrays(inner.to_arrays())
    assert back.steps == inner.steps and back.state is not None and inner.state is not None
    for index, entries in inner.state.items():
        for name, value in entries.items():
            assert torch.equal(back.state[index][name], value.float()), (index, name)
    # A dense Flower task names no job: the optimizer stays in context.state only.
    ctx = context(ADAMW, tmp_path)
    NodeStore.of(ctx, job="").put(INNER_OPTIMIZER, inner.to_arrays())
    assert INNER_OPTIMIZER in ctx.state.array_records and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"client-optimizer-state": "sometimes"}, "client-optimizer-state"),
        ({"client-warmup-steps": 10, "client-decay-steps": 10}, "must end after the warm-up"),
        ({"client-decay-steps": 10, "client-lr-floor": -0.5}, "floor"),
        ({"client-grad-clip": -1.0}, "client-grad-clip"),
    ],
)
def test_bad_inner_optimizer_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        RunConfig.from_run_config({"dataset": "digits", **values})
