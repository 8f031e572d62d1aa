"""Run the dense FedAvg baseline (Flower's strategy) and summarise it like every strategy."""

from __future__ import annotations

import time
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync import protocol
from fedsync.aggregation.tally import RunTally
from fedsync.config import RunConfig
from fedsync.reports import RunRecorder, RunSummary, plot_run
from fedsync.serverapp.evaluation import CentralEvaluator
from fedsync.serverapp.fedavg import MeteredFedAvg
from fedsync.serverapp.sync_timing import SyncRoundClock


def run_fedavg(
    grid: Grid,
    context: Context,
    config: RunConfig,
    recorder: RunRecorder,
    evaluator: CentralEvaluator,
) -> RunSummary:
    """Run Flower's FedAvg for ``num-rounds`` rounds with central evaluation.

    Returns
    -------
    RunSummary
        The same result as the asynchronous strategies': per-round accuracy, loss,
        exact bytes up/down and simulated time; totals; time and bytes to
        ``target-accuracy``.
    """
    settings, rounds = config.training, config.fedavg
    timing = SyncRoundClock(
        config.clock.fleet,
        assignment=config.clock.fleet_assignment,
        seed=settings.seed,
        probe_timeout=config.runtime.probe_timeout,
    )
    strategy = MeteredFedAvg(
        recorder,
        timing,
        epochs=settings.local_epochs,
        batch_size=settings.batch_size,
        fraction_train=rounds.fraction_train,
        fraction_evaluate=rounds.fraction_evaluate,
        min_train_nodes=rounds.min_train_nodes,
        min_evaluate_nodes=rounds.min_train_nodes if rounds.fraction_evaluate > 0 else 0,
        min_available_nodes=rounds.min_train_nodes,
    )
    target_accuracy = config.stop.target_accuracy
    tally = RunTally(target_accuracy=target_accuracy)
    started = time.monotonic()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        result = evaluator(arrays.to_torch_state_dict())
        traffic = strategy.rounds.get(server_round)
        if traffic is not None:
            tally.bytes_up += traffic.uplink_bytes
            tally.bytes_down += traffic.downlink_bytes
            tally.tasks += len(traffic.nodes)
            tally.arrivals += traffic.replies
            tally.aggregated += traffic.replies
            if traffic.lost:
                tally.drops["lost"] += traffic.lost
            if traffic.failures:
                tally.errors["reply-error"] += traffic.failures
        wall = time.monotonic() - started
        entry = tally.record_evaluation(server_round, result, sim_time=timing.now(), wall_time=wall)
        recorder.events.write(
            "evaluation", round=server_round, wall_seconds=round(wall, 3), **entry
        )
        log(
            INFO,
            "[fedsync] round %d/%d: test accuracy %.4f, loss %.4f, simulated %.1f s, wall %.1f s",
            server_round,
            rounds.num_rounds,
            result["accuracy"],
            result["loss"],
            timing.now(),
            wall,
        )
        return MetricRecord({"accuracy": result["accuracy"], "loss": result["loss"]})

    train_config = ConfigRecord(
        {
            protocol.LOCAL_EPOCHS: settings.local_epochs,
            protocol.BATCH_SIZE: settings.batch_size,
            protocol.LEARNING_RATE: settings.learning_rate,
            protocol.MOMENTUM: settings.momentum,
            protocol.TASK_SEED: settings.seed,
        }
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(evaluator.initial_state()),
        num_rounds=rounds.num_rounds,
        train_config=train_config,
        evaluate_fn=evaluate_fn,
    )

    plot_run(tally.evaluations, recorder.folder, "fedavg", target=target_accuracy or None)
    return RunSummary(
        strategy=RunConfig.BASELINE,
        stop_reason="num-rounds",
        aggregations=rounds.num_rounds,
        sim_time=timing.now(),
        wall_time=time.monotonic() - started,
        tally=tally,
        fleet=timing.spec.name,
        config=config.as_run_config(),
        details={"dataset": settings.dataset},
    )
