"""Flower's internals stay in ``fedsync.compat.flower139``, and each of its uses still works.

The scan reads every shipped file (``fedsync/`` with the top-level ``server/``,
``clients/``, ``kernels/`` and ``simulations/`` it links to, ``benchmarks/``,
``examples/``) and names ``file:line`` for an import of a Flower module or name outside
:data:`fedsync.compat.flower139.PUBLIC_API`, and for a private name reached on a Flower
object (an attribute, a ``getattr`` family string, a ``__dict__`` key). Static: it follows
names bound by an import of Flower and names annotated with a Flower type, not values
passed through other objects. Tests are not scanned (they may patch Flower's internals).

After a Flower upgrade, the other tests here say which of compat's uses broke.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fedsync.compat import flower139

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("fedsync", "server", "clients", "kernels", "simulations", "benchmarks", "examples")
COMPAT = ROOT / "fedsync" / "compat" / "flower139.py"
REACHING = frozenset({"__dict__", "__kwdefaults__", "__defaults__", "__code__", "__globals__"})
"""Dunder names that reach an object's private state, counted as private here."""
GETATTR_FAMILY = frozenset({"getattr", "setattr", "hasattr", "delattr"})


# --- the scan -----------------------------------------------------------------------------------
def _private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name in REACHING or (name.startswith("_") and not dunder)


@cache
def _public_names(module: str) -> frozenset[str]:
    names = flower139.PUBLIC_API[module]
    if names is None:
        names = frozenset(importlib.import_module(module).__all__)
    return frozenset(n for n in names if not n.startswith("_") or n == "__version__")


def _flower(dotted: str) -> bool:
    return dotted == "flwr" or dotted.startswith("flwr.")


def _internal(path: list[str]) -> str:
    """Why the Flower name ``path`` (``["flwr", "app", "Message", ...]``) is not public."""
    end = next(e for e in range(len(path), 0, -1) if ".".join(path[:e]) in flower139.PUBLIC_API)
    module, rest = ".".join(path[:end]), path[end:]
    if rest and rest[0] not in _public_names(module):
        kind = "private name" if _private(rest[0]) else "internal"
        return f"{module}.{rest[0]} is {kind}"
    for name in rest[1:]:
        if _private(name):
            return f"private name {name} of {'.'.join(path[: path.index(name)])}"
    return ""


def _chain(node: ast.expr) -> tuple[str, list[str]] | None:
    """The name an expression starts from and the attributes taken from it, in order."""
    attributes: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):  # type(x) is x's class; f(...) is f's result
            is_type = isinstance(node.func, ast.Name) and node.func.id == "type"
            node = node.args[0] if is_type and node.args else node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id, attributes[::-1]
        else:
            return None


def scan(source: str, where: str) -> list[str]:
    """Every use of Flower's internals in ``source``, as ``where:line: what``."""
    tree = ast.parse(source)
    found: dict[tuple[int, str], None] = {}
    bound: dict[str, list[str]] = {}  # name -> the Flower path an import bound it to
    typed: set[str] = set()  # names annotated with a Flower type

    def report(node: ast.AST, why: str) -> None:
        if why:
            found[(getattr(node, "lineno", 0), why)] = None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _flower(alias.name):
                    path = alias.name.split(".")
                    report(node, _internal(path))
                    bound[alias.asname or "flwr"] = path if alias.asname else ["flwr"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _flower(node.module or ""):
            for alias in node.names:
                path = [*str(node.module).split("."), alias.name]
                if alias.name == "*":
                    report(node, f"from {node.module} import *")
                    continue
                report(node, _internal(path))
                bound[alias.asname or alias.name] = path
    for node in ast.walk(tree):
        annotated: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, ast.arg):
            annotated.append((node.arg, node.annotation))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotated.append((node.target.id, node.annotation))
        for name, annotation in annotated:
            if annotation is not None and any(
                isinstance(n, ast.Name) and n.id in bound for n in ast.walk(annotation)
            ):
                typed.add(name)

    def check(node: ast.AST, expr: ast.expr, tail: list[str]) -> None:
        chain = _chain(expr)
        if chain is None:
            return
        root, attributes = chain
        if root in bound:
            report(node, _internal([*bound[root], *attributes, *tail]))
        elif root in typed:
            private = [a for a in [*attributes, *tail] if _private(a)]
            if private:
                report(node, f"private name {private[0]} of {root}, a Flower object")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            check(node, node, [])
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            name = node.func.id if isinstance(node.func, ast.Name) else ""
            key = node.args[1]
            if name in GETATTR_FAMILY and isinstance(key, ast.Constant):
                check(node, node.args[0], [str(key.value)])
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            module = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(module, ast.Constant)
                and isinstance(module.value, str)
                and _flower(module.value)
            ):
                report(node, _internal(module.value.split(".")))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "__dict__":
                check(node, value, [str(node.slice.value)])
    return [f"{where}:{line}: {why}" for line, why in sorted(found)]


def shipped_files() -> Iterator[Path]:
    """Every shipped ``.py`` file once, ``fedsync/compat/flower139.py`` left out."""
    for top in SHIPPED:
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            paths = (Path(folder) / f for f in sorted(files) if f.endswith(".py"))
            yield from (path for path in paths if path != COMPAT)


def test_only_the_compat_module_reaches_flower_internals() -> None:
    found = [
        violation
        for path in shipped_files()
        for violation in scan(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, (
        "Flower's internal names outside fedsync/compat/flower139.py (add a typed "
        "accessor there, or keep to the public API its docstring defines):\n" + "\n".join(found)
    )


def test_the_scan_reads_each_shipped_file_once() -> None:
    files = [p.relative_to(ROOT).as_posix() for p in shipped_files()]
    assert len(files) == len(set(files))
    assert {
        "fedsync/serverapp/reply_pulls.py",
        "fedsync/clientapp/node_exec.py",
        "fedsync/deploy/fast_poll.py",
    } <= set(files)
    assert "fedsync/compat/flower139.py" not in files and "fedsync/compat/__init__.py" in files


@pytest.mark.parametrize(
    ("source", "line", "why"),
    [
        (
            "import flwr.supernode.start_client_internal as internal",
            1,
            "flwr.supernode is internal",
        ),
        ("import flwr\nflwr.supernode.cli.flower_supernode()", 2, "flwr.supernode is internal"),
        ("def f():\n    from flwr.superlink.grid.http_grid import HttpGrid", 2, "flwr.superlink"),
        ("from flwr.common import serde", 1, "flwr.common.serde is internal"),
        ("from flwr.common.constant import ErrorCode", 1, "flwr.common.constant is internal"),
        ("from flwr.clientapp.utils import get_load_client_app_fn", 1, "flwr.clientapp.utils"),
        ("from flwr.common.logger import configure", 1, "flwr.common.logger.configure"),
        ("from flwr.app import _private", 1, "flwr.app._private is private name"),
        ("from flwr.app import *", 1, "from flwr.app import *"),
        (
            "from flwr.serverapp import Grid\nGrid._runtime_client",
            2,
            "private name _runtime_client",
        ),
        ("from flwr.app import Message\nMessage(x)._meta", 2, "private name _meta"),
        (
            "from flwr.serverapp import Grid\n\ndef f(grid: Grid):\n"
            "    getattr(type(grid), '_runtime_client', None)",
            4,
            "private name _runtime_client of grid",
        ),
        (
            "from flwr.serverapp import Grid\n\ndef f(grid: Grid | None):\n"
            "    grid._runtime_client",
            4,
            "private name _runtime_client of grid",
        ),
        (
            "from flwr.serverapp import Grid\n\ndef f(grid: Grid):\n    getattr(grid, '_client')",
            4,
            "private name _client of grid",
        ),
        (
            "from flwr.app import Message\nm: Message = g()\n"
            "m.metadata.__dict__['_message_id'] = 1",
            3,
            "private name __dict__ of m",
        ),
        ("import importlib\nimportlib.import_module('flwr.proto.message_pb2')", 2, "flwr.proto"),
    ],
)
def test_the_scan_catches_each_kind_of_use(source: str, line: int, why: str) -> None:
    found = scan(source, "x.py")
    assert any(v.startswith(f"x.py:{line}: ") and why in v for v in found), found


def test_the_scan_passes_the_public_api() -> None:
    source = """
import flwr
from flwr.app import ArrayRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common import log as common_log
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result
from flwr.simulation import run_simulation

VERSION = flwr.__version__


def f(message: Message, grid: Grid) -> None:
    message.metadata.reply_to_message_id
    grid.pull_messages([])
    self._grid = grid
    getattr(message, "content")
"""
    assert scan(source, "x.py") == []


# --- each of compat's uses still finds its target ------------------------------------------------
def test_installed_flower_is_the_patched_series() -> None:
    import flwr

    assert flwr.__version__.startswith(flower139.FLOWER_SERIES), (
        f"Flower {flwr.__version__}: review every use in fedsync/compat/flower139.py "
        "(the tests below say which broke), then write the module for this version"
    )
    assert flower139.version_problem("x") == ""


def test_fast_poll_refuses_another_flower(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import flwr

    from fedsync.deploy import fast_poll

    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    assert fast_poll.main() == 2
    assert "fast_poll supports Flower 1.39 only, found 1.40.0" in capsys.readouterr().err


def test_object_pull_retries_are_shortened(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supercore.inflatable import inflatable_utils

    from fedsync.compat.flower139 import (
        LOCAL_PULL_RETRY_CAP_S,
        PULL_RETRY_CAP_S,
        shorten_object_pulls,
    )

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)

    def kwdefaults(function: Callable[..., Any]) -> dict[str, Any]:
        return function.__kwdefaults__ or {}

    for function in functions:  # Flower's own defaults (1 s, doubling to 10 s), restored after
        defaults = {
            **kwdefaults(function),
            "initial_backoff": 1,
            "backoff_cap": 10,
            "max_tries_per_object": 500,
            "max_time": 7200,
        }
        monkeypatch.setattr(function, "__kwdefaults__", defaults)
    assert shorten_object_pulls(0.01)
    for function in functions:
        assert kwdefaults(function)["initial_backoff"] == 0.01
        assert kwdefaults(function)["backoff_cap"] == PULL_RETRY_CAP_S
        # the 2 h limit still ends a pull, not 500 tries of at most 0.5 s
        assert kwdefaults(function)["max_tries_per_object"] * PULL_RETRY_CAP_S > 7200
    # a pull that finds its object unavailable twice still gets it, retrying
    misses = iter([True, True, False])

    def pull(object_id: str) -> bytes:
        if next(misses):
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["obj"], pull) == {"obj": b"content"}
    # a reader on the objects' own host (ServerApp, warm executor) retries at most 0.1 s apart
    assert shorten_object_pulls(0.05, cap=LOCAL_PULL_RETRY_CAP_S)
    for function in functions:
        assert kwdefaults(function)["backoff_cap"] == LOCAL_PULL_RETRY_CAP_S == 0.1
        assert kwdefaults(function)["max_tries_per_object"] * LOCAL_PULL_RETRY_CAP_S > 7200


def test_supernode_sleeps_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli import flower_supernode

    # Flower's SuperNode loop sleeps its fixed 3 s through the module's own `time`.
    assert internal.time is time
    assert "time.sleep(3)" in inspect.getsource(internal)
    assert not inspect.signature(flower_supernode).parameters  # run_flower_supernode sets argv
    monkeypatch.setattr(internal, "time", time)  # restored after
    flower139.cap_supernode_poll(0.01)
    assert internal.time is not time and internal.time.monotonic is time.monotonic
    started = time.monotonic()
    internal.time.sleep(3)
    assert time.monotonic() - started < 1.0


def test_reply_pulls_find_the_http_grid_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """``announced_replies`` and ``pull_reply`` against a fake Runtime API client: the
    reply comes back whole, confirmed, with its id; a stopped pull is Flower's error 3."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.run import Run, RunStatus
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.grid.http_grid import HttpGrid

    for name in ("_run_id", "_node_id", "_task_id"):  # Message() needs them
        monkeypatch.setattr(TaskIdentity, name, 1)
    content = RecordDict({"task": ConfigRecord({"a": 1})})
    task = Message(content, dst_node_id=5, message_type="train")
    task.metadata.__dict__["_message_id"] = task.object_id
    reply = Message(RecordDict({"reply": ConfigRecord({"b": 2})}), reply_to=task)
    reply.metadata.__dict__["_message_id"] = reply.object_id  # as the node sets it
    objects = get_all_nested_objects(reply)
    confirmed: list[str] = []

    class Client:
        def PullMessages(self, request: object) -> PullAppMessagesResponse:
            proto = message_to_proto(remove_content_from_message(reply))
            return PullAppMessagesResponse(
                messages_list=[proto], message_object_trees=[get_object_tree(reply)]
            )

        def PullObject(self, request: object) -> PullObjectResponse:
            content = objects[request.object_id].deflate()  # type: ignore[attr-defined]
            return PullObjectResponse(
                object_found=True, object_available=True, object_content=content
            )

        def ConfirmMessageReceived(self, request: object) -> None:
            confirmed.append(request.message_object_id)  # type: ignore[attr-defined]

    grid = HttpGrid("127.0.0.1:9", insecure=True, token="t")
    assert flower139.reply_pulls_import_problem() == ""
    assert flower139.is_http_grid(grid)
    assert flower139.http_grid_layout_problem(grid) == ""
    monkeypatch.setattr(HttpGrid, "_runtime_client", property(lambda self: Client()))
    status = RunStatus("running", "", "")
    grid.set_run(Run(7, "", "", "", {}, "", "", "", "", status, "", "", None, 0, 0, 0.0))

    (announced,) = flower139.announced_replies(grid, [task.object_id])
    assert announced.task_id == task.object_id and announced.reply_id == reply.object_id
    assert set(announced.object_ids) == set(objects)
    pulled = flower139.pull_reply(grid, announced, stopped=lambda: False)
    assert pulled.metadata.message_id == reply.object_id and confirmed == [reply.object_id]
    assert pulled.content["reply"]["b"] == 2
    with pytest.raises(flower139.ReplyUnavailable, match="no longer awaited") as stopped:
        flower139.pull_reply(grid, announced, stopped=lambda: True)
    assert stopped.value.code == flower139.ErrorCode.MESSAGE_UNAVAILABLE == 3


def test_warm_executor_finds_flowers_runtime_functions() -> None:
    """Every call ``fedsync.clientapp.node_exec`` makes, bound to Flower's signatures."""
    f = flower139
    assert f.warm_executor_problem() == ""
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
        (f.pull_task_input, ("client",), {}),
        (f.push_message, ("client", "reply", "context"), {}),
        (f.push_task_output, (), dict(client=0, context=0, sub_status="", details="")),
        (f.install_from_fab, (b"fab",), {"skip_prompt": True}),
        (f.get_load_client_app_fn, (), dict(default_app_ref="", app_path=None, multi_app=True)),
        (f.RuntimeVersionHttpInterceptor, (), {"component_name": "SuperExec"}),
        (f.RuntimeTokenHttpInterceptor, ("token",), {}),
        (f.HeartbeatSender, (lambda: True,), {}),
        (f.make_task_heartbeat_fn_http, ("client",), {}),
        (f.make_simple_http_retry_invoker, (), {}),
        (
            f.RuntimeHttpClient.from_server_address,
            (),
            dict(
                server_address="a:1",
                insecure=True,
                root_certificates=None,
                interceptors=[],
                retry_invoker=None,
            ),
        ),
    ]
    for function, args, kwargs in calls:
        inspect.signature(function).bind(*args, **kwargs)
    request = f.AcquireTaskRequest(
        supported_task_types=[f.TaskType.CLIENT_APP.value], agentapp_fab_hashes=[]
    )
    assert list(request.supported_task_types) == [f.TaskType.CLIENT_APP.value]
    assert f.SubStatus.FAILED and f.SubStatus.COMPLETED
    assert f.ErrorCode.CLIENT_APP_RAISED_EXCEPTION


def test_the_warm_executor_refuses_another_layout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsync.clientapp import node_exec

    monkeypatch.setattr(flower139, "_WARM_EXECUTOR_PROBLEM", "import failed: no flwr.cli")
    assert node_exec.main(["--runtime-api-address", "127.0.0.1:9", "--supervise"]) == 2
    assert "no flwr.cli" in capsys.readouterr().err


def test_run_config_is_parsed_as_flower_parses_it() -> None:
    import click

    assert flower139.parse_config_args(['a=1 b="x"', "c=true"]) == {"a": 1, "b": "x", "c": True}
    with pytest.raises(click.ClickException):
        flower139.parse_config_args(["a=["])


# --- 6. the simulation engine's deliveries ------------------------------------------------------
def _simulation_state(
    nodes: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any, dict[int, int]]:
    """Flower 1.39's simulation state as ``flwr.simulation.run_simulation`` builds it (an
    ``InMemoryLinkState`` with a run and ``nodes`` registered SuperNodes), its
    ``InMemoryGrid`` and the node id -> partition mapping."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.task_pb2 import Task
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = factory.state()
    run = Run.create_empty(run_id=7)
    run.primary_task_id = 11
    run.federation_id = NOOP_FEDERATION_ID
    for name, value in (("_task_id", 1), ("_run_id", 7), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)  # as run_simulation sets it; restored
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    mapping = vce_api._register_nodes(num_nodes=nodes, state_factory=factory)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return state, grid, mapping


def _push(grid: Any, destinations: list[int], ttl: float = 60.0) -> list[str]:
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    messages = [
        Message(RecordDict({"c": ConfigRecord({"i": i})}), node, MessageType.QUERY, ttl=ttl)
        for i, node in enumerate(destinations)
    ]
    return [str(m) for m in grid.push_messages(messages)]


def _install(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install section 6 in Flower's engine module (both names restored after the test);
    the module."""
    from flwr.server.superlink.fleet.vce import vce_api

    for name in ("add_messages_to_queue", "run_api"):
        monkeypatch.setattr(vce_api, name, getattr(vce_api, name))
    assert flower139.index_simulation_deliveries()
    return vce_api


def _delivered_by(loop: Callable[..., None], state: Any, mapping: Any, count: int) -> list[str]:
    """Run the engine's delivery ``loop`` on a thread until ``count`` messages came out."""
    import queue
    import threading

    delivered: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(state, delivered, mapping, stop))
    thread.start()
    try:
        return [delivered.get(timeout=10).metadata.message_id for _ in range(count)]
    finally:
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_simulation_deliveries_match_flowers_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass of ``deliver_pending`` hands out the messages Flower's per-node
    ``get_message_ins(node, limit=1)`` calls would, marks them delivered as Flower does,
    and drops expired ones; ``index_simulation_deliveries`` installs it where the engine's
    ``run_api`` looks it up, and the installed loop feeds a queue."""
    from flwr.server.superlink.fleet.vce import vce_api

    from fedsync.compat import SIMULATION_ENGINE, in_simulation_engine

    assert vce_api.__name__ == SIMULATION_ENGINE and in_simulation_engine()
    # Flower's run_api (under fedsync's wrapper, if an earlier import of
    # fedsync.clientapp installed it) starts its delivery thread with the module's
    # add_messages_to_queue
    flowers = getattr(vce_api.run_api, "fedsync_wraps", vce_api.run_api)
    assert "target=add_messages_to_queue" in inspect.getsource(flowers)

    def scenario() -> tuple[Any, dict[int, int], list[str]]:
        state, grid, mapping = _simulation_state(5, monkeypatch)
        nodes = list(mapping)
        # node 0: three messages; node 1: one; node 2: one expired; node 3: two; node 4: none
        ids = _push(grid, [nodes[0], nodes[1], nodes[0], nodes[3], nodes[0], nodes[3]])
        ids += _push(grid, [nodes[2]], ttl=0.001)
        time.sleep(0.01)
        return state, mapping, ids

    def described(messages: list[Any]) -> list[tuple[int, str]]:
        return sorted((m.metadata.dst_node_id, m.metadata.message_id) for m in messages)

    flower_state, mapping, flower_ids = scenario()
    ours_state, ours_mapping, ours_ids = scenario()
    for round_ in range(4):
        flowers = [m for n in mapping for m in flower_state.get_message_ins(n, limit=1)]
        ours = flower139.deliver_pending(ours_state, ours_mapping)
        # the same choice: per node its first undelivered message (ids differ by run)
        positions = {mid: i for i, mid in enumerate(flower_ids)}
        ours_positions = {mid: i for i, mid in enumerate(ours_ids)}
        assert sorted(positions[m.metadata.message_id] for m in flowers) == sorted(
            ours_positions[m.metadata.message_id] for m in ours
        ), round_
        assert all(m.metadata.delivered_at != "" for m in ours)
        assert [len(described(ours))] == [len({m.metadata.dst_node_id for m in ours})]
    # the expired message was deleted from the store, in either
    assert len(ours_state.message_ins_store) == len(flower_state.message_ins_store) == 6
    assert flower139.deliver_pending(ours_state, ours_mapping) == []

    # installed where run_api looks it up; its loop feeds the engine's queue
    loop = _install(monkeypatch).add_messages_to_queue
    assert loop is not flower139.deliver_pending and loop.__module__ == flower139.__name__
    state, grid, mapping = _simulation_state(3, monkeypatch)
    pushed = _push(grid, list(mapping) * 2)
    assert sorted(_delivered_by(loop, state, mapping, len(pushed))) == sorted(pushed)


def test_simulation_deliveries_not_installed_outside_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from fedsync.compat import SIMULATION_ENGINE, in_simulation_engine

    monkeypatch.delitem(sys.modules, SIMULATION_ENGINE)
    assert not in_simulation_engine()
    assert not flower139.index_simulation_deliveries()


def test_simulation_deliveries_fall_back_to_flowers_own(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass that raises does not stop deliveries (the thread dying would stall the
    run): Flower's per-node calls take over, with a warning."""
    loop = _install(monkeypatch).add_messages_to_queue

    def broken(state: Any, nodes: Any, **options: Any) -> list[Any]:
        raise KeyError("a layout this pass does not know")

    monkeypatch.setattr(flower139, "deliver_pending", broken)
    state, grid, mapping = _simulation_state(2, monkeypatch)
    pushed = _push(grid, list(mapping))
    assert sorted(_delivered_by(loop, state, mapping, len(pushed))) == sorted(pushed)
    assert "one-pass deliveries failed" in caplog.text
    assert "a layout this pass does not know" in caplog.text


def test_the_client_app_travels_to_each_actor_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's backend ships ``SharedClientApp`` in place of its ``app_fn``: pickled,
    it is a small reference to one copy in Ray's object store, and an actor fetches the
    app once and keeps it (a real Ray, one CPU)."""
    import pickle

    import ray
    from flwr.server.superlink.fleet.vce import vce_api

    # run_api's backend gets the shared app after build() (a stand-in backend and run_api)
    class Backend:
        app_fn: Any = None

        def build(self, fn: Callable[[], Any]) -> None:
            self.app_fn = fn

    built: list[Backend] = []

    def run_api(app_fn: Callable[[], Any], backend_fn: Callable[[], Backend]) -> None:
        backend = backend_fn()
        backend.build(app_fn)
        built.append(backend)

    monkeypatch.setattr(vce_api, "run_api", run_api)
    _install(monkeypatch)
    assert flower139.index_simulation_deliveries()  # once: not wrapped twice
    assert vce_api.run_api.fedsync_wraps is run_api  # type: ignore[attr-defined]
    app = {"weights": list(range(50_000))}  # stands for the ClientApp: big when pickled
    vce_api.run_api(lambda: app, Backend)
    shared = built[0].app_fn
    assert isinstance(shared, flower139.SharedClientApp) and shared() is app

    @ray.remote
    class Actor:
        def run(self, app_fn: Callable[[], Any]) -> tuple[int, int]:
            first, second = app_fn(), app_fn()
            return id(first), id(second)

    # ray.init sets PYTHONBREAKPOINT in this process: put back as it was after the test
    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)
    # a new local Ray ("local"), never a cluster another test or `ray start` left running
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert len(pickle.dumps(shared)) < 1_000 < len(pickle.dumps(app))
        actor = Actor.remote()  # type: ignore[attr-defined]
        calls = [ray.get(actor.run.remote(shared)) for _ in range(3)]
        # one app per actor, kept across messages (the closure was not shipped again)
        assert len({i for pair in calls for i in pair}) == 1
    finally:
        ray.shutdown()
