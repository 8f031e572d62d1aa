"""The asynchronous server's loop: devices, the clock, the engine and the channel.

No rounds: idle devices apply for work, at most ``C`` tasks are in flight, and each
reply is judged on its own schedule::

    wake(node) -> scheduler queue -> dispatch: engine.plan_task (the task's record)
               -> clock.start(record) -> channel.send
    channel.poll (non-blocking) -> clock.reply(reply) / clock.error
    clock.pop() -> reply event (record + reply): engine.arrived (staleness, once)
                -> engine.receive (decode, validate, gate, weight, buffer, step)
                -> aggregated? evaluate every N, checkpoint every M
                -> wake(node): the device applies again

A task in flight is one record (:class:`fedsync.engine.InFlight`) that the clock carries
and hands back on the event that ends the task, with the reply when there is one: the
loop parks nothing and looks nothing up by task id.

The clock (:mod:`fedsync.clock`) decides when things happen: in simulation a
:class:`~fedsync.clock.VirtualClock` releases replies in simulated-time order (real
ClientApps still run in parallel in Flower's simulation engine), in deployment a
:class:`~fedsync.clock.WallClock` releases them as they come. The messages are
:mod:`fedsync.protocol`'s; the Grid is behind :class:`fedsync.serverapp.channel.GridChannel`; what
an update does to the model is :class:`fedsync.engine.AggregationEngine`'s.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from logging import ERROR, INFO, WARNING
from typing import Any, cast

from flwr.common.logger import log

from fedsync import protocol
from fedsync.aggregation import TaskScheduler
from fedsync.clock import Clock, ClockEvent, Fleet, TaskWork, VirtualClock, WallClock, load_fleet
from fedsync.clock.fleet import Assignment
from fedsync.config import ConfigValue, RunConfig
from fedsync.engine import AggregationEngine, InFlight
from fedsync.protocol import NodeProfile, TrainReply, TrainTask
from fedsync.reports import RunRecorder, RunSummary
from fedsync.serverapp.channel import Delivery, GridChannel
from fedsync.serverapp.checkpoint import AsyncCheckpoint
from fedsync.serverapp.journal import EvaluateFn, RunJournal
from fedsync.serverapp.probe import device_order

__all__ = ["AsyncRun", "EvaluateFn"]

NODE_REFRESH_S = 10.0
"""How often (real seconds) the wall-clock loop looks for SuperNodes that joined or
came back (one cheap ``get_node_ids`` call)."""

GONE_FAILURES = ("node-unavailable",)
"""Failures that mean the node left: the SuperLink marked it offline (missed
heartbeats). A device given up for them is taken back when it is online again: with
SuperNode authentication a restarted node keeps its node id."""


class AsyncRun:
    """One asynchronous run, from the first probe to ``summary.json``.

    Parameters
    ----------
    engine : AggregationEngine
        The model, the strategy and everything that changes them.
    channel : GridChannel
        The nodes.
    recorder : RunRecorder
        Where events, ``summary.json`` and plots go.
    evaluate_fn : callable
        ``(version, state) -> {"accuracy": ..., "loss": ..., ...}`` or ``None``, the
        central evaluation of the model at that version.
    clock : Clock, optional
        Overrides the clock the ``clock`` setting would build (tests).
    resume : AsyncCheckpoint, optional
        The checkpoint the engine was built from (counters, job, times continue).
    checkpoint_fn : callable, optional
        Called with an :class:`AsyncCheckpoint` every ``checkpoint-every`` aggregations
        and at the end; with ``checkpoint-every = 0``, after every evaluation instead.
    train_config : mapping, optional
        The application's own keys, sent in every task's CONFIG record
        (:attr:`fedsync.protocol.TrainTask.extra`).
    """

    def __init__(
        self,
        engine: AggregationEngine,
        channel: GridChannel,
        *,
        recorder: RunRecorder,
        evaluate_fn: EvaluateFn,
        clock: Clock | None = None,
        resume: AsyncCheckpoint | None = None,
        checkpoint_fn: Callable[[AsyncCheckpoint], object] | None = None,
        train_config: Mapping[str, ConfigValue] | None = None,
    ) -> None:
        self.engine = engine
        self.train_config: dict[str, ConfigValue] = dict(train_config or {})
        self.config: RunConfig = engine.config
        self.channel = channel
        self.recorder = recorder
        self.journal = RunJournal(
            engine, recorder, evaluate_fn, resume=resume, checkpoint_fn=checkpoint_fn
        )
        self.tally = engine.tally
        self._clock_override = clock
        strategy = engine.strategy
        stop = self.config.stop
        self._max_tasks = stop.max_tasks or (
            20 * stop.max_aggregations * strategy.buffer_size + strategy.concurrency
        )
        self._last_node_refresh = 0.0
        self._prune_logged = False
        self.stop_reason = ""
        # --- built by run(), once the nodes are known ---
        self.fleet: Fleet
        self.clock: Clock
        self.scheduler: TaskScheduler
        self.device_of: dict[int, int] = {}
        """Flower node id -> stable device index (partition id order)."""
        self.profiles: dict[int, NodeProfile] = {}
        """Flower node id -> what the node said about itself in the probe."""

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Dispatch, collect and aggregate until a stop condition; write the summary."""
        runtime, strategy = self.config.runtime, self.engine.strategy
        node_ids = self.channel.wait_for_nodes(runtime.min_nodes, runtime.node_wait)
        self.profiles = self.channel.probe(node_ids, runtime.probe_timeout)
        order = device_order(node_ids, self.profiles)
        self.device_of = {node_id: index for index, node_id in enumerate(order)}
        seed = self.config.training.seed
        self.fleet = load_fleet(self.config.clock.fleet).assign(
            node_ids,
            how=cast(Assignment, self.config.clock.fleet_assignment),
            seed=seed,
            key=self.device_of.__getitem__,
        )
        self.clock = self._clock_override or (
            VirtualClock(self.fleet, seed=seed, key=self.device_of.__getitem__)
            if self.config.clock.clock == "virtual"
            else WallClock()
        )
        self.journal.now = self.clock.now
        self.scheduler = TaskScheduler(
            node_ids, concurrency=strategy.concurrency, max_retries=runtime.max_retries
        )
        self.recorder.events.write(
            "async_start",
            strategy=strategy.name,
            nodes=len(node_ids),
            concurrency=strategy.concurrency,
            buffer_size=strategy.buffer_size,
            staleness=strategy.staleness.spec(),
            clock=self.clock.name,
            fleet=self.fleet.spec.name,
            profiles=[self.fleet.profile_for(n).name for n in order],
            node_of_device=order,
            version=self.engine.version,
        )
        log(INFO, "[fedsync] %s: %d nodes, %s", strategy.name, len(node_ids), self.clock.name)
        for node_id in order:
            self.clock.wake(node_id)
        self._log_prune()
        self.journal.evaluate()
        self.stop_reason = self._loop()
        if self.journal.last_eval_version != self.engine.version:
            self.journal.evaluate()
        failure = self._failure() if self.stop_reason == "no-devices-left" else None
        if failure:
            log(ERROR, "[fedsync] %s", failure)
        return self.journal.finish(
            self.stop_reason,
            fleet=self.fleet.spec.name,
            clock=self.clock.describe(),
            # One task per busy device, from dispatch to the event that ends it.
            tasks_in_flight_at_end=self.scheduler.in_flight,
            devices=self._device_summary(),
            failure=failure,
        )

    def _failure(self) -> str:
        """Why no device is left: the errors the given-up devices failed with last, the
        most common first, and the likely cause when every one failed alike."""
        reasons = Counter(
            " ".join(stats.last_failure.split())[:400] or "no reason given"
            for stats in self.scheduler.devices.values()
            if stats.failures
        )
        total = sum(reasons.values())
        head = (
            f"the run ended at v{self.engine.version}: every device was given up after "
            f"repeated failures ({total} device(s))"
        )
        if not reasons:
            return head
        if len(reasons) == 1:
            reason = next(iter(reasons))
            text = f"{head}; every one failed with the same error: {reason}"
        else:
            listed = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(3))
            text = f"{head}; their last errors: {listed}"
        stale = ("load-clientapp-exception", "ModuleNotFoundError", "ImportError")
        if len(reasons) == 1 and any(name in text for name in stale):
            text += (
                ". A ClientApp that fails to load or import on every node usually means the "
                "nodes run another version of the app: a SuperLink started before the app "
                "changed serves the "
                "old one (plain `flwr run` leaves Flower's local SuperLink running; stop "
                "it, or use `fedsync run`, which starts and stops its own)"
            )
        return text

    def _loop(self) -> str:
        while True:
            reason = self._stop_reason()
            if reason:
                return reason
            self._dispatch_ready()
            event = self.clock.pop()
            if event is not None:
                limit, offset = self.config.stop.max_sim_time, self.journal.time_offset
                if limit and event.time + offset > limit:
                    # Popping moved the clock past the limit; the run ends at the limit.
                    self.journal.time_cap = limit - offset
                    return "max-sim-time"
                self._handle(event)
                continue
            if self.clock.waiting == 0 and self.clock.queued == 0:
                # Nothing in flight and nothing scheduled: nobody can ever reply.
                if self.scheduler.exhausted:
                    return "no-devices-left"
                return "idle" if self._budget_left() else "max-tasks"
            if not self._collect(self.channel.poll()):
                self._collect(self.channel.overdue())
                self._refresh_nodes()
                self.channel.sleep(self.config.runtime.poll_interval)

    def _stop_reason(self) -> str:
        stop = self.config.stop
        if self.engine.version >= stop.max_aggregations:
            return "max-aggregations"
        if stop.stop_at_target and self.tally.target is not None:
            return "target-accuracy"
        if stop.max_sim_time and self.clock.now() + self.journal.time_offset >= stop.max_sim_time:
            return "max-sim-time"
        if stop.max_wall_time and self.journal.wall() >= stop.max_wall_time:
            return "max-wall-time"
        return ""

    # --- dispatch -----------------------------------------------------------------------------
    def _dispatch_ready(self) -> None:
        while self._budget_left():
            if not self._round_open():
                return
            node_id = self.scheduler.next_device()
            if node_id is None:
                return
            self.journal.tasks_dispatched += 1
            self._dispatch(node_id, self.journal.tasks_dispatched)

    def _budget_left(self) -> bool:
        """Whether the run may plan another task: fewer than ``max-tasks`` so far, or with
        dynamic local steps fewer planned steps than ``max-tasks x local-steps`` (the
        same token budget, in more, shorter tasks)."""
        if self.engine.local_steps is not None:
            steps = self._max_tasks * self.config.training.local_steps
            return self.engine.steps_planned < steps
        return self.journal.tasks_dispatched < self._max_tasks

    def _round_open(self) -> bool:
        """Whether a task may start from the current model now: always, unless the
        strategy is synchronous and this version's ``K`` tasks are buffered or in flight
        (a failed or lost one frees its place, so the round still fills)."""
        strategy = self.engine.strategy
        if not strategy.synchronous:
            return True
        return len(self.engine.buffer) + self.scheduler.in_flight < strategy.buffer_size

    def _dispatch(self, node_id: int, number: int) -> None:
        plan = self.engine.plan_task(node_id, number)
        size = plan.downlink_bytes
        now = self.clock.now()
        plan.dispatched = now
        send = self.clock.start(plan.task_id, node_id, size, task=plan)
        self.recorder.events.write(
            "dispatch",
            task=plan.task_id,
            node=node_id,
            device=self.device_of[node_id],
            version=plan.version,
            bytes_down=size,
            mask_bytes=len(plan.mask),
            factor_bytes=len(plan.factors),
            ab_side=plan.ab_side,
            downlink_kind=plan.downlink.kind,
            downlink_lag=round(plan.downlink.lag, 6),
            **({"downlink_change": round(plan.downlink.change, 6)} if plan.downlink.change else {}),
            **_shared_fields(plan),
            uplink_codec=plan.uplink_spec,
            in_flight=self.scheduler.in_flight,
            sim_time=self.journal.sim(now),
        )
        if not send:
            return  # the clock lost it already (dropout/offline): a drop event follows
        task = TrainTask.for_run(
            self.config,
            payload=plan.downlink.payload,
            downlink_kind=plan.downlink.kind,
            version=plan.version,
            uplink_codec=plan.uplink_spec,
            task_seed=plan.seed,
            job=self.journal.job_id,
            mask=plan.mask,
            ab_side=plan.ab_side,
            factors=plan.factors,
            initial_digest=plan.downlink.initial_digest,
            local_steps=plan.local_steps,
            schedule_step=plan.schedule_step,
            downlink_codecs=plan.downlink.codecs,
            extra=self.train_config,
        )
        failure = self.channel.send(plan.task_id, node_id, task, group=f"v{plan.version}")
        if failure:
            self.clock.error(plan.task_id, failure)

    # --- collecting replies -------------------------------------------------------------------
    def _collect(self, deliveries: list[Delivery]) -> bool:
        for delivery in deliveries:
            if delivery.reply is None:
                self.clock.error(delivery.task_id, delivery.error)
                continue
            reply: TrainReply = delivery.reply
            training = self.config.training
            work = TaskWork.from_reply(
                self.engine.wire_bytes_up(len(reply.payload)),
                examples=reply.num_examples,
                steps=reply.num_steps,
                epochs=training.local_epochs,
                batch_size=training.batch_size,
            )
            self.clock.reply(delivery.task_id, work, reply=reply)
        return bool(deliveries)

    def _refresh_nodes(self) -> None:
        # Only deployments gain nodes mid-run; a simulation's set is fixed (and a refresh
        # there could only cost determinism).
        if self.clock.name != "wall":
            return
        now = time.monotonic()
        if now - self._last_node_refresh < NODE_REFRESH_S:
            return
        self._last_node_refresh = now
        for node_id in self.channel.node_ids():
            if self.scheduler.join(node_id):
                self.device_of[node_id] = len(self.device_of)
                self.fleet.add(node_id)
                self._event("node-joined", node_id)
                self.clock.wake(node_id)
            elif self.scheduler.readmit(node_id, GONE_FAILURES):
                self._event("node-returned", node_id)
                log(INFO, "[fedsync] node %d is back online; it gets work again", node_id)
                self.clock.wake(node_id)

    # --- events -------------------------------------------------------------------------------
    def _handle(self, event: ClockEvent) -> None:
        if event.kind == "wake":
            self.scheduler.apply(event.node_id)
        elif event.kind == "reply":
            self._on_reply(event)
        elif event.kind == "error":
            self._on_error(event)
        else:
            self._on_lost(event)

    def _on_reply(self, event: ClockEvent) -> None:
        plan: InFlight = event.task
        reply: TrainReply = event.reply
        node_id = plan.node_id
        duration = event.time - plan.dispatched
        compute_s = reply.metrics.get(protocol.COMPUTE_SECONDS)
        staleness = self.engine.arrived(
            plan,
            len(reply.payload),
            steps=reply.num_steps,
            # The clock's compute time (simulated on the virtual clock), else the device's.
            compute_s=float(event.timing.get("compute_s", compute_s or 0.0)),
        )
        self.scheduler.timed(node_id, duration, compute_s)
        self._event(
            "arrival",
            node_id,
            event.time,
            task=plan.task_id,
            version=plan.version,
            staleness=staleness,
            bytes_up=len(reply.payload),
            bytes_down=plan.downlink_bytes,
            # In a run counted as a collective: what the collective moves for it.
            **(
                {"bytes_wire": self.engine.wire_bytes_up(len(reply.payload))}
                if plan.in_collective
                else {}
            ),
            num_examples=reply.num_examples,
            train_loss=reply.metrics.get(protocol.TRAIN_LOSS),
            sim_duration=round(duration, 6),
            wall_compute_s=compute_s,
        )
        verdict = self.engine.receive(
            plan, reply.payload, reply.num_examples, malformed=reply.malformed
        )
        rejection = verdict.rejection
        if rejection is not None:
            retired = self.scheduler.fail(node_id, f"rejected: {rejection.detail}")
            log(
                WARNING,
                "[fedsync] rejected %s from node %d: %s",
                plan.task_id,
                node_id,
                rejection.detail,
            )
            self._event(
                "drop",
                node_id,
                event.time,
                task=plan.task_id,
                reason="rejected",
                rejection=rejection.kind,
                detail=rejection.detail[:500],
                gave_up=retired,
            )
            self._after_failure(plan, retired, event)
            return
        if verdict.status == "stale":
            self._event(
                "drop",
                node_id,
                event.time,
                task=plan.task_id,
                reason="stale",
                staleness=staleness,
                max_staleness=self.engine.strategy.max_staleness,
            )
        self.scheduler.finish(node_id)
        self.clock.wake(node_id)
        if verdict.status == "aggregated":
            self._log_prune()
            self.journal.aggregated(event.time, verdict.updates, verdict.weight_sum)

    def _log_prune(self) -> None:
        """Record the cut once, when the engine has made it (``prune-at-version``)."""
        pruned = self.engine.pruned
        if pruned is None or self._prune_logged:
            return
        self._prune_logged = True
        cut = {k: v for k, v in pruned.describe().items() if k != "masks_sent"}  # 0 here
        self.recorder.events.write("prune", **cut, sim_time=self.journal.sim_now())
        log(
            INFO,
            "[fedsync] pruned the global model at version %d: %.0f%% of %d weights zero, "
            "masks %d bytes",
            pruned.version,
            100 * pruned.sparsity,
            sum(m.numel() for m in pruned.masks.values()),
            len(pruned.payload),
        )

    def _on_error(self, event: ClockEvent) -> None:
        plan: InFlight = event.task
        # Reasons read "<kind> (code N): detail" or "<kind>: detail".
        kind = event.reason.split(":", 1)[0].split(" (", 1)[0] or "error"
        self.tally.errors[kind] += 1
        retired = self.scheduler.fail(plan.node_id, event.reason)
        if not retired and kind in GONE_FAILURES and not self.channel.online(plan.node_id):
            # The SuperLink has marked the node offline: every retry would hold a slot
            # only to fail the same way. Give it up now; _refresh_nodes takes it back
            # when it is online again.
            self.scheduler.retire(plan.node_id, event.reason)
            retired = True
        self._event(
            "error",
            plan.node_id,
            event.time,
            task=plan.task_id,
            reason=event.reason[:500],
            failures=self.scheduler.devices[plan.node_id].consecutive_failures,
            gave_up=retired,
        )
        self._after_failure(plan, retired, event)

    def _after_failure(self, plan: InFlight, retired: bool, event: ClockEvent) -> None:
        self.engine.forget(plan)
        node_id = plan.node_id
        if retired:
            self.tally.gave_up.append(node_id)
            stats = self.scheduler.devices[node_id]
            self._event(
                "give-up",
                node_id,
                event.time,
                failures=stats.failures,
                last_failure=stats.last_failure[:500],
            )
            log(WARNING, "[fedsync] node %d given up after repeated failures", node_id)
        else:
            self.clock.wake(node_id)

    def _on_lost(self, event: ClockEvent) -> None:
        plan: InFlight = event.task
        self.tally.drops[event.reason] += 1
        self.engine.forget(plan)
        self.scheduler.lose(plan.node_id)
        self._event("drop", plan.node_id, event.time, task=plan.task_id, reason=event.reason)
        self.clock.wake(plan.node_id)

    # --- helpers ------------------------------------------------------------------------------
    def _device_summary(self) -> dict[str, dict[str, Any]]:
        """Per-device counters and task times, with the device and class each node declared."""
        devices: dict[str, dict[str, Any]] = {}
        for node, stats in self.scheduler.summary().items():
            profile = self.profiles.get(int(node), NodeProfile(None))  # unprobed: empty
            devices[node] = {
                "device_index": self.device_of.get(int(node)),
                **profile.describe(),
                **stats,
            }
        return devices

    def _event(self, kind: str, node_id: int, time_: float | None = None, **fields: Any) -> None:
        """Write a per-device event (its device index and simulated time added)."""
        when = self.journal.sim(time_) if time_ is not None else self.journal.sim_now()
        self.recorder.events.write(
            kind, **{"node": node_id, "device": self.device_of[node_id], **fields, "sim_time": when}
        )


def _shared_fields(plan: InFlight) -> dict[str, Any]:
    """A shared downlink's dispatch fields: what the payload carried, how many changes,
    and what it adds to the broadcast figure; a delta's ``seeded`` first task says so;
    none otherwise."""
    downlink = plan.downlink
    if downlink.broadcast_bytes is None:
        return {"downlink_detail": downlink.detail} if downlink.detail else {}
    return {
        "downlink_detail": downlink.detail,
        "downlink_changes": downlink.links,
        "bytes_down_broadcast": downlink.broadcast_bytes + len(plan.mask) + len(plan.factors),
    }
