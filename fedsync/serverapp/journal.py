"""What an asynchronous run writes down: evaluations, checkpoints, times and the summary.

The loop (:mod:`fedsync.serverapp.loop`) decides *when*; the :class:`RunJournal` does the
writing: central evaluations every ``eval-every`` aggregations, checkpoints every
``checkpoint-every``, the simulated times a resumed job continues from, and the
:class:`~fedsync.reports.RunSummary` at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.common.logger import log

from fedsync.engine import AggregationEngine
from fedsync.reports import RunRecorder, RunSummary, plot_run
from fedsync.reports.progress_bar import LoopProgress
from fedsync.serverapp.checkpoint import AsyncCheckpoint, restore_tally, tally_state

__all__ = ["EvaluateFn", "RunJournal"]

EvaluateFn = Callable[[int, dict[str, torch.Tensor]], Mapping[str, float] | None]
"""``(version, state) -> {"accuracy": ..., "loss": ..., ...}``, or ``None`` (nothing
measured): the central evaluation of the global model at a model version."""


class RunJournal:
    """Evaluations, checkpoints and the summary of one asynchronous run.

    Parameters
    ----------
    engine : AggregationEngine
        Its model, version and tally are what gets written.
    recorder : RunRecorder
        The results folder.
    evaluate_fn : callable
        ``(version, state) -> {"accuracy": ..., "loss": ..., ...}`` or ``None``, the
        central evaluation of the model at that version.
    resume : AsyncCheckpoint, optional
        The checkpoint the engine was built from: counters, job and times continue.
    checkpoint_fn : callable, optional
        Receives the checkpoints; none: no checkpoints.
    """

    def __init__(
        self,
        engine: AggregationEngine,
        recorder: RunRecorder,
        evaluate_fn: EvaluateFn,
        *,
        resume: AsyncCheckpoint | None = None,
        checkpoint_fn: Callable[[AsyncCheckpoint], object] | None = None,
    ) -> None:
        self.engine = engine
        self.config = engine.config
        self.tally = engine.tally
        self.recorder = recorder
        self.evaluate_fn = evaluate_fn
        self.checkpoint_fn = checkpoint_fn
        self.checkpoint_every = self.config.checkpoints.checkpoint_every if checkpoint_fn else 0
        self.now: Callable[[], float] = lambda: 0.0
        """The clock's time (set by the loop once its clock exists)."""
        self.time_cap = float("inf")
        self.tasks_dispatched = 0
        self.job_id = uuid.uuid4().hex[:16]
        self.resumed = resume
        self._wall_before = 0.0
        self._time_offset = 0.0
        self._last_checkpoint_version = -1
        if resume is not None:
            self.tally.bytes_up, self.tally.bytes_down = resume.bytes_up, resume.bytes_down
            restore_tally(self.tally, resume.tally)
            engine.restore_progress(resume.progress)
            # Task ids and seeds go on instead of repeating; max-tasks counts the job.
            self.tasks_dispatched = resume.tasks_dispatched
            self.job_id = resume.job_id or self.job_id
            self._wall_before = resume.wall_time
            self._time_offset = resume.sim_time
            self._last_checkpoint_version = resume.version
        self._wall_start = time.monotonic()
        self.last_eval_version = -1
        self.progress = LoopProgress(self.config.stop.max_aggregations, engine.strategy.name)
        """A bar over the aggregations, drawn only at a terminal outside CI."""

    # --- times --------------------------------------------------------------------------------
    @property
    def time_offset(self) -> float:
        """Clock time reached before a resume (reported times continue from it)."""
        return self._time_offset

    def sim(self, time_: float) -> float:
        """A clock time as the job's time (offset by what ran before a resume)."""
        return round(time_ + self._time_offset, 6)

    def sim_now(self) -> float:
        """The job's time now (capped at ``max-sim-time`` once the run hit it)."""
        return self.sim(min(self.now(), self.time_cap))

    def wall(self) -> float:
        """Real seconds this run has taken."""
        return time.monotonic() - self._wall_start

    # --- aggregation, evaluation, checkpoints -------------------------------------------------
    def aggregated(self, time_: float, updates: int, weight_sum: float) -> None:
        """The engine stepped the model: record it, evaluate and checkpoint when due."""
        version = self.engine.version
        self.recorder.events.write(
            "aggregation",
            version=version,
            updates=updates,
            weight_sum=round(weight_sum, 9),
            sim_time=self.sim(time_),
            bytes_up=self.tally.bytes_up,
            bytes_down=self.tally.bytes_down,
        )
        self.progress.update(version)
        if version % self.config.runtime.eval_every == 0:
            self.evaluate()
        if self.checkpoint_every and version % self.checkpoint_every == 0:
            # Right after an aggregation the buffer is empty: nothing cached is lost.
            self.save_checkpoint()

    def evaluate(self) -> None:
        """Evaluate the global model centrally and record it."""
        version = self.engine.version
        metrics = self.evaluate_fn(version, self.engine.state)
        if metrics is None:  # an application's evaluate_fn may measure nothing this time
            return
        now = self.sim_now()
        entry = self.tally.record_evaluation(
            version, dict(metrics), sim_time=now, wall_time=self.wall()
        )
        self.last_eval_version = version
        self.recorder.events.write("evaluation", **entry)
        self.progress.update(
            version, accuracy=entry["accuracy"], sim_time=now, warning=entry.get("health_warning")
        )
        log(
            INFO,
            "[fedsync] v%d: accuracy %.4f, loss %.4f, sim %.1f s, up %d B, down %d B",
            version,
            entry["accuracy"],
            entry["loss"],
            now,
            self.tally.bytes_up,
            self.tally.bytes_down,
        )
        if not self.checkpoint_every:
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Hand a checkpoint to ``checkpoint_fn`` (a failure is logged, not raised)."""
        if self.checkpoint_fn is None:
            return
        version = self.engine.version
        try:
            self.checkpoint_fn(self.checkpoint())
        except Exception as err:  # a full disk must not end a long run; say so loudly
            log(WARNING, "[fedsync] checkpoint at v%d failed: %s", version, err)
            self.recorder.events.write(
                "checkpoint-failed", version=version, error=f"{type(err).__name__}: {err}"
            )
            return
        self._last_checkpoint_version = version
        self.recorder.events.write(
            "checkpoint", version=version, tasks=self.tasks_dispatched, sim_time=self.sim_now()
        )

    def checkpoint(self) -> AsyncCheckpoint:
        """The run as it stands, to resume from."""
        engine = self.engine
        earlier = self.resumed.evaluations if self.resumed is not None else []
        return AsyncCheckpoint(
            engine.version,
            {k: v.detach().to("cpu", copy=True) for k, v in engine.state.items()},
            engine.optimizer.state_dict(),
            self.sim_now(),
            self.tally.bytes_up,
            self.tally.bytes_down,
            tasks_dispatched=self.tasks_dispatched,
            tally=tally_state(self.tally),
            evaluations=[dict(e) for e in (*earlier, *self.tally.evaluations)],
            job_id=self.job_id,
            wall_time=self._wall_before + self.wall(),
            meta={
                "strategy": engine.strategy.name,
                "config": self.config.as_run_config(),
                "buffered_updates": len(engine.buffer),
            },
            pruning=engine.pruned.checkpoint_state() if engine.pruned is not None else {},
            progress=engine.progress_state(),
        )

    # --- the end ------------------------------------------------------------------------------
    def finish(
        self, stop_reason: str, *, fleet: str, clock: dict[str, Any], **details: Any
    ) -> RunSummary:
        """Final checkpoint, ``summary.json``, plots; returns the summary."""
        self.progress.close()
        engine = self.engine
        if self.checkpoint_every and self._last_checkpoint_version != engine.version:
            # The end state, for extending a finished run (resume with more aggregations);
            # its cached updates are counted as discarded below, as they are.
            self.save_checkpoint()
        resumed = self.resumed
        summary = RunSummary(
            strategy=engine.strategy.name,
            stop_reason=stop_reason,
            aggregations=engine.version,
            sim_time=self.sim_now(),
            wall_time=self.wall(),
            tally=self.tally,
            fleet=fleet,
            config=self.config.as_run_config(),
            details={
                "updates_discarded_at_end": engine.discard_buffer(),
                **details,
                **engine.describe(),
                "job": self.job_id,
                "resumed_from": (
                    {
                        "version": resumed.version,
                        "wall_time_before": round(self._wall_before, 3),
                        "evaluations_before": resumed.evaluations,
                    }
                    if resumed is not None
                    else None
                ),
                "clock": clock,
            },
        )
        self.recorder.events.write(
            "async_end",
            reason=stop_reason,
            version=engine.version,
            sim_time=round(summary.sim_time, 6),
            bytes_up=self.tally.bytes_up,
            bytes_down=self.tally.bytes_down,
        )
        self.recorder.write_summary(summary.to_dict())
        if self.config.output.plots:
            plot_run(
                self.tally.evaluations,
                self.recorder.folder,
                engine.strategy.name,
                target=self.config.stop.target_accuracy or None,
                time_label=f"{'simulated' if clock.get('clock') == 'virtual' else 'wall'} time (s)",
            )
        log(
            INFO,
            "[fedsync] %s ended (%s) at v%d",
            engine.strategy.name,
            stop_reason,
            engine.version,
        )
        return summary
