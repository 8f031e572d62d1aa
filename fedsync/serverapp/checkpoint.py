"""Checkpoints of the asynchronous server, so a killed ServerApp's job can be resumed.

The SuperLink runs the ServerApp; when either dies the run is gone, and Flower 1.39
cannot restart a run. What survives is on disk: every ``checkpoint-every`` aggregations
the loop hands an :class:`AsyncCheckpoint` (global model, server-optimizer state,
version, task counter, traffic and event counters, evaluations, the job id) to a
:class:`CheckpointStore`, which writes ``ckpt-v<version>.pt`` atomically (temp file,
fsync, ``os.replace``) and keeps the newest few. A new run with ``resume=true`` (or
``resume-from=PATH``) starts from the newest readable one and loses at most the
aggregations since it (plus the updates cached for the next one, and the tasks then in
flight).

Run-config keys (:class:`fedsync.config.CheckpointSection`):

* ``checkpoint-every`` -- save every N aggregations, and once at the end (0: never);
* ``checkpoint-dir`` -- the checkpoints' folder (empty: ``<results folder>/checkpoints``);
* ``resume`` -- continue from the newest checkpoint there (none yet: a fresh start);
* ``resume-from`` -- continue from this checkpoint file, or the newest in this folder.

The files are ``torch.save`` dicts of tensors and plain values, read back with
``weights_only=True``: loading a checkpoint cannot run code. Their tensors are CPU
tensors whatever ``server-device`` held them, and the engine moves them onto its own: a
job saved on a GPU server resumes on a CPU one, and the other way round.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Final

import torch
from flwr.common.logger import log

from fedsync.aggregation.tally import RunTally, TargetReached
from fedsync.config import CheckpointSection, SettingsError
from fedsync.persist import atomic_write_bytes

__all__ = [
    "FORMAT",
    "AsyncCheckpoint",
    "CheckpointError",
    "CheckpointStore",
    "check_fits",
    "find_resume",
    "load_checkpoint",
    "restore_tally",
    "store_for",
    "tally_state",
]

FORMAT: Final = 1
"""Layout version written into every checkpoint file."""

_NAME = re.compile(r"^ckpt-v(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found, read, or does not fit this run."""


@dataclass
class AsyncCheckpoint:
    """What a restarted run needs to continue: model, optimizer state, counters.

    Attributes
    ----------
    version : int
        Global model version (aggregations so far); the compression schedule's
        position is a function of it.
    global_state : dict of str to torch.Tensor
        The global model (every tensor of the state dict).
    optimizer_state : dict
        :meth:`~fedsync.aggregation.ServerOptimizer.state_dict`.
    sim_time : float
        Clock time reached; reported times of a resumed run continue from it.
    bytes_up, bytes_down : int
        Traffic so far.
    tasks_dispatched : int
        Tasks handed out so far: task ids and seeds continue instead of repeating,
        and ``max-tasks`` counts the whole job.
    tally : dict
        The run's counters (:func:`tally_state`); empty in older checkpoints.
    evaluations : list of dict
        Every central evaluation so far.
    job_id : str
        The training job: nodes key their persisted codec state by it.
    wall_time : float
        Real seconds the job has run, over all its runs.
    meta : dict
        For the record: strategy, the run config, cached updates at save time.
    pruning : dict
        A pruned run's cut (:meth:`fedsync.aggregation.pruning.PrunedModel.checkpoint_state`:
        the mask frame and the frames sent); empty before the cut and in older checkpoints.
    progress : dict
        The steps the run has planned (:meth:`fedsync.engine.AggregationEngine.progress_state`:
        the schedule clock's and the dynamic budgets' counts); empty in older checkpoints.
    """

    # --- the model and the optimizer ---
    version: int
    global_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    # --- where the job is ---
    sim_time: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    tasks_dispatched: int = 0
    tally: dict[str, Any] = field(default_factory=dict)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    job_id: str = ""
    wall_time: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    pruning: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain values and tensors only (what ``torch.load(weights_only=True)`` reads).

        Shallow: the tensors are this checkpoint's own (no second copy of the model).
        """
        return {"format": FORMAT, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AsyncCheckpoint:
        """Rebuild from :meth:`to_dict` output.

        Raises
        ------
        CheckpointError
            For another format version or missing fields.
        """
        if data.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint format {data.get('format')!r}, expected {FORMAT}")
        try:
            return cls(**{key: value for key, value in data.items() if key != "format"})
        except TypeError as err:
            raise CheckpointError(f"checkpoint fields do not match: {err}") from err


# --- the tally ------------------------------------------------------------------------------
def tally_state(tally: RunTally) -> dict[str, Any]:
    """The counters of a :class:`RunTally` as plain values.

    Left out: ``evaluations`` (kept on the checkpoint itself) and ``gave_up`` (node
    ids, which a restarted deployment does not reuse).
    """
    return {
        "target_accuracy": tally.target_accuracy,
        "bytes_up": tally.bytes_up,
        "bytes_down": tally.bytes_down,
        **(
            {"bytes_down_broadcast": tally.bytes_down_broadcast}
            if tally.bytes_down_broadcast is not None
            else {}
        ),
        "tasks": tally.tasks,
        "arrivals": tally.arrivals,
        "aggregated": tally.aggregated,
        "staleness": {str(k): v for k, v in tally.staleness.items()},
        "drops": dict(tally.drops),
        "errors": dict(tally.errors),
        "target": (
            {k: v for k, v in asdict(tally.target).items() if v is not None}
            if tally.target is not None
            else None
        ),
    }


def restore_tally(tally: RunTally, state: Mapping[str, Any]) -> None:
    """Put :func:`tally_state` counters back into ``tally`` (in place)."""
    tally.bytes_up = int(state.get("bytes_up", tally.bytes_up))
    tally.bytes_down = int(state.get("bytes_down", tally.bytes_down))
    if tally.bytes_down_broadcast is not None:  # a shared downlink's
        # Not saved (a checkpoint of another downlink kind): the bytes as sent bound it.
        tally.bytes_down_broadcast = int(state.get("bytes_down_broadcast", tally.bytes_down))
    tally.tasks = int(state.get("tasks", 0))
    tally.arrivals = int(state.get("arrivals", 0))
    tally.aggregated = int(state.get("aggregated", 0))
    tally.staleness = Counter({int(k): int(v) for k, v in state.get("staleness", {}).items()})
    tally.drops = Counter({str(k): int(v) for k, v in state.get("drops", {}).items()})
    tally.errors = Counter({str(k): int(v) for k, v in state.get("errors", {}).items()})
    target = state.get("target")
    # A target reached before the restart stays reached (and when) for the whole job.
    if target is not None and tally.target_accuracy == state.get("target_accuracy"):
        tally.target = TargetReached(**target)


# --- files ----------------------------------------------------------------------------------
class CheckpointStore:
    """``ckpt-v<version>.pt`` files in one folder, written atomically, newest few kept.

    Parameters
    ----------
    folder : pathlib.Path
        Where the files go (created on first save).
    keep : int
        How many of the newest files to keep (>= 1). More than one, so that even an
        unreadable newest file (a disk fault; an atomic write cannot leave half a file)
        leaves one to resume from.
    """

    def __init__(self, folder: Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder = Path(folder)
        self.keep = keep

    def path_for(self, version: int) -> Path:
        """The file of the checkpoint at ``version``."""
        return self.folder / f"ckpt-v{version:08d}.pt"

    def save(self, checkpoint: AsyncCheckpoint) -> Path:
        """Write ``checkpoint`` and drop files beyond the newest :attr:`keep`."""
        buffer = io.BytesIO()
        torch.save(checkpoint.to_dict(), buffer)
        path = atomic_write_bytes(self.path_for(checkpoint.version), buffer.getvalue())
        for old in self.paths()[self.keep :]:
            old.unlink(missing_ok=True)
        return path

    def paths(self) -> list[Path]:
        """Checkpoint files, newest version first."""
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _NAME.match(p.name))]
        return [path for _, path in sorted(found, reverse=True)]

    def latest(self) -> tuple[Path, AsyncCheckpoint] | None:
        """The newest checkpoint that reads back, or ``None`` if there is none."""
        for path in self.paths():
            try:
                return path, load_checkpoint(path)
            except CheckpointError as err:
                log(WARNING, "[fedsync] skipping checkpoint %s: %s", path, err)
        return None


def check_fits(checkpoint: AsyncCheckpoint, state: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` unless the checkpoint's model is ``state``'s model.

    A run resumed with another ``model`` or ``dataset`` must fail at once, by name,
    rather than at the first aggregation.
    """
    theirs = {name: tuple(t.shape) for name, t in checkpoint.global_state.items()}
    mine = {name: tuple(t.shape) for name, t in state.items()}
    if theirs != mine:
        differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        raise CheckpointError(
            f"the checkpoint (v{checkpoint.version}) is of another model: tensors differ at "
            f"{differ[:5]} (resume with the run config it was made with)"
        )


def load_checkpoint(path: Path) -> AsyncCheckpoint:
    """Read one checkpoint file.

    Raises
    ------
    CheckpointError
        If the file is missing, unreadable or not a fedsync checkpoint.
    """
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise CheckpointError(f"no checkpoint at {path}") from err
    except Exception as err:  # truncated zip, foreign pickle, ...: not a checkpoint
        raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, not a checkpoint dict")
    return AsyncCheckpoint.from_dict(data)


# --- run config ---------------------------------------------------------------------------
def store_for(section: CheckpointSection, results_folder: Path) -> CheckpointStore:
    """The store in ``checkpoint-dir``, or in the run's results folder."""
    folder = section.checkpoint_dir
    path = Path(folder).expanduser() if folder else results_folder / "checkpoints"
    return CheckpointStore(path.resolve())


def find_resume(
    section: CheckpointSection, store: CheckpointStore, *, run_name: str
) -> tuple[Path, AsyncCheckpoint] | None:
    """The checkpoint this run continues from, or ``None`` for a fresh start.

    Raises
    ------
    CheckpointError
        ``resume-from`` names nothing readable.
    SettingsError
        ``resume=true`` with neither ``run-name`` nor ``checkpoint-dir``: the results
        folder would be a new timestamped one, with nothing to resume.
    """
    if section.resume_from:
        path = Path(section.resume_from).expanduser().resolve()
        if path.is_dir():
            found = CheckpointStore(path).latest()
            if found is None:
                raise CheckpointError(f"resume-from: no readable checkpoint in {path}")
            return found
        return path, load_checkpoint(path)
    if not section.resume:
        return None
    if not section.checkpoint_dir and not run_name:
        raise SettingsError(
            "resume=true needs 'run-name' (the results folder to resume) or "
            "'checkpoint-dir'; or name a file with 'resume-from'"
        )
    found = store.latest()
    if found is None:
        # A supervisor restarting a job that crashed before its first checkpoint.
        log(WARNING, "[fedsync] resume=true but no checkpoint in %s: fresh start", store.folder)
    else:
        log(INFO, "[fedsync] resuming from %s (v%d)", found[0], found[1].version)
    return found
