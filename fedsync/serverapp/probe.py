"""Ask nodes who they are: a QUERY answered with a :class:`~fedsync.protocol.NodeProfile`.

Flower draws node ids at random in every simulation, so anything ordered by node id
(fleet assignment, who applies first, the seeds of dropout) would change from run to
run. The partition id is the stable name of a device. The profile also says which torch
device the node trains on and the device class it declares, for the run summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync import protocol
from fedsync.protocol import NodeProfile

PROBE_KEY = protocol.PROBE_KEY

PULL_WAIT_FACTOR = 4.0
"""After each pull the probe waits at least this many times as long as the pull took.

A pull costs time in proportion to the message ids it names: Flower's in-memory state
(a simulation's) checks each one under the lock its engine also needs to hand the
queries out and store the answers. With 10,000 probes pending, pulls back to back were
40 % of the simulation process's samples and start-up took 143 s; with this wait, 93 s
(both with one-pass deliveries, ``fedsync.compat.flower139`` section 6). Waiting 4x a
pull's time bounds the probe's share of that lock to about a fifth."""


def probe_nodes(
    grid: Grid,
    node_ids: list[int],
    *,
    timeout: float,
    poll_interval: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, NodeProfile]:
    """Ask every node who it is; return node id -> its profile.

    Nodes that do not answer within ``timeout`` real seconds (no query handler, an
    error) are left out, and so are profiles without a ``partition-id``; callers order
    those nodes after the others, by node id. Probing is a nicety: a failed push is
    logged, never raised.
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
    found: dict[int, NodeProfile] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        started = time.monotonic()
        replies = list(grid.pull_messages(list(pending)))
        pulled = time.monotonic() - started
        for reply in replies:
            node_id = pending.pop(reply.metadata.reply_to_message_id, None)
            if node_id is None or reply.has_error():
                continue
            profile = NodeProfile.from_record(reply.content)
            if profile.partition_id is not None:
                found[node_id] = profile
        if pending:
            sleep(max(0.0 if replies else poll_interval, PULL_WAIT_FACTOR * pulled))
    if len(found) < len(node_ids):
        log(
            INFO,
            "[fedsync] %d of %d nodes told their partition-id; the rest go by node id",
            len(found),
            len(node_ids),
        )
    return found


def device_order(node_ids: list[int], profiles: dict[int, NodeProfile]) -> list[int]:
    """Nodes in stable device order: by ``partition-id``, then the silent ones by node id."""

    def key(node_id: int) -> tuple[bool, int, int]:
        profile = profiles.get(node_id)
        partition = profile.partition_id if profile is not None else None
        return (partition is None, partition or 0, node_id)

    return sorted(node_ids, key=key)
