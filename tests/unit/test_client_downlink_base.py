"""A node keeps the decoded model for the next delta only in runs with delta downlinks.

In Flower's simulation every node's ``context.state`` lives in one process, so a copy
of the model per node there is memory that grows with the number of nodes; a run whose
downlinks are all ``full`` has no use for it. The real ClientApp path runs here
(:func:`fedsync.clients.app.train_task` on digits), as in ``test_client_state``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Context, RecordDict

from fedsync.clientapp.compressed import CODEC_STATE, DOWNLINK_BASE
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from tests.unit.test_client_state import RUN_CONFIG, _task_identity, global_model, task

__all__ = ["_task_identity"]  # the module-scoped fixture Message() needs


def _context(run_config: dict[str, Any]) -> Context:
    return Context(
        run_id=7,
        node_id=1,
        node_config={"partition-id": 1, "num-partitions": 3},
        state=RecordDict(),
        run_config=run_config,
    )


def test_full_downlink_runs_keep_no_model_per_node() -> None:
    # The task says whether the run sends delta downlinks (the server knows).
    context = _context({**RUN_CONFIG, "downlink-kind": "full"})
    train_task(task(1, delta_downlinks=False), context, ClientRuntime.from_context(context))
    assert DOWNLINK_BASE not in context.state.array_records
    assert CODEC_STATE in context.state.array_records  # error feedback memory stays


def test_delta_downlink_runs_keep_the_decoded_model() -> None:
    context = _context({**RUN_CONFIG, "downlink-kind": "delta"})
    train_task(task(1, delta_downlinks=True), context, ClientRuntime.from_context(context))
    base = context.state.array_records[DOWNLINK_BASE]
    for name, tensor in global_model().items():
        np.testing.assert_array_equal(base[name].numpy(), tensor.numpy())
