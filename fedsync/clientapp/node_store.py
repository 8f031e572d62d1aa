"""Everything a node keeps between tasks, in one store.

A fedsync node carries arrays from one task to the next, by kind:

- :data:`CODEC_STATE`: the uplink codec's sender memory (the error-feedback residual,
  one float32 copy of the model, and the step count);
- :data:`INNER_OPTIMIZER`: a device's inner optimizer (DiLoCo's moments and step count);
- the downlink's state (:mod:`fedsync.clientapp.compressed`): the model it decoded last
  (the base of a delta, shared or relay downlink), the pruning masks it was sent, a
  relay downlink's optimizer copy and sent frames.

:class:`NodeStore` keeps them all, as two settings say (node config, which wins, else
the run config, plain or under ``fedsync.``):

``node-state`` (``"context"`` or ``"disk"``)
    Where the arrays live between tasks. ``context`` (the default) is Flower's
    ``context.state``. In a simulation Flower keeps every simulated node's ``Context``
    in the simulation process and ships it with every message, so per-node arrays cost
    their size once per node in that process (an 11M-parameter model's residual is
    44 MB: 44 GB at 1,000 nodes) and twice per message in serialisation. With ``disk``
    each kind goes to a file, ``<folder>/<job>/n<node>-<kind>.npz``, and
    ``context.state`` keeps a token naming the file's content: resident memory is what
    the nodes training at this moment hold. These files are scratch space, written in
    place without ``fsync`` and read only when the context's token matches the file's;
    one another run, node or failed task left behind reads as absent (with a warning),
    which every caller handles (a fresh residual; the server resends the whole model).
``state-dir`` (a folder; empty: none)
    The node's own folder. Named, the kinds that are work the node did and has not
    sent (:data:`DURABLE`: the codec's memory, the inner optimizer) are kept there
    crash-safe after every task (temporary file, ``fsync``, ``os.replace``:
    :mod:`fedsync.persist`), as ``<state-dir>/<prefix>-<job>-p<partition>.npz``, and a
    node whose ``context.state`` holds no record of them (a restarted SuperNode, a
    resumed job) reads them back, if the file's job and partition are its own and its
    arrays fit the model; each such restore appends a line to
    ``<state-dir>/restores.jsonl`` (:data:`JOURNAL`). With ``node-state = "disk"`` the
    scratch files go there too (empty: ``fedsync-node-state`` in the system's
    temporary folder), and a durable kind has one file, the crash-safe one.

A node that trains on an accelerator in a process that outlives its tasks (the warm
executor) also keeps the live codec state on the device between tasks
(:meth:`NodeStore.take_live` / :meth:`NodeStore.keep_live`) instead of uploading the
saved copy again; the saved copy is still written every task and is what any other
process resumes from. The live state is only taken when it is provably the one that
copy was made from: each save files it under a fresh token kept next to the record,
a task takes it out (so a task that fails half-way leaves none behind), and any other
case (a new process, another run, a state rewritten by someone else) falls back to the
saved copy.

:meth:`NodeStore.of` builds the store a node's configuration selects; a ClientApp built
on :func:`fedsync.clientapp.receive` needs nothing else.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log

from fedsync.clientapp.frame_audit import safe_name
from fedsync.codecs import CodecState, UpdateCodec, state_step, tensor_memory
from fedsync.config import RENAMED_KEYS, NodeSection, SettingsError, node_partition, renamed_key
from fedsync.persist import (
    PersistError,
    arrays_bytes,
    bytes_digest,
    load_arrays,
    parse_arrays,
    save_arrays,
)
from fedsync.records import get_str
from fedsync.updates import TensorSpec

__all__ = [
    "CODEC_STATE",
    "DEFAULT_FOLDER",
    "DURABLE",
    "INNER_OPTIMIZER",
    "JOURNAL",
    "LIVE_TOKEN",
    "Durable",
    "LiveStates",
    "NodeStore",
    "keeps_live_state",
    "node_settings",
    "partition_of",
]

CODEC_STATE: Final = "fedsync-codec-state"
"""Kind: the uplink codec's sender memory (residuals, velocities, step)."""
INNER_OPTIMIZER: Final = "fedsync-inner-optimizer"
"""Kind: the device's inner optimizer (moments and step count)."""
DEFAULT_FOLDER: Final = "fedsync-node-state"
"""The folder of ``node-state = "disk"`` under the system's temporary folder when no
``state-dir`` is named."""
JOURNAL: Final = "restores.jsonl"
"""File in ``state-dir`` that gets one line per restore from it."""
LIVE_TOKEN: Final = "fedsync-codec-live"
"""``context.state`` config record: the token of the saved codec state's live twin."""
FORMAT: Final = 1
"""Version of a file's layout (its header says which it is)."""
MAX_LIVE: Final = 8
"""Live states a process keeps (least recently saved dropped first)."""

_TOKEN_SUFFIX: Final = "@disk"
_SETTINGS: Final = ("node-state", "state-dir")


# --- the kinds kept crash-safe ------------------------------------------------------------------
def _check_codec_state(
    arrays: Mapping[str, np.ndarray], specs: Mapping[str, TensorSpec] | None
) -> None:
    if specs is not None:
        for prefix, name, array in tensor_memory(arrays):
            spec = specs.get(name)
            if spec is None or array.size != spec.numel:
                raise ValueError(
                    f"{prefix}{name} ({array.size} values) does not fit the model "
                    f"({spec.numel if spec is not None else 'no such tensor'})"
                )
    CodecState.from_state(arrays)  # dtypes and ranks the codec will accept


def _check_inner_optimizer(
    arrays: Mapping[str, np.ndarray], specs: Mapping[str, TensorSpec] | None
) -> None:
    del specs  # the optimizer's fit is checked where it is loaded (check_fits)
    for key in arrays:
        if key != "steps" and not re.fullmatch(r"\d+/\w+", key):
            raise PersistError(f"unexpected entry {key!r}")


def _inner_steps(arrays: Mapping[str, np.ndarray]) -> int:
    steps = arrays.get("steps")
    return int(np.asarray(steps).reshape(-1)[0]) if steps is not None else 0


@dataclass(frozen=True)
class Durable:
    """A kind that ``state-dir`` keeps crash-safe: work the node did and has not sent.

    Attributes
    ----------
    prefix : str
        The file's name starts with it (``<prefix>-<job>-p<partition>.npz``).
    check : callable
        ``check(arrays, specs)`` raises ``ValueError`` for arrays a restarted node must
        not take (another model; ``specs`` is ``None`` when the caller names none).
    step : callable
        The step a state has reached (written in the header and the journal).
    """

    prefix: str
    check: Callable[[Mapping[str, np.ndarray], Mapping[str, TensorSpec] | None], None]
    step: Callable[[Mapping[str, np.ndarray]], int]


DURABLE: Final[Mapping[str, Durable]] = {
    CODEC_STATE: Durable("codec", _check_codec_state, state_step),
    INNER_OPTIMIZER: Durable("optim", _check_inner_optimizer, _inner_steps),
}
"""The kinds ``state-dir`` keeps across a restart; every other kind is the downlink's,
which the server sends again to a node that lost it."""


# --- settings -----------------------------------------------------------------------------------
def node_settings(context: Context) -> NodeSection:
    """``node-state`` and ``state-dir`` for this node: its node config, else the run
    config (plain, or under ``fedsync.``), else the defaults.

    Raises
    ------
    fedsync.config.SettingsError
        For a value that is not a backend's name or not a folder, or a key by its old
        name (``node-state-dir``), naming the key.
    """
    values: dict[str, Any] = {}
    for source in (context.node_config, context.run_config):
        for old in RENAMED_KEYS:
            for prefix in ("", "fedsync."):
                if prefix + old in source:
                    raise renamed_key(old, prefix=prefix)
        for name in _SETTINGS:
            for key in (name, "fedsync." + name):
                if key in source and name not in values:
                    values[name] = source[key]
    try:
        return NodeSection.from_run_config(values)
    except SettingsError as err:
        raise SettingsError(f"{err} (node config or run config)") from err


def partition_of(context: Context) -> int:
    """The node's ``partition-id`` (names its files, seeds its codec); the node id when
    it has none."""
    try:
        return node_partition(context.node_config)[0]
    except ValueError:  # SettingsError, or a value that is not a number
        return context.node_id % (1 << 31)


def keeps_live_state(device: torch.device) -> bool:
    """Whether a node on ``device`` keeps its codec memory live between tasks: on an
    accelerator, where reloading it means copying it back; on the CPU the saved host
    arrays are already where the codec runs."""
    return device.type != "cpu"


# --- the store ----------------------------------------------------------------------------------
class NodeStore:
    """One node's arrays between tasks, by kind (a ``context.state`` record name).

    Parameters
    ----------
    context : flwr.app.Context
        The node's context.
    job : str
        The training job the task names (empty: a dense Flower task; then nothing is
        kept crash-safe, and disk files go under ``run-<run id>``).
    partition_id : int
        The node's partition (names its crash-safe files).
    backend : str
        ``"context"`` or ``"disk"`` (``node-state``).
    folder : pathlib.Path, optional
        ``state-dir``; ``None``: nothing is kept crash-safe.
    """

    def __init__(
        self,
        context: Context,
        *,
        job: str = "",
        partition_id: int = 0,
        backend: str = "context",
        folder: Path | None = None,
    ) -> None:
        if backend not in ("context", "disk"):
            raise ValueError(f"backend must be 'context' or 'disk', got {backend!r}")
        self.context = context
        self.job = job
        self.partition_id = partition_id
        self.backend = backend
        self.folder = Path(folder).expanduser() if folder is not None else None
        root = self.folder or Path(tempfile.gettempdir()) / DEFAULT_FOLDER
        self.scratch = root / safe_name(job or f"run-{context.run_id}")[:80]

    @classmethod
    def of(cls, context: Context, *, job: str = "") -> NodeStore:
        """The store this node's settings select (``node-state``, ``state-dir``)."""
        settings = node_settings(context)
        return cls(
            context,
            job=job,
            partition_id=partition_of(context),
            backend=settings.node_state,
            folder=Path(settings.state_dir) if settings.state_dir else None,
        )

    # --- where each kind goes -----------------------------------------------------------
    def durable_path(self, kind: str) -> Path | None:
        """The crash-safe file of ``kind``, or ``None`` when it is not kept so (no
        ``state-dir``, no job, or a kind the server sends again)."""
        durable = DURABLE.get(kind)
        if durable is None or self.folder is None or not self.job:
            return None
        # Runs of unsafe characters become one "_" here (not safe_name's one per
        # character): the names nodes already hold files under.
        job = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.job)[:80]
        return self.folder / f"{durable.prefix}-{job}-p{self.partition_id}.npz"

    def scratch_path(self, kind: str) -> Path:
        """The file of ``kind`` under ``node-state = "disk"`` when it is not durable."""
        return self.scratch / f"n{self.context.node_id}-{safe_name(kind)}.npz"

    def path(self, kind: str) -> Path:
        """The one file that holds ``kind`` with ``node-state = "disk"``."""
        return self.durable_path(kind) or self.scratch_path(kind)

    # --- get, put, drop -----------------------------------------------------------------
    def get(
        self, kind: str, *, specs: Mapping[str, TensorSpec] | None = None
    ) -> dict[str, np.ndarray] | None:
        """The arrays kept under ``kind``, or ``None`` when the node holds none.

        ``specs`` (the model's tensors) is what a crash-safe state read back from
        ``state-dir`` must fit.
        """
        state = self.context.state
        if self.backend == "context":
            record = state.array_records.get(kind)
            if record is not None:
                return {name: array.numpy() for name, array in record.items()}
        else:
            token = state.config_records.get(kind + _TOKEN_SUFFIX)
            if token is not None:
                return self._read_token(kind, get_str(token, "token", ""))
        return self._restore(kind, specs)

    def put(self, kind: str, arrays: Mapping[str, np.ndarray], *, task: str = "") -> None:
        """Keep ``arrays`` under ``kind``, replacing what was there.

        The crash-safe copy is written first: if that write fails the task fails, and
        ``context.state`` (which Flower keeps when a ClientApp raises) still names the
        state from before, whose update was then never sent: consistent either way.
        ``task`` names the task in the crash-safe file's header.
        """
        durable = self.durable_path(kind)
        token = secrets.token_hex(8)
        if durable is not None:
            meta = {
                "format": FORMAT,
                "kind": kind,
                "job": self.job,
                "partition": self.partition_id,
                "step": DURABLE[kind].step(arrays),
                "task": task,
                "saved_at": time.time(),
                "token": token,
            }
            save_arrays(durable, arrays, meta)
        if self.backend == "context":
            self.context.state.array_records[kind] = ArrayRecord(
                {name: Array(np.asarray(value)) for name, value in arrays.items()}
            )
            return
        if durable is None:
            meta = {"format": FORMAT, "token": token, "kind": kind, "node": self.context.node_id}
            data = arrays_bytes(arrays, meta)
            self.scratch.mkdir(parents=True, exist_ok=True)
            # Written in place: no temporary file, no rename, no fsync (scratch state). A
            # write cut short leaves a file that fails to parse or names another token,
            # and the context is only told the new token once the file holds it.
            self.scratch_path(kind).write_bytes(data)
        self.context.state.config_records[kind + _TOKEN_SUFFIX] = ConfigRecord({"token": token})

    def drop(self, kind: str) -> None:
        """Forget what is kept under ``kind``, files included (nothing happens when there
        is none)."""
        self.context.state.array_records.pop(kind, None)
        self.context.state.config_records.pop(kind + _TOKEN_SUFFIX, None)
        self.scratch_path(kind).unlink(missing_ok=True)
        durable = self.durable_path(kind)
        if durable is not None:
            durable.unlink(missing_ok=True)

    # --- the codec's live twin ----------------------------------------------------------
    def take_live(self, codec: UpdateCodec) -> bool:
        """Give ``codec`` the live state this process filed for this node, if the saved
        codec state was made from it; return whether it did (see :class:`LiveStates`)."""
        return LIVE.take(self._live_key, self.context, codec)

    def keep_live(self, codec: UpdateCodec) -> None:
        """File ``codec``'s state as this node's live one (after its saved copy)."""
        LIVE.keep(self._live_key, self.context, codec)

    @property
    def _live_key(self) -> Hashable:
        return (self.context.run_id, self.context.node_id, self.partition_id, self.job)

    # --- helpers ------------------------------------------------------------------------
    def _read_token(self, kind: str, token: str) -> dict[str, np.ndarray] | None:
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

    def _restore(
        self, kind: str, specs: Mapping[str, TensorSpec] | None
    ) -> dict[str, np.ndarray] | None:
        """A crash-safe state from ``state-dir``, for a context that holds no record of
        it; ``None`` when there is none that is this node's and fits."""
        path = self.durable_path(kind)
        if path is None:
            return None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:  # unreadable: start fresh rather than fail the task
            log(WARNING, "[fedsync] ignoring persisted %s %s: %s", kind, path, err)
            return None
        try:
            arrays, meta = parse_arrays(raw, source=str(path))
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, this node reads {FORMAT}")
            if meta.get("job") != self.job or meta.get("partition") != self.partition_id:
                raise ValueError(
                    f"belongs to job {meta.get('job')!r} partition {meta.get('partition')!r}, "
                    f"not {self.job!r} partition {self.partition_id}"
                )
            DURABLE[kind].check(arrays, specs)
        except (PersistError, ValueError) as err:
            log(WARNING, "[fedsync] ignoring persisted %s %s: %s", kind, path, err)
            return None
        step = DURABLE[kind].step(arrays)
        self._journal(kind, path, meta, bytes_digest(raw), step)
        log(INFO, "[fedsync] restored %s of job %s (step %d) from %s", kind, self.job, step, path)
        return arrays

    def _journal(
        self, kind: str, path: Path, meta: Mapping[str, Any], digest: str, step: int
    ) -> None:
        assert self.folder is not None  # a durable path has one
        entry = {
            "time": time.time(),
            "pid": os.getpid(),
            "kind": kind,
            "job": self.job,
            "partition": self.partition_id,
            "file": str(path),
            "sha256": digest,
            "step": step,
            "saved_by_task": meta.get("task", ""),
        }
        try:
            with (self.folder / JOURNAL).open("a", encoding="utf-8") as journal:
                journal.write(json.dumps(entry) + "\n")
        except OSError as err:  # the audit trail must not cost the node its state
            log(WARNING, "[fedsync] cannot append to %s: %s", self.folder / JOURNAL, err)


# --- live codec states --------------------------------------------------------------------------
class LiveStates:
    """Live codec states by key (run, node, partition, job), at most ``limit``."""

    def __init__(self, limit: int = MAX_LIVE) -> None:
        self._limit = limit
        self._states: OrderedDict[Hashable, tuple[str, CodecState]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def take(self, key: Hashable, context: Context, codec: UpdateCodec) -> bool:
        """Give ``codec`` the live state filed under ``key`` if ``context.state``'s saved
        codec state was made from it; return whether it did. The entry is removed
        either way: :meth:`keep` files it again after the next successful save."""
        with self._lock:
            entry = self._states.pop(key, None)
        record = context.state.config_records.get(LIVE_TOKEN)
        if entry is None or record is None or get_str(record, "token", "") != entry[0]:
            return False
        codec.state.load(entry[1])
        return True

    def keep(self, key: Hashable, context: Context, codec: UpdateCodec) -> None:
        """File ``codec``'s state under ``key`` after its saved copy was written."""
        token = secrets.token_hex(16)
        context.state.config_records[LIVE_TOKEN] = ConfigRecord({"token": token})
        live = CodecState()
        live.load(codec.state)
        with self._lock:
            self._states[key] = (token, live)
            self._states.move_to_end(key)
            while len(self._states) > self._limit:
                self._states.popitem(last=False)


LIVE = LiveStates()
"""The process's live codec states."""
