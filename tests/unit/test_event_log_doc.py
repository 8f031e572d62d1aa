"""docs/events.md stays true to what the code writes into ``events.jsonl``.

Two readings of the code, each against the page's tables (a section ``### `kind``` per
kind, its fields the backticked first cells of the section's table, the fields of every
line in ``## Every line``):

* the source: every ``<...>.events.write("kind", ...)`` and ``self._event("kind", ...)``
  call under ``fedsync/``, ``server/`` and ``clients/``, read with :mod:`ast`. The kinds
  must be the page's kinds, no more and no fewer, and every field a call names (its
  keywords, and the keys of a ``**{...}`` it spreads) must be in its kind's table;
* real runs of the asynchronous loop on the fake Grid of ``test_async_run`` (dense
  codecs, six devices, well under a second each), set up to write most kinds and the
  fields only some runs have (what ``**entry`` and ``**cut`` spread, the shared
  downlink's and a collective's): every field of every line must be in its kind's
  table, and each run must write what it is there for.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict

import fedsync.serverapp.loop as async_run
from fedsync import protocol
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig
from fedsync.protocol import TrainTask
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.checkpoint import AsyncCheckpoint
from fedsync.serverapp.run import run_async
from fedsync.updates import TensorSpec
from fedsync.wire.mask import decode_masks
from tests.unit.test_async_run import (
    SHAPES,
    FakeGrid,
    initial_state,
    make_evaluate,
    task_identity,  # noqa: F401  (autouse: Flower's task identity for Message())
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "events.md"
SOURCES = ("fedsync", "server", "clients")
"""Where the code that writes the event log lives (``fedsync/server`` and
``fedsync/clients`` are links to the last two; each file is read once)."""
HELPER = "_event"
"""The loop's per-device writer: ``self._event(kind, node, time, **fields)`` writes
``events.write(kind, ...)`` with fields of its own."""

SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}
NODES = list(range(101, 107))
NEWCOMER = 199


# --- the page ----------------------------------------------------------------------------------
@functools.cache
def documented() -> tuple[set[str], dict[str, set[str]]]:
    """The fields of every line, and each kind's fields, as the page's tables name them."""
    common: set[str] = set()
    kinds: dict[str, set[str]] = {}
    section: str | None = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            kind = re.fullmatch(r"### `([a-z_-]+)`", line)
            section = kind.group(1) if kind else ("" if line == "## Every line" else None)
            if kind:
                assert section not in kinds, f"docs/events.md: two sections for {section!r}"
                kinds[section] = set()
            continue
        field = re.match(r"\| `([a-z_]+)` \|", line)
        if field and section is not None:
            (kinds[section] if section else common).add(field.group(1))
    return common, kinds


def listed() -> list[str]:
    """The kinds the page's table of kinds lists, in its order."""
    text = DOC.read_text(encoding="utf-8")
    return re.findall(r"^\| \[`([a-z_-]+)`\]\(#[a-z_-]+\) \|", text, flags=re.MULTILINE)


# --- the source ---------------------------------------------------------------------------------
def spread_keys(value: ast.expr) -> set[str]:
    """The keys a ``**value`` surely or possibly adds, where the source spells them."""
    if isinstance(value, ast.Dict):
        return {
            k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    if isinstance(value, ast.IfExp):
        return spread_keys(value.body) | spread_keys(value.orelse)
    return set()  # a name or a call (``**entry``, ``**cut``): the runs below check those


class EventCalls(ast.NodeVisitor):
    """The calls that write events in one module: kind -> fields they name."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.function = ""
        self.written: list[tuple[str, str, set[str]]] = []
        """``(kind, "write" or HELPER, fields)`` for each call with a literal kind."""
        self.helper_fields: set[str] = set()
        """Fields the helper adds to each of its callers' events."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        writes = func.attr == "write" and (
            isinstance(func.value, ast.Attribute) and func.value.attr == "events"
        )
        helper = func.attr == HELPER and isinstance(func.value, ast.Name)
        if not (writes or helper):
            return
        fields = {k.arg for k in node.keywords if k.arg is not None}
        for spread in (k.value for k in node.keywords if k.arg is None):
            fields |= spread_keys(spread)
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            self.written.append((first.value, "write" if writes else HELPER, fields))
            return
        # Only the helper may pass a kind through: its callers name theirs.
        assert writes and self.function == HELPER, (
            f"{self.where}:{node.lineno}: an event whose kind the test cannot read"
        )
        self.helper_fields |= fields


@functools.cache
def written_in_code() -> dict[str, set[str]]:
    """Every kind the source writes, with every field its calls name."""
    files = sorted({p.resolve() for folder in SOURCES for p in (ROOT / folder).rglob("*.py")})
    calls: list[tuple[str, str, set[str]]] = []
    helper_fields: set[str] = set()
    for path in files:
        visitor = EventCalls(str(path.relative_to(ROOT)))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        calls += visitor.written
        helper_fields |= visitor.helper_fields
    assert helper_fields >= {"node", "device", "sim_time"}, helper_fields
    kinds: dict[str, set[str]] = {}
    for kind, via, fields in calls:
        kinds.setdefault(kind, set()).update(fields | (helper_fields if via == HELPER else set()))
    return kinds


def test_the_page_documents_every_kind_the_code_writes_and_no_other() -> None:
    _, kinds = documented()
    code = written_in_code()
    assert len(code) >= 15, sorted(code)  # the reading found the calls
    assert sorted(code) == sorted(kinds), (
        f"kinds written but not in docs/events.md: {sorted(set(code) - set(kinds))}; "
        f"documented but never written: {sorted(set(kinds) - set(code))}"
    )
    table = listed()
    assert sorted(table) == sorted(kinds) and len(table) == len(set(table))


def test_every_field_the_code_names_is_in_its_kinds_table() -> None:
    common, kinds = documented()
    assert common == {"event", "wall_time"}
    missing = {
        kind: sorted(fields - kinds[kind] - common)
        for kind, fields in written_in_code().items()
        if fields - kinds[kind] - common
    }
    assert not missing, f"fields written but not in docs/events.md: {missing}"


# --- real runs ----------------------------------------------------------------------------------
class Devices:
    """A ClientApp stand-in: a small seeded update encoded with the task's codec (masked
    with the masks its tasks carried, after a cut). Per node: ``error`` answers every
    task with an error, ``garbage`` sends a payload that does not decode, ``leaves``
    leaves the Grid at its first task (an offline node's error) and comes back 12 tasks
    later with a node the run has never seen."""

    def __init__(self, behaviour: Mapping[int, str] | None = None) -> None:
        self.behaviour = dict(behaviour or {})
        self.grid: FakeGrid | None = None
        self.masks: dict[int, dict[str, torch.Tensor]] = {}
        self.tasks = 0
        self.away: list[int] = []
        self.back_at = 0

    def __call__(self, message: Message) -> Message:
        if message.metadata.message_type == MessageType.QUERY:
            return Message(Error(code=2, reason="no query handler"), reply_to=message)
        node = message.metadata.dst_node_id
        self.tasks += 1
        if self.away and self.tasks == self.back_at:
            assert self.grid is not None
            self.grid.node_ids += [*self.away, NEWCOMER]
            self.away = []
        mode = self.behaviour.get(node, "ok")
        if mode == "error":
            return Message(Error(code=2, reason="ClientApp raised"), reply_to=message)
        if mode == "leaves" and not self.back_at:
            assert self.grid is not None
            self.grid.node_ids.remove(node)
            self.away.append(node)
            self.back_at = self.tasks + 12
            return Message(Error(code=5, reason="node offline"), reply_to=message)
        task = TrainTask.from_record(message.content)
        if task.mask:
            self.masks[node] = decode_masks(task.mask, SPECS).masks
        generator = torch.Generator().manual_seed(task.task_seed)
        delta = {
            name: 0.01 * torch.randn(shape, generator=generator) for name, shape in SHAPES.items()
        }
        codec = UpdateCodec(
            task.uplink_codec, seed=task.task_seed, specs=SPECS, masks=self.masks.get(node)
        )
        body = b"\x00garbage\xff" * 7 if mode == "garbage" else codec.encode(delta)
        metrics = MetricRecord(
            {
                protocol.NUM_EXAMPLES: 10,
                protocol.NUM_STEPS: 2,
                protocol.TRAIN_LOSS: 1.0,
                protocol.COMPUTE_SECONDS: 0.1,
            }
        )
        uplink = ArrayRecord({protocol.PAYLOAD: Array(np.frombuffer(body, np.uint8).copy())})
        content = RecordDict({protocol.UPLINK: uplink, protocol.METRICS: metrics})
        return Message(content, reply_to=message)


def first_save_fails() -> Callable[[AsyncCheckpoint], None]:
    """A checkpoint store whose first save raises, as a full disk would."""
    saved: list[int] = []

    def save(checkpoint: AsyncCheckpoint) -> None:
        saved.append(checkpoint.version)
        if len(saved) == 1:
            raise OSError("no space left on device")

    return save


FLAKY = (  # devices that drop tasks, and devices that go offline and drop them
    'name = "flaky"\n'
    "[[group]]\ncount = 3\ndropout = 0.3\nseconds-per-sample = 0.01\n"
    "[[group]]\ncount = 3\nonline-seconds = 2\noffline-seconds = 2\n"
    'offline-behavior = "drop"\nseconds-per-sample = 0.01\n'
)

RUNS: dict[str, tuple[dict[str, Any], dict[int, str], set[str]]] = {
    # Failures of every kind on the virtual clock, a cut at version 2, checkpoints.
    "faults-pruned": (
        {
            "fleet": FLAKY,
            "max_staleness": 0,
            "prune_at_version": 2,
            "prune_sparsity": 0.5,
            "checkpoint_every": 2,
        },
        {102: "error", 103: "garbage"},
        {
            "async_start",
            "prune",
            "dispatch.downlink_change",
            "arrival",
            "aggregation",
            "evaluation",
            "checkpoint",
            "checkpoint-failed",
            "error",
            "give-up",
            "drop.rejection",
            "drop.max_staleness",
            "async_end",
        },
    ),
    # The shared downlink's dispatch fields and its broadcast figure.
    "shared": (
        {
            "downlink_kind": "shared",
            "downlink_seeded_start": True,
        },
        {},
        {
            "dispatch.downlink_detail",
            "dispatch.downlink_changes",
            "dispatch.bytes_down_broadcast",
            "evaluation.cumulative_bytes_down_broadcast",
        },
    ),
    # Bytes counted as a collective moves them.
    "collective": (
        {
            "strategy": "diloco",
            "collective": "allgather",
            "downlink_kind": "full",
            "downlink_codec": "none+fp32",
        },
        {},
        {"arrival.bytes_wire"},
    ),
    # The wall clock: a node that leaves and comes back, and one that joins.
    "wall": (
        {"clock": "wall", "max_aggregations": 14},
        {103: "leaves"},
        {"node-joined", "node-returned", "give-up"},
    ),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_writes_only_documented_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    overrides, behaviour, wanted = RUNS[name]
    monkeypatch.setattr(async_run, "NODE_REFRESH_S", 0.0)  # look for new nodes at every lull
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 4,
        "buffer_size": 2,
        "max_aggregations": 6,
        "eval_every": 2,
        "seed": 5,
        "max_retries": 1,
        # Dense codecs: nothing to compile for index coding (a sparse one costs a second).
        "uplink_codec": "none+fp16",
        "downlink_codec": "none+fp16",
        "downlink_delta_codec": "none+fp16",
        "plots": False,
        **overrides,
    }
    if "fleet" in overrides:  # a fleet file's text: written where the run can read it
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(overrides["fleet"], encoding="utf-8")
        settings["fleet"] = str(fleet)
    devices = Devices(behaviour)
    grid = FakeGrid(NODES, devices, seed=1, max_delay=8)  # lulls: the wall clock's look-ups
    devices.grid = grid
    recorder = RunRecorder(tmp_path, name)
    try:
        run_async(
            grid,  # type: ignore[arg-type]
            RunConfig.of(**settings),
            recorder=recorder,
            global_state=initial_state(),
            evaluate_fn=make_evaluate(NODES),
            checkpoint_fn=first_save_fails() if settings.get("checkpoint_every") else None,
            sleep=lambda _: None,
        )
    finally:
        recorder.close()
    events = list(read_events(recorder.events_path))
    common, kinds = documented()
    seen: set[str] = set()
    for event in events:
        kind = event["event"]
        assert list(event)[:2] == ["event", "wall_time"], event
        assert kind in kinds, f"{kind!r} is not in docs/events.md"
        extra = set(event) - common - kinds[kind]
        assert not extra, f"{kind}: fields {sorted(extra)} are not in docs/events.md"
        seen |= {kind, *(f"{kind}.{field}" for field in event)}
    assert wanted <= seen, f"the run wrote no {sorted(wanted - seen)}"
    assert {kind for kind in seen if "." not in kind} <= set(written_in_code())


def test_a_metric_named_like_a_line_field_takes_nothing_from_the_line(tmp_path: Path) -> None:
    """A user's evaluation metric named ``kind``, ``event`` or ``wall_time`` neither
    stops the run nor replaces the line's own fields."""
    from fedsync.reports import EventLog, read_events

    log = EventLog(tmp_path / "events.jsonl")
    log.write("evaluation", kind="mine", event="theirs", wall_time=-1.0, accuracy=0.5)
    log.close()
    (line,) = read_events(tmp_path / "events.jsonl")
    assert line["event"] == "evaluation" and line["wall_time"] >= 0.0
    assert (line["kind"], line["event_"], line["wall_time_"]) == ("mine", "theirs", -1.0)
