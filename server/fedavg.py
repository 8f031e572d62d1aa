"""The baseline: Flower's own FedAvg with dense float32 updates, measured.

Every later number in fedsync is compared with this strategy, so it is Flower's
``FedAvg`` itself -- sampling, aggregation and rounds untouched. The subclass only
*observes*: it counts the bytes of every model that goes out and every update that comes
back (lengths of the serialized arrays inside the real Flower messages) and records the
rounds in the run's event log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsync import protocol
from fedsync.reports import RunRecorder


def record_bytes(record: RecordDict) -> int:
    """Bytes of the arrays a message carries: the serialized payload Flower sends."""
    total = 0
    for array_record in record.array_records.values():
        total += sum(len(array.data) for array in array_record.values())
    return total


@dataclass
class RoundTraffic:
    """Bytes moved in one round, and by whom."""

    downlink_bytes: int = 0
    uplink_bytes: int = 0
    nodes: list[int] = field(default_factory=list)
    replies: int = 0
    failures: int = 0
    # Per node: seconds the ClientApp reported training for (real compute).
    compute_seconds: dict[int, float] = field(default_factory=dict)
    uplink_by_node: dict[int, int] = field(default_factory=dict)


class MeteredFedAvg(FedAvg):
    """Flower's ``FedAvg``, counting the real bytes of each round.

    Parameters
    ----------
    recorder : RunRecorder
        Where ``train_round`` events go.
    **kwargs
        Passed to :class:`flwr.serverapp.strategy.FedAvg` unchanged.
    """

    def __init__(self, recorder: RunRecorder, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.recorder = recorder
        self.rounds: dict[int, RoundTraffic] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does and count the model bytes sent to each."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        traffic = self.rounds.setdefault(server_round, RoundTraffic())
        for message in messages:
            traffic.downlink_bytes += record_bytes(message.content)
            traffic.nodes.append(message.metadata.dst_node_id)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate as FedAvg does, after counting each reply's bytes."""
        replies = list(replies)
        traffic = self.rounds.setdefault(server_round, RoundTraffic())
        for reply in replies:
            if reply.has_error():
                traffic.failures += 1
                continue
            node = reply.metadata.src_node_id
            size = record_bytes(reply.content)
            traffic.replies += 1
            traffic.uplink_bytes += size
            traffic.uplink_by_node[node] = size
            metrics = reply.content.metric_records.get(protocol.METRICS)
            if metrics is not None and protocol.COMPUTE_SECONDS in metrics:
                traffic.compute_seconds[node] = float(metrics[protocol.COMPUTE_SECONDS])
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.recorder.events.write(
            "train_round",
            round=server_round,
            nodes=len(traffic.nodes),
            replies=traffic.replies,
            failures=traffic.failures,
            bytes_down=traffic.downlink_bytes,
            bytes_up=traffic.uplink_bytes,
        )
        log(
            INFO,
            "[fedsync] round %d: %d replies, %d failures, %.2f MB down, %.2f MB up",
            server_round,
            traffic.replies,
            traffic.failures,
            traffic.downlink_bytes / 1e6,
            traffic.uplink_bytes / 1e6,
        )
        return arrays, metrics


EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
