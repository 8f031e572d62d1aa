"""The asynchronous-quality mechanisms, each on its own: Delayed Nesterov (a sequence
computed by hand), the run's schedule clock (the position a task carries, and the
learning rate a device then trains with), and the staleness-scaled step under the
selected and weighted means."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fedsync.aggregation.local_steps import DynamicLocalSteps
from fedsync.aggregation.schedule_clock import ScheduleClock
from fedsync.aggregation.server_optimizer import (
    ServerDelayedNesterov,
    ServerMomentum,
    build_server_optimizer,
)
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.data.types import ArrayDataset
from fedsync.engine import AggregationEngine
from fedsync.models.training import LearningRateSchedule, train
from fedsync.protocol import SCHEDULE_STEP, TrainTask

# --- Delayed Nesterov -------------------------------------------------------------------------


def scalar_steps(optimizer: Any, deltas: list[float]) -> list[float]:
    """The model after each of ``deltas`` (one aggregation each), from x = 0."""
    params = {"x": torch.zeros(1)}
    seen = []
    for delta in deltas:
        optimizer.step(params, {"x": torch.tensor([delta])})
        seen.append(float(params["x"][0]))
    return seen


def test_delayed_nesterov_follows_the_sequence_computed_by_hand() -> None:
    # eta = 0.5, beta = 0.5, N = 2; updates 1, 3, 2, 2.
    # t=1: x = 0.5 * 1/2                               = 0.25
    # t=2: mean 2, v = 2;  x += 0.5 * (3/2 + 0.5 * 2)  = 0.25 + 1.25 = 1.5
    # t=3: x += 0.5 * 2/2                              = 2.0
    # t=4: mean 2, v = 0.5*2 + 2 = 3;  x += 0.5 * (2/2 + 0.5*3) = 2.0 + 1.25 = 3.25
    optimizer = ServerDelayedNesterov(learning_rate=0.5, momentum=0.5, period=2)
    assert scalar_steps(optimizer, [1.0, 3.0, 2.0, 2.0]) == [0.25, 1.5, 2.0, 3.25]


def test_delayed_nesterov_every_n_lands_where_nesterov_on_the_mean_does() -> None:
    deltas = [0.3, -1.2, 2.5, 0.7, -0.4, 1.1]
    delayed = scalar_steps(ServerDelayedNesterov(learning_rate=0.7, momentum=0.9, period=3), deltas)
    means = [sum(deltas[:3]) / 3, sum(deltas[3:]) / 3]
    nesterov = scalar_steps(ServerMomentum(learning_rate=0.7, momentum=0.9, nesterov=True), means)
    assert delayed[2] == pytest.approx(nesterov[0], rel=1e-6)
    assert delayed[5] == pytest.approx(nesterov[1], rel=1e-6)


def test_delayed_nesterov_with_period_one_is_nesterov_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(3)
    deltas = [{"w": torch.randn(5, 7, generator=generator)} for _ in range(6)]
    models = []
    for optimizer in (
        build_server_optimizer("delayed-nesterov", learning_rate=0.7, momentum=0.9, period=1),
        build_server_optimizer("nesterov", learning_rate=0.7, momentum=0.9),
    ):
        params = {"w": torch.zeros(5, 7)}
        for delta in deltas:
            optimizer.step(params, delta)
        models.append(params["w"])
    assert torch.equal(models[0], models[1])


def test_delayed_nesterov_resumes_mid_period_on_the_same_trajectory() -> None:
    deltas = [1.0, -2.0, 0.5, 3.0, 1.5]
    whole = scalar_steps(ServerDelayedNesterov(learning_rate=0.4, momentum=0.8, period=2), deltas)
    first = ServerDelayedNesterov(learning_rate=0.4, momentum=0.8, period=2)
    params = {"x": torch.zeros(1)}
    for delta in deltas[:3]:  # stops between milestones: a pending sum is held
        first.step(params, {"x": torch.tensor([delta])})
    state = first.state_dict()
    assert set(state["buffers"]) == {"velocity", "pending"} and state["buffers"]["pending"]
    second = ServerDelayedNesterov(learning_rate=0.4, momentum=0.8, period=2)
    second.load_state_dict(state)
    for delta in deltas[3:]:
        second.step(params, {"x": torch.tensor([delta])})
    assert float(params["x"][0]) == pytest.approx(whole[-1], rel=1e-6)


@pytest.mark.parametrize("period", [0, -1, 1.5, True])
def test_delayed_nesterov_refuses_a_period_that_is_not_a_positive_int(period: Any) -> None:
    with pytest.raises(ValueError, match="period must be an int >= 1"):
        ServerDelayedNesterov(period=period)


def test_the_run_config_picks_c_over_k_for_the_period_and_checks_it() -> None:
    config = RunConfig.of(
        strategy="fedbuff", concurrency=4, buffer_size=2, server_optimizer="delayed-nesterov"
    )
    optimizer = config.asynchronous.build_optimizer()
    assert isinstance(optimizer, ServerDelayedNesterov) and optimizer.period == 2
    assert "period=2" in repr(optimizer)
    explicit = RunConfig.of(
        strategy="fedbuff", server_optimizer="delayed-nesterov", server_momentum_period=5
    )
    assert explicit.asynchronous.momentum_period() == 5
    # The strategy's K: a DiLoCo round is one aggregation, FedAsync's K is 1.
    for strategy, period in (("diloco", 1), ("fedasync", 4), ("fedbuff", 2)):
        engine = AggregationEngine(
            RunConfig.of(
                strategy=strategy,
                concurrency=4,
                buffer_size=2,
                server_optimizer="delayed-nesterov",
                uplink_codec="none+fp32",
                downlink_codec="none+fp32",
            ),
            {"w": torch.zeros(3)},
        )
        assert isinstance(engine.optimizer, ServerDelayedNesterov)
        assert engine.optimizer.period == period, strategy
    with pytest.raises(SettingsError, match="server-momentum-period"):
        RunConfig.of(strategy="fedbuff", server_momentum_period=-2)


# --- the schedule clock -----------------------------------------------------------------------


def test_an_asynchronous_clock_counts_every_planned_budget_over_the_sites() -> None:
    clock = ScheduleClock(4, synchronous=False)
    assert [clock.plan(version, 15) for version in (0, 0, 0, 0, 1, 1, 2)] == [
        0,
        3,  # 15 // 4
        7,
        11,
        15,
        18,
        22,
    ]


def test_a_synchronous_clock_gives_every_task_of_a_round_the_rounds_start() -> None:
    clock = ScheduleClock(4, synchronous=True)
    positions = [clock.plan(version, 15) for version in (0, 0, 0, 0, 1, 1, 1, 1, 2)]
    assert positions == [0, 0, 0, 0, 15, 15, 15, 15, 30]  # a synchronous site's own count


def test_a_clock_without_budgets_counts_the_steps_replies_report() -> None:
    clock = ScheduleClock(2, synchronous=False)
    assert clock.plan(0, 0) == 0
    clock.reported(10)
    clock.reported(6)
    assert clock.plan(1, 0) == 8


def engine_for(**values: Any) -> AggregationEngine:
    settings: dict[str, Any] = {
        "uplink_codec": "none+fp32",
        "downlink_codec": "none+fp32",
        "strategy": "fedbuff",
        "concurrency": 2,
        "buffer_size": 1,
        "local_steps": 10,
        **values,
    }
    return AggregationEngine(RunConfig.of(**settings), {"w": torch.zeros(3)})


def test_each_planned_task_carries_the_runs_position_to_the_device() -> None:
    engine = engine_for()
    plans = [engine.plan_task(node, number) for number, node in enumerate((1, 2, 1, 2), 1)]
    assert [plan.schedule_step for plan in plans] == [0, 5, 10, 15]
    task = TrainTask.for_run(
        engine.config,
        payload=plans[2].downlink.payload,
        downlink_kind="full",
        version=0,
        uplink_codec=plans[2].uplink_spec,
        task_seed=plans[2].seed,
        job="job",
        local_steps=plans[2].local_steps,
        schedule_step=plans[2].schedule_step,
    )
    record = task.to_record()
    assert record["config"][SCHEDULE_STEP] == 10
    assert TrainTask.from_record(record).schedule_step == 10
    device_clock = engine_for(client_schedule_clock="device")
    assert device_clock.plan_task(1, 1).schedule_step == -1
    assert (
        SCHEDULE_STEP
        not in TrainTask.for_run(
            device_clock.config,
            payload=b"x",
            downlink_kind="full",
            version=0,
            uplink_codec="none+fp32",
            task_seed=1,
            job="job",
        ).to_record()["config"]
    )


def one_sgd_step(schedule_step: int | None, steps_before: int = 0) -> float:
    """The size of one plain SGD step (lr 1, gradient 1) under a warm-up + decay schedule."""
    from fedsync.models.training import InnerOptimizer

    model = torch.nn.Linear(1, 2, bias=False)
    torch.nn.init.zeros_(model.weight)
    before = model.weight.detach().clone()
    data = ArrayDataset(x=torch.ones(1, 1).numpy(), y=torch.zeros(1, dtype=torch.long).numpy())
    train(
        model,
        data,
        lr=1.0,
        momentum=0.0,
        max_steps=1,
        schedule=LearningRateSchedule(10, 100, 0.1),
        schedule_step=schedule_step,
        inner=InnerOptimizer(steps=steps_before),
    )
    return float((model.weight.detach() - before).abs().max())


def test_the_device_trains_at_the_position_the_task_carries_not_its_own_count() -> None:
    schedule = LearningRateSchedule(10, 100, 0.1)
    unit = one_sgd_step(None, steps_before=50)  # its own count: step 50
    assert one_sgd_step(80, steps_before=50) == pytest.approx(
        unit * schedule.factor(80) / schedule.factor(50), rel=1e-5
    )
    assert one_sgd_step(None, steps_before=80) == pytest.approx(one_sgd_step(80), rel=1e-6)
    with pytest.raises(ValueError, match="schedule_step"):
        one_sgd_step(-1)


# --- the staleness-scaled step ----------------------------------------------------------------


def run_two(mean: str, scales: bool) -> float:
    """The step of a buffer (K = 2) holding a fresh and a stale update (staleness 1,
    polynomial 0.5), each of 1.0, after a first buffer of two fresh ones."""
    engine = engine_for(
        concurrency=3,
        buffer_size=2,
        buffer_mean=mean,
        staleness="polynomial:0.5",
        staleness_scales_step=scales,
    )
    ones = {"w": torch.ones(3)}
    first, second, stale = (engine.plan_task(node, node) for node in (1, 2, 3))
    for plan in (first, second):
        engine.arrived(plan, 1)
        engine.receive(plan, UpdateCodec(plan.uplink_spec).encode(ones), 10)
    assert engine.version == 1 and float(engine.state["w"][0]) == pytest.approx(1.0)
    fresh = engine.plan_task(1, 4)
    for plan in (stale, fresh):
        engine.arrived(plan, 1)
        engine.receive(plan, UpdateCodec(plan.uplink_spec).encode(ones), 10)
    assert engine.version == 2 and stale.staleness == 1 and fresh.staleness == 0
    return float(engine.state["w"][0]) - 1.0


@pytest.mark.parametrize("mean", ["selected", "weight"])
def test_the_scaled_step_shrinks_a_stale_buffer_where_the_mean_cancelled_it(mean: str) -> None:
    assert run_two(mean, scales=False) == pytest.approx(1.0)  # the weights cancel
    assert run_two(mean, scales=True) == pytest.approx((1.0 + 2**-0.5) / 2, rel=1e-6)


def test_the_scaled_step_leaves_the_count_mean_as_fedbuff_has_it() -> None:
    expected = (1.0 + 2**-0.5) / 2  # count divides the weighted sum by K already
    assert run_two("count", scales=False) == pytest.approx(expected, rel=1e-6)
    assert run_two("count", scales=True) == pytest.approx(expected, rel=1e-6)
    assert math.isclose(run_two("count", True), run_two("count", False))


# --- dynamic local steps ----------------------------------------------------------------------


def test_budgets_follow_the_measured_compute_per_step_within_bounds() -> None:
    policy = DynamicLocalSteps(15, minimum=4)
    assert policy.budget(1) == 15  # not measured yet
    policy.observe(1, 0.045, 15)  # 3 ms a step: the fastest
    policy.observe(2, 0.060, 15)  # 4 ms
    policy.observe(3, 0.090, 15)  # 6 ms
    policy.observe(4, 0.300, 15)  # 20 ms: below the floor
    assert [policy.budget(node) for node in (1, 2, 3, 4)] == [15, 11, 8, 4]
    policy.observe(3, 0.048, 8)  # same speed at its new budget: the same budget again
    assert policy.budget(3) == 8
    policy.observe(3, float("nan"), 8)  # ignored
    assert policy.budget(3) == 8
    with pytest.raises(ValueError, match="least budget"):
        DynamicLocalSteps(15, minimum=16)


def test_the_engine_plans_each_device_its_budget_and_the_clock_counts_them() -> None:
    engine = engine_for(concurrency=2, local_steps=12, local_steps_policy="speed")
    fast, slow = engine.plan_task(1, 1), engine.plan_task(2, 2)
    assert (fast.local_steps, slow.local_steps) == (12, 12)
    for plan, seconds in ((fast, 0.12), (slow, 0.36)):  # 10 ms and 30 ms a step
        engine.arrived(plan, 1, steps=12, compute_s=seconds)
        engine.receive(plan, UpdateCodec(plan.uplink_spec).encode({"w": torch.zeros(3)}), 10)
    again_fast, again_slow = engine.plan_task(1, 3), engine.plan_task(2, 4)
    assert (again_fast.local_steps, again_slow.local_steps) == (12, 4)
    assert engine.steps_planned == 12 + 12 + 12 + 4
    assert again_slow.schedule_step == (12 + 12 + 12) // 2
    with pytest.raises(SettingsError, match="local-steps-min"):
        RunConfig.of(strategy="fedbuff", local_steps_policy="speed", local_steps=0)
    with pytest.raises(SettingsError, match="asynchronous strategies"):
        engine_for(strategy="diloco", local_steps_policy="speed")


def test_a_resumed_run_continues_the_planned_steps() -> None:
    engine = engine_for(local_steps_policy="speed")
    for number in (1, 2, 3):
        engine.plan_task(1, number)
    saved = engine.progress_state()
    assert saved == {"steps_planned": 30, "schedule_steps": 30}
    resumed = engine_for(local_steps_policy="speed")
    resumed.restore_progress(saved)
    assert resumed.plan_task(2, 4).schedule_step == 15 and resumed.steps_planned == 40
    older = engine_for()
    older.restore_progress({})  # an older checkpoint: the counts stay as built
    assert older.steps_planned == 0


# --- the ClientApp path ------------------------------------------------------------------------


def test_the_clientapp_trains_at_the_position_its_task_carries() -> None:
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedsync import protocol
    from fedsync.clients.app import train_task
    from fedsync.clients.runtime import ClientRuntime
    from fedsync.recipe import model_for, model_state
    from fedsync.updates import tensor_specs

    run_config = {
        "dataset": "digits",
        "seed": 0,
        "client-warmup-steps": 10,
        "client-decay-steps": 100,
        "client-lr-floor": 0.1,
    }
    start = model_state(model_for(RunConfig.from_run_config(run_config).training))

    def update(schedule_step: int) -> dict[str, torch.Tensor]:
        task = TrainTask(
            payload=UpdateCodec("none+fp32").encode(start),
            downlink_kind="full",
            version=0,
            uplink_codec="none+fp32",
            task_seed=5,
            job="job",
            local_epochs=1,
            local_steps=3,
            batch_size=32,
            learning_rate=0.1,
            momentum=0.0,
            proximal_mu=0.0,
            schedule_step=schedule_step,
        )
        message = Message(task.to_record(), dst_node_id=1, message_type=MessageType.TRAIN)
        context = Context(
            run_id=1,
            node_id=1,
            node_config={"partition-id": 0, "num-partitions": 3},
            state=RecordDict(),
            run_config=run_config,
        )
        reply = train_task(message, context, ClientRuntime.from_context(context))
        payload = reply.content.array_records[protocol.UPLINK][protocol.PAYLOAD].numpy().tobytes()
        decoded = UpdateCodec("none+fp32").decode(payload, tensor_specs(start))
        return {name: tensor.to_dense() for name, tensor in decoded.items()}

    with pytest.MonkeyPatch.context() as patch:
        for name in ("_run_id", "_node_id", "_task_id"):
            patch.setattr(TaskIdentity, name, 1)
        own, at_zero, at_30, at_95 = update(-1), update(0), update(30), update(95)
    # A fresh device's own count is 0: the same steps as a task that says 0 ...
    assert all(torch.equal(own[name], at_zero[name]) for name in own)
    # ... and at the run's step 95 the schedule is near its floor (0.107 of the rate,
    # against 0.895 at step 30): far smaller steps from the same model and batches.
    for name in own:
        assert float(at_95[name].norm()) < 0.3 * float(at_30[name].norm()), name
