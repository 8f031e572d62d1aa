"""The baseline: Flower's own FedAvg with dense float32 updates, measured.

Every later number in fedsync is compared with this strategy, so it is Flower's
``FedAvg`` itself -- sampling, aggregation and rounds untouched. The subclass only
*observes*: it counts the bytes of every model that goes out and every update that comes
back (the frame length of the arrays inside the real Flower messages, the ruler every
strategy is measured with: :func:`record_bytes`), times each
round on the fleet's virtual clock (:mod:`fedsync.serverapp.sync_timing`), and records the rounds
in the run's event log.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsync import protocol
from fedsync.clock import TaskWork
from fedsync.codecs import UpdateCodec
from fedsync.records import get_int
from fedsync.reports import RunRecorder
from fedsync.serverapp.sync_timing import SyncRoundClock


def record_bytes(record: RecordDict) -> int:
    """Bytes of the arrays a message carries, counted as the asynchronous strategies count
    theirs: the length of a fedsync frame holding them (``none+fp32``: every value, raw).

    Flower serializes each array with its own npy header; a frame carries one header and
    a tensor table instead, so FedAvg and the compressed strategies are measured with the
    same ruler. Arrays that are not floating point (counters) count their raw bytes.
    """
    floats: list[tuple[str, tuple[int, ...], str]] = []
    other = 0
    for array_record in record.array_records.values():
        for name, array in array_record.items():
            if array.dtype.startswith("float"):
                floats.append((name, tuple(array.shape), array.dtype))
            else:
                other += len(array.data)
    return (dense_frame_bytes(tuple(floats)) if floats else 0) + other


@functools.lru_cache(maxsize=64)
def dense_frame_bytes(tensors: tuple[tuple[str, tuple[int, ...], str], ...]) -> int:
    """Length of the ``none+fp32`` frame of tensors of these names, shapes and dtypes
    (it depends on nothing else, so it is computed once per model)."""
    zeros = {
        name: torch.zeros(shape, dtype=getattr(torch, dtype)) for name, shape, dtype in tensors
    }
    return len(UpdateCodec("none+fp32").encode(zeros))


@dataclass
class RoundTraffic:
    """Bytes moved in one round, and by whom."""

    downlink_bytes: int = 0
    uplink_bytes: int = 0
    nodes: list[int] = field(default_factory=list)
    replies: int = 0
    failures: int = 0
    lost: int = 0
    sim_start: float = 0.0
    sim_end: float = 0.0


class MeteredFedAvg(FedAvg):
    """Flower's ``FedAvg``, counting the real bytes and simulated time of each round.

    Parameters
    ----------
    recorder : RunRecorder
        Where ``train_round`` events go.
    timing : SyncRoundClock
        Times each round on the fleet's virtual clock; replies of tasks the clock lost
        (dropout, offline) are left out of the aggregation.
    epochs, batch_size : int
        The local work per task (for the simulated compute time).
    **kwargs
        Passed to :class:`flwr.serverapp.strategy.FedAvg` unchanged.
    """

    def __init__(
        self,
        recorder: RunRecorder,
        timing: SyncRoundClock,
        *,
        epochs: int,
        batch_size: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.recorder = recorder
        self.timing = timing
        self.epochs = epochs
        self.batch_size = batch_size
        self.rounds: dict[int, RoundTraffic] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does; count the model bytes sent to each; start the clock."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        traffic = self.rounds.setdefault(server_round, RoundTraffic())
        downlink: dict[int, int] = {}
        for message in messages:
            size = record_bytes(message.content)
            traffic.downlink_bytes += size
            traffic.nodes.append(message.metadata.dst_node_id)
            downlink[message.metadata.dst_node_id] = size
        self.timing.assign(grid, sorted(int(n) for n in grid.get_node_ids()))
        self.timing.start_round(server_round, downlink)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Count each reply's bytes, time the round, and aggregate as FedAvg does."""
        replies = list(replies)
        traffic = self.rounds.setdefault(server_round, RoundTraffic())
        works: dict[int, TaskWork] = {}
        for reply in replies:
            if reply.has_error():
                traffic.failures += 1
                continue
            size = record_bytes(reply.content)
            metrics = reply.content.metric_records.get(protocol.METRICS) or MetricRecord()
            works[reply.metadata.src_node_id] = TaskWork.from_reply(
                size,
                examples=get_int(metrics, protocol.NUM_EXAMPLES, 0),
                steps=get_int(metrics, protocol.NUM_STEPS, 0),
                epochs=self.epochs,
                batch_size=self.batch_size,
            )
        round_timing = self.timing.finish_round(works)
        traffic.sim_start, traffic.sim_end = round_timing.start, round_timing.end
        # A reply whose task the clock lost never reached the server in the simulated
        # world: it is neither counted nor aggregated.
        delivered = [
            r for r in replies if r.has_error() or r.metadata.src_node_id not in round_timing.lost
        ]
        traffic.lost = len(replies) - len(delivered)
        for reply in delivered:
            if not reply.has_error():
                traffic.replies += 1
                traffic.uplink_bytes += works[reply.metadata.src_node_id].uplink_bytes
        arrays, aggregated_metrics = super().aggregate_train(server_round, delivered)
        self.recorder.events.write(
            "train_round",
            round=server_round,
            nodes=len(traffic.nodes),
            replies=traffic.replies,
            failures=traffic.failures,
            lost=traffic.lost,
            bytes_down=traffic.downlink_bytes,
            bytes_up=traffic.uplink_bytes,
            sim_start=round(traffic.sim_start, 6),
            sim_end=round(traffic.sim_end, 6),
        )
        log(
            INFO,
            "[fedsync] round %d: %d replies, %d failures, %d lost, %.2f MB down, %.2f MB up, "
            "simulated %.1f s",
            server_round,
            traffic.replies,
            traffic.failures,
            traffic.lost,
            traffic.downlink_bytes / 1e6,
            traffic.uplink_bytes / 1e6,
            traffic.sim_end,
        )
        return arrays, aggregated_metrics
