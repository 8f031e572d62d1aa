"""A node-local, crash-safe copy of the uplink codec's sender memory.

Flower keeps ``context.state`` per node for the length of a run, but only in the
SuperNode process's memory: a restarted SuperNode starts with an empty one. The
error-feedback residual in it is update mass the node has computed and *not yet
sent*; losing it silently drops that work. With node config ``state-dir=/path`` the
ClientApp also writes the codec state to ``<state-dir>/codec-<job>-p<partition>.npz``
after every encode (temp file, fsync, ``os.replace``: see :mod:`fedsync.persist`) and
reads it back when ``context.state`` is empty. ``context.state`` stays the fast path:
the file is read only by a fresh node.

``<job>`` is the training job the server names in every task (:data:`JOB_KEY`; a
resumed server run keeps its job), so a residual carries over a SuperNode restart and a
ServerApp resume, but never into an unrelated run. One folder may serve several nodes
of one machine: the partition id is part of the name.

Each restore from disk appends a line to ``<state-dir>/restores.jsonl`` (time, job,
partition, the file's SHA-256, the step it continues from): an audit trail for
operators, and how a test sees that a restarted node picked its residual up.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Final

import numpy as np
from flwr.common.logger import log

from fedsync.codecs import CodecState, state_step, tensor_memory
from fedsync.persist import JOB_KEY, PersistError, bytes_digest, parse_arrays, save_arrays
from fedsync.updates import TensorSpec

__all__ = ["FORMAT", "JOB_KEY", "STATE_DIR", "CodecStateStore", "check_owner", "node_state_path"]

STATE_DIR: Final = "state-dir"
"""Node config key: the folder for this node's persisted state (absent: none kept)."""
FORMAT: Final = 1
"""Version of the state file's layout (its header says which it is)."""
JOURNAL: Final = "restores.jsonl"
"""File in the state folder that gets one line per restore from disk."""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def node_state_path(folder: Path, kind: str, *, job: str, partition_id: int) -> Path:
    """``<folder>/<kind>-<job>-p<partition>.npz``: where a node keeps one kind of its
    state of one job (the job made safe for a file name)."""
    return Path(folder).expanduser() / f"{kind}-{_SAFE.sub('_', job)[:80]}-p{partition_id}.npz"


def check_owner(meta: Mapping[str, Any], *, job: str, partition_id: int) -> None:
    """Raise ``ValueError`` unless a state file's header names this job and partition."""
    if meta.get("job") != job or meta.get("partition") != partition_id:
        raise ValueError(
            f"belongs to job {meta.get('job')!r} partition {meta.get('partition')!r}, "
            f"not {job!r} partition {partition_id}"
        )


class CodecStateStore:
    """Saves and restores one node's codec state (``UpdateCodec.to_state()`` arrays).

    Parameters
    ----------
    folder : pathlib.Path
        The node's state folder (created on first save).
    job : str
        The training job the state belongs to.
    partition_id : int
        The node's partition (part of the file name).
    """

    def __init__(self, folder: Path, *, job: str, partition_id: int) -> None:
        if not job:
            raise ValueError("job must be a non-empty name")
        self.folder = Path(folder).expanduser()
        self.job = job
        self.partition_id = partition_id
        self.path = node_state_path(self.folder, "codec", job=job, partition_id=partition_id)

    @classmethod
    def from_node_config(
        cls, node_config: Mapping[str, Any], *, job: str, partition_id: int
    ) -> CodecStateStore | None:
        """The store node config ``state-dir`` names, or ``None`` when it is unset."""
        folder = str(node_config.get(STATE_DIR, "") or "")
        if not folder:
            return None
        return cls(Path(folder), job=job, partition_id=partition_id)

    def save(self, state: Mapping[str, np.ndarray], *, task: str = "") -> Path:
        """Persist ``state`` (replaces the previous file atomically)."""
        meta = {
            "format": FORMAT,
            "job": self.job,
            "partition": self.partition_id,
            "step": state_step(state),
            "task": task,
            "saved_at": time.time(),
        }
        return save_arrays(self.path, state, meta)

    def load(self, specs: Mapping[str, TensorSpec]) -> dict[str, np.ndarray] | None:
        """The persisted state if there is one that fits this model, else ``None``.

        A file for another job, partition or model (the run changed the architecture)
        or one that cannot be read is ignored with a warning: a residual of the wrong
        model is worse than none.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            arrays, meta = parse_arrays(raw, source=str(self.path))
            self._check(arrays, meta, specs)
        except (PersistError, ValueError) as err:
            log(WARNING, "[fedsync] ignoring persisted codec state %s: %s", self.path, err)
            return None
        self._journal(meta, bytes_digest(raw))
        log(
            INFO,
            "[fedsync] restored codec state of job %s (step %d) from %s",
            self.job,
            meta.get("step", 0),
            self.path,
        )
        return arrays

    # --- helpers ------------------------------------------------------------------------
    def _check(
        self,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        specs: Mapping[str, TensorSpec],
    ) -> None:
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, this node reads {FORMAT}")
        check_owner(meta, job=self.job, partition_id=self.partition_id)
        for prefix, name, array in tensor_memory(arrays):
            spec = specs.get(name)
            if spec is None or array.size != spec.numel:
                raise ValueError(
                    f"{prefix}{name} ({array.size} values) does not fit the model "
                    f"({spec.numel if spec is not None else 'no such tensor'})"
                )
        CodecState.from_state(arrays)  # dtypes and ranks the codec will accept

    def _journal(self, meta: Mapping[str, Any], digest: str) -> None:
        entry = {
            "time": time.time(),
            "pid": os.getpid(),
            "job": self.job,
            "partition": self.partition_id,
            "file": str(self.path),
            "sha256": digest,
            "step": meta.get("step", 0),
            "saved_by_task": meta.get("task", ""),
        }
        try:
            with (self.folder / JOURNAL).open("a", encoding="utf-8") as journal:
                journal.write(json.dumps(entry) + "\n")
        except OSError as err:  # the audit trail must not cost the node its residual
            log(WARNING, "[fedsync] cannot append to %s: %s", self.folder / JOURNAL, err)
