"""Run the dense FedAvg baseline (Flower's strategy) and summarise it."""

from __future__ import annotations

import time
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync import protocol
from fedsync.reports import RunRecorder, plot_accuracy
from fedsync.settings import TrainingSettings
from server.evaluation import CentralEvaluator
from server.fedavg import MeteredFedAvg


def run_fedavg(
    grid: Grid,
    context: Context,
    settings: TrainingSettings,
    recorder: RunRecorder,
    evaluator: CentralEvaluator,
) -> dict[str, Any]:
    """Run Flower's FedAvg for ``num-rounds`` rounds with central evaluation.

    Returns
    -------
    dict
        The summary: per-round accuracy, loss and exact bytes up/down, and totals.
    """
    strategy = MeteredFedAvg(
        recorder,
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=settings.min_train_nodes,
        min_evaluate_nodes=settings.min_train_nodes if settings.fraction_evaluate > 0 else 0,
        min_available_nodes=settings.min_train_nodes,
    )
    rounds: list[dict[str, Any]] = []
    started = time.monotonic()
    totals = {"up": 0, "down": 0}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        result = evaluator(arrays.to_torch_state_dict())
        traffic = strategy.rounds.get(server_round)
        bytes_up = traffic.uplink_bytes if traffic else 0
        bytes_down = traffic.downlink_bytes if traffic else 0
        totals["up"] += bytes_up
        totals["down"] += bytes_down
        entry = {
            "round": server_round,
            "accuracy": result["accuracy"],
            "loss": result["loss"],
            "bytes_up": bytes_up,
            "bytes_down": bytes_down,
            "cumulative_bytes_up": totals["up"],
            "cumulative_bytes_down": totals["down"],
            "wall_time": round(time.monotonic() - started, 3),
        }
        rounds.append(entry)
        recorder.events.write("evaluation", **entry)
        log(
            INFO,
            "[fedsync] round %d/%d: test accuracy %.4f, loss %.4f, %.1f s",
            server_round,
            settings.num_rounds,
            result["accuracy"],
            result["loss"],
            entry["wall_time"],
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
        num_rounds=settings.num_rounds,
        train_config=train_config,
        evaluate_fn=evaluate_fn,
    )

    plot_accuracy(
        {"fedavg": ([r["round"] for r in rounds], [r["accuracy"] for r in rounds])},
        recorder.folder / "accuracy.png",
        title=f"FedAvg on {settings.dataset}",
    )
    accuracies = [r["accuracy"] for r in rounds]
    return {
        "strategy": "fedavg",
        "dataset": settings.dataset,
        "num_rounds": settings.num_rounds,
        "final_accuracy": accuracies[-1],
        "best_accuracy": max(accuracies),
        "total_bytes_up": totals["up"],
        "total_bytes_down": totals["down"],
        "rounds": rounds,
        "failures": sum(t.failures for t in strategy.rounds.values()),
    }
