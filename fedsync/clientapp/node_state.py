"""Where a node keeps its per-node arrays between tasks: the context, or files.

A fedsync node carries arrays from one task to the next: the uplink codec's sender
memory (the error-feedback residual, one float32 copy of the model), the model it
decoded last (the base of a delta or shared downlink), the pruning masks it was sent,
and a DiLoCo inner optimizer's moments. Flower's place for such things is
``context.state``, and that is the default (``node-state = "context"``). In a
simulation, though, Flower keeps every simulated node's ``Context`` in the simulation
process and ships it to an actor and back with every message: per-node arrays cost
their size once per node in that process's memory (an 11M-parameter model's residual
is 44 MB: 44 GB at 1,000 nodes) and twice per message in serialisation.

With ``node-state = "disk"`` (run config, or node config, which wins) each of those
arrays goes to a file under ``node-state-dir`` instead, one per node and kind,
``<dir>/<job>/n<node>-<kind>.npz``, and ``context.state`` keeps only a token naming the
file's content. Resident memory is then what the nodes training at this moment hold
(one node's state per ClientApp actor); the files take ``nodes x state`` of disk. The
files are scratch space, not a checkpoint: written in place without ``fsync``, and
read only when the context's token matches the file's (a write cut short fails to
parse, or names another token). A file another run, another
node or a task that failed after writing left behind does not match; it reads as absent
(with a warning), which every caller already handles: the codec starts a fresh
residual, a delta downlink is refused and the server resends the whole model. Nothing
deletes the files when the run ends: remove ``<dir>/<job>`` (the server names the job
in every task). Crash-safe state across a SuperNode restart is node config
``state-dir`` (:mod:`fedsync.clientapp.state_store`), independent of this.

Use :func:`node_state` for the backend a node's configuration selects; a ClientApp
built on :func:`fedsync.clientapp.receive` needs nothing else.
"""

from __future__ import annotations

import abc
import secrets
import tempfile
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any, Final

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log

from fedsync.clientapp.frame_audit import safe_name
from fedsync.config import NodeSection, SettingsError
from fedsync.persist import PersistError, arrays_bytes, load_arrays

__all__ = [
    "DEFAULT_FOLDER",
    "ContextState",
    "DiskState",
    "NodeState",
    "node_state",
    "node_state_settings",
]

DEFAULT_FOLDER: Final = "fedsync-node-state"
"""The folder under the system's temporary folder when ``node-state-dir`` is empty."""
FORMAT: Final = 1
"""Version of a state file's layout (its header says which it is)."""
_TOKEN_SUFFIX: Final = "@disk"


class NodeState(abc.ABC):
    """One node's per-node arrays, by kind (a ``context.state`` record name)."""

    @abc.abstractmethod
    def get(self, kind: str) -> dict[str, np.ndarray] | None:
        """The arrays kept under ``kind``, or ``None`` when the node holds none."""

    @abc.abstractmethod
    def put(self, kind: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Keep ``arrays`` under ``kind`` (replacing what was there)."""

    @abc.abstractmethod
    def drop(self, kind: str) -> None:
        """Forget what is kept under ``kind`` (nothing happens when there is none)."""


class ContextState(NodeState):
    """The arrays in ``context.state.array_records`` (Flower's own place)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def get(self, kind: str) -> dict[str, np.ndarray] | None:
        record = self.context.state.array_records.get(kind)
        if record is None:
            return None
        return {name: array.numpy() for name, array in record.items()}

    def put(self, kind: str, arrays: Mapping[str, np.ndarray]) -> None:
        self.context.state.array_records[kind] = ArrayRecord(
            {name: Array(np.asarray(value)) for name, value in arrays.items()}
        )

    def drop(self, kind: str) -> None:
        self.context.state.array_records.pop(kind, None)


class DiskState(NodeState):
    """The arrays in one file per kind under ``folder``; the context keeps a token.

    Parameters
    ----------
    context : flwr.app.Context
        The node's context: its ``node_id`` names the files, its ``state`` keeps each
        file's token (config record ``<kind>@disk``).
    folder : pathlib.Path
        Where the files go (created when a file is written).
    job : str
        The training job (a subfolder; a task without one uses ``run-<run id>``).
    """

    def __init__(self, context: Context, folder: Path, *, job: str = "") -> None:
        self.context = context
        self.folder = Path(folder).expanduser() / safe_name(job or f"run-{context.run_id}")[:80]

    def path(self, kind: str) -> Path:
        """The file that holds ``kind``."""
        return self.folder / f"n{self.context.node_id}-{safe_name(kind)}.npz"

    def get(self, kind: str) -> dict[str, np.ndarray] | None:
        record = self.context.state.config_records.get(kind + _TOKEN_SUFFIX)
        if record is None:
            return None
        token = record.get("token")
        path = self.path(kind)
        try:
            arrays, meta = load_arrays(path)
            if meta.get("format") != FORMAT or meta.get("token") != token:
                raise PersistError(
                    f"{path} holds token {meta.get('token')!r}, the context {token!r} "
                    "(left by another run, or by a task that failed after writing)"
                )
        except (OSError, PersistError) as err:
            log(WARNING, "[fedsync] node state %r reads as absent: %s", kind, err)
            return None
        return arrays

    def put(self, kind: str, arrays: Mapping[str, np.ndarray]) -> None:
        token = secrets.token_hex(8)
        meta = {"format": FORMAT, "token": token, "kind": kind, "node": self.context.node_id}
        data = arrays_bytes(arrays, meta)
        self.folder.mkdir(parents=True, exist_ok=True)
        # Written in place: no temporary file, no rename, no fsync (scratch state). A
        # write cut short leaves a file that fails to parse or names another token, and
        # the context is only told the new token once the file holds it.
        self.path(kind).write_bytes(data)
        self.context.state.config_records[kind + _TOKEN_SUFFIX] = ConfigRecord({"token": token})

    def drop(self, kind: str) -> None:
        self.context.state.config_records.pop(kind + _TOKEN_SUFFIX, None)
        self.path(kind).unlink(missing_ok=True)


def node_state_settings(context: Context) -> NodeSection:
    """``node-state`` and ``node-state-dir`` for this node: its node config, else the
    run config (plain, or under ``fedsync.``), else the defaults.

    Raises
    ------
    fedsync.config.SettingsError
        For a value that is not a backend's name, naming the key.
    """
    values: dict[str, Any] = {}
    for name in ("node-state", "node-state-dir"):
        for source in (context.node_config, context.run_config):
            for key in (name, "fedsync." + name):
                if key in source and name not in values:
                    values[name] = source[key]
    try:
        return NodeSection.from_run_config(values)
    except SettingsError as err:
        raise SettingsError(f"{err} (node config or run config)") from err


def node_state(context: Context, *, job: str = "") -> NodeState:
    """The node's per-node state backend, as ``node-state`` selects it.

    Parameters
    ----------
    context : flwr.app.Context
        The ClientApp's context.
    job : str
        The task's training job (names the disk backend's subfolder).
    """
    settings = node_state_settings(context)
    if settings.node_state == "context":
        return ContextState(context)
    folder = settings.node_state_dir or str(Path(tempfile.gettempdir()) / DEFAULT_FOLDER)
    return DiskState(context, Path(folder), job=job)
