"""Ask nodes who they are: a QUERY message answered with the node's ``partition-id``.

Flower draws node ids at random in every simulation, so anything ordered by node id
(fleet assignment, who applies first, the seeds of dropout) would change from run to
run. The partition id is the stable name of a device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync import protocol

PROBE_KEY = protocol.PROBE_KEY
PARTITION_ID = protocol.PARTITION_ID


def probe_partitions(
    grid: Grid,
    node_ids: list[int],
    *,
    timeout: float,
    poll_interval: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, int]:
    """Ask every node for its ``partition-id``; return node id -> partition id.

    Nodes that do not answer within ``timeout`` real seconds (no query handler, an
    error) are left out; callers order them after the others, by node id. Probing is a
    nicety: a failed push is logged, never raised.
    """
    if timeout <= 0 or not node_ids:
        return {}
    messages = [
        Message(
            RecordDict({protocol.CONFIG: ConfigRecord({PROBE_KEY: 1})}),
            dst_node_id=node_id,
            message_type=MessageType.QUERY,
            ttl=timeout,
        )
        for node_id in node_ids
    ]
    try:
        message_ids = [str(m) for m in grid.push_messages(messages)]
    except Exception as err:  # never fail the run over a probe
        log(WARNING, "[fedsync] partition probe not sent: %s", err)
        return {}
    pending = {mid: node for mid, node in zip(message_ids, node_ids, strict=False) if mid}
    found: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        replies = list(grid.pull_messages(list(pending)))
        for reply in replies:
            node_id = pending.pop(reply.metadata.reply_to_message_id, None)
            if node_id is None or reply.has_error():
                continue
            metrics = reply.content.metric_records.get(protocol.METRICS)
            value = metrics.get(PARTITION_ID) if metrics is not None else None
            if isinstance(value, int) and not isinstance(value, bool):
                found[node_id] = value
        if pending and not replies:
            sleep(poll_interval)
    if len(found) < len(node_ids):
        log(
            INFO,
            "[fedsync] %d of %d nodes told their partition-id; the rest go by node id",
            len(found),
            len(node_ids),
        )
    return found
