"""Server checkpoints: atomic files, the newest readable one, settings, and a resumed loop.

The loop-level tests run :func:`fedsync.serverapp.run.run_async` on the in-process fake
Grid of ``tests/unit/test_async_run.py`` (Flower's Message API, scrambled arrivals).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsync.aggregation.tally import RunTally
from fedsync.config import CheckpointSection, RunConfig, SettingsError
from fedsync.persist import JOB_KEY, atomic_write_bytes
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.checkpoint import (
    AsyncCheckpoint,
    CheckpointError,
    CheckpointStore,
    check_fits,
    find_resume,
    load_checkpoint,
    restore_tally,
    store_for,
    tally_state,
)
from fedsync.serverapp.run import AsyncResult, run_async
from tests.unit.test_async_run import (  # the fake Grid and clients, and their fixture
    NODES,
    DenseCodec,
    FakeClients,
    FakeGrid,
    initial_state,
    make_evaluate,
    task_identity,  # noqa: F401  (autouse: Flower's task identity for Message())
)


def checkpoint(version: int, **extra: Any) -> AsyncCheckpoint:
    state = {"w": torch.full((3, 2), float(version)), "n": torch.tensor(version)}
    return AsyncCheckpoint(version, state, {"kind": "sgd", "steps": version}, **extra)


# --- files ------------------------------------------------------------------------------------
def test_store_round_trip_keeps_the_newest_two(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    for version in (2, 4, 6):
        store.save(checkpoint(version, job_id="job-a", tally={"arrivals": version}))
    assert [p.name for p in store.paths()] == ["ckpt-v00000006.pt", "ckpt-v00000004.pt"]
    assert not [p for p in store.folder.iterdir() if p.name.endswith(".tmp")]
    found = store.latest()
    assert found is not None
    path, loaded = found
    assert path == store.path_for(6) and loaded.version == 6 and loaded.job_id == "job-a"
    assert torch.equal(loaded.global_state["w"], torch.full((3, 2), 6.0))
    assert loaded.tally == {"arrivals": 6} and loaded.optimizer_state["steps"] == 6


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(checkpoint(4))
    atomic_write_bytes(store.path_for(6), b"PK\x03\x04 not a torch file")
    found = store.latest()
    assert found is not None and found[1].version == 4
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(store.path_for(6))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "file.bin"
    atomic_write_bytes(target, b"old")

    def crash(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr("fedsync.persist.os.replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


def test_other_formats_and_models_are_refused(tmp_path: Path) -> None:
    data = checkpoint(1).to_dict()
    with pytest.raises(CheckpointError, match="format"):
        AsyncCheckpoint.from_dict({**data, "format": 99})
    with pytest.raises(CheckpointError, match="fields"):
        AsyncCheckpoint.from_dict({**data, "surprise": 1})
    other = {"w": torch.zeros(3, 3), "n": torch.tensor(0)}
    with pytest.raises(CheckpointError, match=r"another model.*\['w'\]"):
        check_fits(checkpoint(1), other)
    check_fits(checkpoint(1), {"w": torch.zeros(3, 2), "n": torch.tensor(0)})


def test_tally_counters_round_trip() -> None:
    tally = RunTally(target_accuracy=0.5, bytes_up=10, bytes_down=20, tasks=5, arrivals=4)
    tally.aggregated = 3
    tally.staleness.update({0: 2, 3: 1})
    tally.drops["rejected"] += 1
    tally.errors["node-unavailable"] += 2
    tally.record_evaluation(3, {"accuracy": 0.6, "loss": 1.0}, sim_time=1.0, wall_time=2.0)
    fresh = RunTally(target_accuracy=0.5)
    restore_tally(fresh, tally_state(tally))
    assert (fresh.bytes_up, fresh.bytes_down, fresh.tasks, fresh.arrivals) == (10, 20, 5, 4)
    assert fresh.staleness == Counter({0: 2, 3: 1}) and fresh.errors["node-unavailable"] == 2
    assert fresh.target is not None and fresh.target.version == 3
    assert fresh.evaluations == []  # those travel on the checkpoint itself


# --- settings ---------------------------------------------------------------------------------
def test_settings_from_run_config_and_where_to_resume(tmp_path: Path) -> None:
    assert CheckpointSection.from_run_config({}) == CheckpointSection()
    settings = CheckpointSection.from_run_config(
        {"checkpoint-every": 3, "checkpoint-dir": "", "resume": "true", "resume-from": ""}
    )
    assert settings.checkpoint_every == 3 and settings.resume
    store = store_for(settings, tmp_path / "results" / "job")
    assert store.folder == (tmp_path / "results" / "job" / "checkpoints").resolve()
    assert find_resume(settings, store, run_name="job") is None  # nothing yet: fresh start
    store.save(checkpoint(3))
    found = find_resume(settings, store, run_name="job")
    assert found is not None and found[1].version == 3
    with pytest.raises(SettingsError, match="run-name"):
        find_resume(settings, store, run_name="")
    assert find_resume(CheckpointSection(resume=False), store, run_name="job") is None
    from_folder = CheckpointSection(resume_from=str(store.folder))
    assert find_resume(from_folder, store, run_name="")[1].version == 3  # type: ignore[index]
    with pytest.raises(CheckpointError):
        find_resume(CheckpointSection(resume_from=str(tmp_path / "nope.pt")), store, run_name="")
    with pytest.raises(SettingsError, match="checkpoint-every"):
        CheckpointSection.from_run_config({"checkpoint-every": -1})
    with pytest.raises(SettingsError, match="resume"):
        CheckpointSection.from_run_config({"resume": 1})


# --- the loop ---------------------------------------------------------------------------------
CONFIG: dict[str, Any] = {
    "strategy": "fedbuff",
    "server_optimizer": "momentum",
    "server_learning_rate": 0.5,
    "concurrency": 4,
    "buffer_size": 2,
    "eval_every": 2,
    "uplink_codec": "x",
    "downlink_codec": "x",
    "plots": False,
}


def run(
    tmp_path: Path,
    name: str,
    clients: FakeClients,
    *,
    store: CheckpointStore | None,
    resume: AsyncCheckpoint | None = None,
    **overrides: Any,
) -> AsyncResult:
    recorder = RunRecorder(tmp_path, name)
    try:
        return run_async(
            FakeGrid(NODES[:5], clients),  # type: ignore[arg-type]
            RunConfig.of(
                **{**CONFIG, "checkpoint_every": 2 if store is not None else 0, **overrides}
            ),
            recorder=recorder,
            global_state=initial_state(),
            evaluate_fn=make_evaluate(NODES[:5]),
            codec_factory=DenseCodec,
            resume=resume,
            checkpoint_fn=store.save if store is not None else None,
            sleep=lambda _: None,
        )
    finally:
        recorder.close()


def test_checkpoints_every_n_aggregations_and_at_the_end(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=10)
    result = run(tmp_path, "first", FakeClients(), store=store, max_aggregations=5)
    versions = sorted(load_checkpoint(p).version for p in store.paths())
    assert versions == [2, 4, 5]  # every 2, and the end state
    events = list(read_events(tmp_path / "first" / "events.jsonl", "checkpoint"))
    assert [e["version"] for e in events] == [2, 4, 5]
    last = load_checkpoint(store.path_for(5))
    assert last.job_id == result.summary["job"]
    assert last.tasks_dispatched == result.summary["tasks"]
    assert [e["version"] for e in last.evaluations] == [0, 2, 4, 5]
    assert last.meta["strategy"] == "fedbuff"


def test_a_resumed_run_continues_the_job(tmp_path: Path) -> None:
    """Kill after v4 (keep only its checkpoint), resume: version, counters, tasks and
    the job go on; the restored model evaluates exactly as it did before the kill."""
    store = CheckpointStore(tmp_path / "ckpt", keep=10)
    first = run(tmp_path, "first", FakeClients(), store=store, max_aggregations=5)
    saved = load_checkpoint(store.path_for(4))
    clients = FakeClients()
    second = run(tmp_path, "second", clients, store=None, resume=saved, max_aggregations=8)
    assert second.version == 8
    summary = second.summary
    assert summary["resumed_from"]["version"] == 4 and summary["job"] == first.summary["job"]
    assert {c[JOB_KEY] for c in clients.configs} == {saved.job_id}
    at_four = next(e for e in saved.evaluations if e["version"] == 4)
    assert second.evaluations[0]["version"] == 4
    assert second.evaluations[0]["accuracy"] == pytest.approx(at_four["accuracy"], abs=0)
    # Counters continue from the checkpoint, not from zero.
    assert summary["tasks"] > saved.tally["tasks"] and summary["arrivals"] > saved.tally["arrivals"]
    events = list(read_events(tmp_path / "second" / "events.jsonl"))
    first_dispatch = next(e for e in events if e["event"] == "dispatch")
    assert int(first_dispatch["task"].removeprefix("task-")) == saved.tasks_dispatched + 1
    aggregations = [e["version"] for e in events if e["event"] == "aggregation"]
    assert aggregations == [5, 6, 7, 8]
    # Every arrival of the whole job is accounted for (the buffer was empty at v4).
    stale = summary["drops"].get("stale", 0)
    rejected = summary["drops"].get("rejected", 0)
    assert summary["arrivals"] == summary["aggregated_updates"] + stale + rejected


def test_a_failing_checkpoint_does_not_end_the_run(tmp_path: Path) -> None:
    def broken(_: AsyncCheckpoint) -> None:
        raise OSError("no space left on device")

    recorder = RunRecorder(tmp_path, "broken")
    result = run_async(
        FakeGrid(NODES[:3], FakeClients()),  # type: ignore[arg-type]
        RunConfig.of(**{**CONFIG, "max_aggregations": 4, "checkpoint_every": 2}),
        recorder=recorder,
        global_state=initial_state(),
        evaluate_fn=make_evaluate(NODES[:3]),
        codec_factory=DenseCodec,
        checkpoint_fn=broken,
        sleep=lambda _: None,
    )
    recorder.close()
    assert result.version == 4
    failed = list(read_events(tmp_path / "broken" / "events.jsonl", "checkpoint-failed"))
    # v4 failed twice: once after its aggregation, once more as the end state.
    assert [e["version"] for e in failed] == [2, 4, 4]
