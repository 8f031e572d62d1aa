"""A device's inner optimizer, kept from task to task (DiLoCo's workers keep theirs).

:class:`fedsync.models.training.InnerOptimizer` holds the local optimizer's moments and
the device's step count (where its learning-rate schedule stands). Between tasks it
lives in Flower's ``context.state`` (record :data:`INNER_OPTIMIZER`; or in a file, with
``node-state = "disk"``: :mod:`fedsync.clientapp.node_state`); with node config
``state-dir`` it is also written to ``<state-dir>/optim-<job>-p<partition>.npz`` after
every task (crash-safe, :mod:`fedsync.persist`) and read back by a restarted node,
like the codec's error-feedback residual (:mod:`fedsync.clientapp.state_store`). A file
of another job or partition, or one that cannot be read, is ignored with a warning;
:meth:`~fedsync.models.training.InnerOptimizer.check_fits` tells a state of another
model (fedsync's app then starts a fresh optimizer, with a warning, never a wrong one;
``load_into`` and ``train`` refuse it). A dense Flower task (``FedAvg``) names no job:
its state is kept in ``context.state`` only. A server resumed on nodes that restarted
without ``state-dir`` starts every site's optimizer afresh (warm-up included).

In ``reset`` mode (``client-optimizer-state``) only the step count is kept, so a
schedule still runs across tasks while every task starts fresh moments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from flwr.app import Context
from flwr.common.logger import log

from fedsync.clientapp.node_state import NodeState, node_state
from fedsync.clientapp.state_store import STATE_DIR, check_owner, node_state_path
from fedsync.models.training import InnerOptimizer
from fedsync.persist import PersistError, parse_arrays, save_arrays

__all__ = ["INNER_OPTIMIZER", "keep_inner_optimizer", "restore_inner_optimizer"]

INNER_OPTIMIZER: Final = "fedsync-inner-optimizer"
"""Node state kind (:mod:`fedsync.clientapp.node_state`): the device's inner optimizer
(moments and step count)."""
FORMAT: Final = 1
"""Version of the file's layout (its header says which it is)."""

_STEPS = "steps"


def restore_inner_optimizer(
    context: Context,
    *,
    job: str = "",
    partition_id: int = 0,
    keep_moments: bool = True,
    state: NodeState | None = None,
) -> InnerOptimizer:
    """This device's inner optimizer: from ``context.state``, else from ``state-dir``
    (a restarted node), else a fresh one.

    Parameters
    ----------
    context : flwr.app.Context
        The ClientApp's context.
    job : str
        The training job (a task's ``fedsync-job``); empty: not kept on disk.
    partition_id : int
        The node's partition (part of the file name).
    keep_moments : bool
        ``False`` (``client-optimizer-state = "reset"``): only the step count.
    state : NodeState, optional
        Where the node keeps it (default: the backend ``node-state`` selects).
    """
    held = state if state is not None else node_state(context, job=job)
    arrays: Mapping[str, np.ndarray] | None = held.get(INNER_OPTIMIZER)
    if arrays is None:
        path = _path(context.node_config, job, partition_id)
        if path is not None:
            arrays = _read(path, job, partition_id)
    if arrays is None:
        return InnerOptimizer()
    return _from_arrays(arrays, keep_moments)


def keep_inner_optimizer(
    inner: InnerOptimizer,
    context: Context,
    *,
    job: str = "",
    partition_id: int = 0,
    state: NodeState | None = None,
) -> None:
    """Keep ``inner`` in ``state`` (default: the backend ``node-state`` selects) and,
    with node config ``state-dir`` and a ``job``, on disk."""
    arrays = _to_arrays(inner)
    held = state if state is not None else node_state(context, job=job)
    held.put(INNER_OPTIMIZER, arrays)
    path = _path(context.node_config, job, partition_id)
    if path is not None:
        meta = {"format": FORMAT, "job": job, "partition": partition_id, "steps": inner.steps}
        save_arrays(path, arrays, meta)


def _to_arrays(inner: InnerOptimizer) -> dict[str, np.ndarray]:
    arrays = {_STEPS: np.asarray([inner.steps], dtype=np.int64)}
    for index, entries in (inner.state or {}).items():
        for name, value in entries.items():
            held = value.detach().to("cpu")
            if held.is_floating_point() and held.dtype != torch.float64:
                held = held.float()  # numpy has no bfloat16; loading casts back
            arrays[f"{index}/{name}"] = held.numpy().copy()
    return arrays


def _from_arrays(arrays: Mapping[str, np.ndarray], keep_moments: bool) -> InnerOptimizer:
    steps = int(np.asarray(arrays.get(_STEPS, [0])).reshape(-1)[0])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, array in arrays.items():
        if key == _STEPS:
            continue
        index, _, name = key.partition("/")
        state.setdefault(int(index), {})[name] = torch.from_numpy(np.array(array))
    return InnerOptimizer(state if keep_moments and state else None, steps)


def _path(node_config: Mapping[str, Any], job: str, partition_id: int) -> Path | None:
    folder = str(node_config.get(STATE_DIR, "") or "")
    if not folder or not job:
        return None
    return node_state_path(Path(folder), "optim", job=job, partition_id=partition_id)


def _read(path: Path, job: str, partition_id: int) -> dict[str, np.ndarray] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:  # unreadable: start fresh rather than fail the task
        log(WARNING, "[fedsync] ignoring persisted inner optimizer %s: %s", path, err)
        return None
    try:
        arrays, meta = parse_arrays(raw, source=str(path))
        if meta.get("format") != FORMAT:
            raise PersistError(f"format {meta.get('format')!r}, this node reads {FORMAT}")
        check_owner(meta, job=job, partition_id=partition_id)
        for key in arrays:
            if key != _STEPS and not re.fullmatch(r"\d+/\w+", key):
                raise PersistError(f"unexpected entry {key!r}")
    except (PersistError, ValueError) as err:
        log(WARNING, "[fedsync] ignoring persisted inner optimizer %s: %s", path, err)
        return None
    return arrays
