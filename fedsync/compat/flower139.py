"""Every use of Flower 1.39's internal names in fedsync, each with why and its test.

This is the only module of fedsync that imports Flower's internal modules or reaches a
private (leading-underscore) name of Flower's; ``tests/unit/test_flower_compat.py``
scans every shipped file for it (``test_only_the_compat_module_reaches_flower_internals``)
and checks that each use below still finds its target in the installed Flower. On a
Flower upgrade, run that file first: the tests named below say which use broke.

Flower's public API, for this rule
----------------------------------
Code outside this module imports from Flower only the names of :data:`PUBLIC_API`, a
module and the names it may take from it:

``flwr``
    ``import flwr`` for ``flwr.__version__`` (reports, the version guards).
``flwr.app``
    Messages, contexts, records and ``Error``: what ClientApps and ServerApps are
    written against (its ``__all__``).
``flwr.serverapp``, ``flwr.serverapp.strategy``
    ``ServerApp``, ``Grid`` and Flower's strategies (``FedAvg``, ``Result``).
``flwr.clientapp``
    ``ClientApp`` and ``mod`` (not ``flwr.clientapp.utils``).
``flwr.simulation``
    ``run_simulation`` and the rest of its ``__all__``; unused today, public all the same.
``flwr.common``
    The names of its ``__all__`` (Flower's top-level API, ``log`` among them); not its
    submodules ``constant``, ``serde``, ``config`` ..., which it does not export.
``flwr.common.logger``
    ``log`` alone: the very function ``flwr.common`` exports, imported from here by
    fedsync's server and clients (the module's other names configure Flower's own
    processes).

A name is public when it is in that module's ``__all__`` in Flower 1.39 (or the list
given here) and has no leading underscore; so is an attribute without a leading
underscore of a public name. Everything else is internal: ``flwr.supernode``,
``flwr.superlink``, ``flwr.supercore``, ``flwr.proto``, ``flwr.cli``,
``flwr.clientapp.utils``, ``flwr.app.error``, ``flwr.common.constant``,
``flwr.common.serde``, ``flwr.common.config``, and any ``_name`` on a Flower object.

What this module does with them
-------------------------------
Each use says the Flower version it was written against, why it exists, what happens on
another Flower, and the test that fails when an upgrade breaks it.

1. :func:`shorten_object_pulls`: object-pull retries from a poll interval, not 1 s.
2. :func:`cap_supernode_poll` and :func:`run_flower_supernode`: the SuperNode's 3 s
   poll, shortened (``python -m fedsync.deploy.fast_poll``).
3. :func:`announced_replies` and :func:`pull_reply`: the HTTP Grid's replies, pulled one
   by one on a caller's threads (``fedsync.serverapp.reply_pulls``).
4. The warm executor's names (``fedsync.clientapp.node_exec``): Flower's Runtime API
   client and the steps of ``flwr-clientapp``, re-exported.
5. :func:`parse_config_args`: Flower's ``--run-config`` parser.
6. :func:`index_simulation_deliveries`: the simulation engine hands out pending
   messages in one pass over its message store, not one pass per node, and ships the
   ClientApp to each Ray actor once, not with every message.
"""

from __future__ import annotations

import math
import os
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from flwr.app import Message

from fedsync.compat import SIMULATION_ENGINE

if TYPE_CHECKING:
    from flwr.serverapp import Grid

# 3. The HTTP Grid's reply pulls: without these, concurrent_pulls keeps Grid.pull_messages.
try:
    from flwr.common.constant import ErrorCode
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.superlink.grid.http_grid import HttpGrid
except ImportError as _err:
    _REPLY_PULLS_PROBLEM = f"import failed: {_err}"
else:
    _REPLY_PULLS_PROBLEM = ""

# 4. The warm executor: without these, python -m fedsync.clientapp.node_exec refuses to start.
try:
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supernode.runtime.run_clientapp import (
        pull_task_input,
        push_message,
        push_task_output,
    )
except ImportError as _err:
    _WARM_EXECUTOR_PROBLEM = f"import failed: {_err}"
else:
    _WARM_EXECUTOR_PROBLEM = ""

__all__ = [
    "FLOWER_SERIES",
    "LOCAL_PULL_RETRY_CAP_S",
    "PUBLIC_API",
    "PULL_RETRY_CAP_S",
    "AcquireTaskRequest",
    "AnnouncedReply",
    "ErrorCode",
    "HeartbeatSender",
    "ReplyUnavailable",
    "RuntimeHttpClient",
    "RuntimeTokenHttpInterceptor",
    "RuntimeVersionHttpInterceptor",
    "SubStatus",
    "TaskType",
    "announced_replies",
    "cap_supernode_poll",
    "get_load_client_app_fn",
    "http_grid_layout_problem",
    "index_simulation_deliveries",
    "install_from_fab",
    "is_http_grid",
    "make_simple_http_retry_invoker",
    "make_task_heartbeat_fn_http",
    "parse_config_args",
    "pull_reply",
    "pull_task_input",
    "push_message",
    "push_task_output",
    "reply_pulls_import_problem",
    "run_flower_supernode",
    "runtime_client",
    "shorten_object_pulls",
    "version_problem",
    "warm_executor_problem",
]

FLOWER_SERIES: Final = "1.39."
"""The Flower releases this module was written against (``flwr.__version__`` prefix);
``test_installed_flower_is_the_patched_series`` fails on any other."""

PUBLIC_API: Final[Mapping[str, frozenset[str] | None]] = {
    "flwr": frozenset({"__version__"}),
    "flwr.app": None,
    "flwr.serverapp": None,
    "flwr.serverapp.strategy": None,
    "flwr.clientapp": None,
    "flwr.simulation": None,
    "flwr.common": None,
    "flwr.common.logger": frozenset({"log"}),
}
"""Flower's modules that code outside this module may import, each with the names it may
take from it (``None``: the module's ``__all__``); see the module doc for why each."""


def version_problem(what: str) -> str:
    """Why ``what`` cannot run on the installed Flower; ``""`` on Flower 1.39."""
    import flwr

    if flwr.__version__.startswith(FLOWER_SERIES):
        return ""
    return f"{what} supports Flower {FLOWER_SERIES[:-1]} only, found {flwr.__version__}"


# --- 1. Object-pull retries ------------------------------------------------------------------
#
# Flower 1.39. A message travels as its metadata and then its payload objects, and the
# metadata is visible first: the SuperNode stores a pulled task before its objects have
# arrived, the SuperLink hands out a message before its sender has pushed all of the
# objects, and it announces a reply while the node is still uploading it. A reader that
# asks too early gets "object unavailable", and Flower retries after 1 s, doubling up to
# 10 s (the keyword defaults of inflatable_utils.pull_objects and
# pull_and_inflate_object_from_tree; no setting changes them). On a slow link that
# overshoots the end of an upload by up to several seconds, and on loopback the first
# 1 s was most of a warm task's overhead. Another layout: shorten_object_pulls changes
# nothing and returns False (the warm executor logs it). Test:
# test_object_pull_retries_are_shortened.

PULL_RETRY_CAP_S: Final = 0.5
"""The longest wait between two pulls of an unavailable object (Flower's: 10 s), for a
reader across a link (``fedsync-node --supernode-poll``): a SuperNode waiting out a 10 s
upload makes about 20 small requests."""

LOCAL_PULL_RETRY_CAP_S: Final = 0.1
"""The same for a reader on the objects' own host, where a retry is one loopback request
(the warm executor from its SuperNode, the ServerApp's reply channel from the SuperLink
that started it): the time between the end of an upload and the pull that finds it
complete is at most this, and a 10 s upload costs about 100 requests."""


def shorten_object_pulls(initial_backoff: float, cap: float = PULL_RETRY_CAP_S) -> bool:
    """Retry an unavailable object after ``initial_backoff`` seconds, doubling up to ``cap``.

    Sets the keyword defaults of Flower 1.39's ``pull_objects`` and
    ``pull_and_inflate_object_from_tree`` for every caller in this process, and raises
    their tries per object so that Flower's time limit, not the count, still ends a pull
    that never succeeds. Returns whether it could (``False``: another Flower layout;
    nothing changed).
    """
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    defaults = [getattr(function, "__kwdefaults__", None) or {} for function in functions]
    keys = ("initial_backoff", "backoff_cap", "max_tries_per_object", "max_time")
    if not all(all(key in d for key in keys) for d in defaults):
        return False
    cap = max(cap, initial_backoff)
    for d in defaults:
        d["initial_backoff"] = initial_backoff
        d["backoff_cap"] = cap
        # Shorter waits mean more tries in the same time: keep Flower's time limit (2 h)
        # the one that ends a pull, not its 500 tries (250 s at a 0.5 s cap, less than a
        # 100 MB upload over a 1 Mbit/s link takes).
        if d["max_time"] is not None:
            d["max_tries_per_object"] = max(
                d["max_tries_per_object"], math.ceil(d["max_time"] / cap) + 1
            )
    return True


# --- 2. The SuperNode's poll -----------------------------------------------------------------
#
# Flower 1.39. The SuperNode sleeps a hard-coded 3 s between requests for work and 0.5 s
# between checks for a finished reply (time.sleep in flwr.supernode.start_client_internal);
# no flag or environment variable changes either. cap_supernode_poll replaces the `time`
# module *seen by* that module with one whose sleep is capped (everything else is the
# real time), and run_flower_supernode runs the unchanged flower-supernode entry point in
# this process; fedsync-node runs its SuperNode so by default (0.1 s). Another version:
# fedsync.deploy.fast_poll refuses to start (version_problem), and fedsync-node without
# --supernode-poll says so once and starts the stock SuperNode (its 3 s poll: about 3 s
# more per task). Tests: test_supernode_sleeps_are_capped,
# test_the_short_poll_is_the_default_on_the_flower_that_takes_it.


def cap_supernode_poll(poll: float) -> None:
    """Cap every ``time.sleep`` of Flower 1.39's SuperNode loop at ``poll`` seconds."""
    import flwr.supernode.start_client_internal as internal

    internal.time = _capped_time(poll)


def run_flower_supernode(args: Sequence[str]) -> None:
    """Run ``flower-supernode`` in this process with the arguments ``args``."""
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *args]
    flower_supernode()


def _capped_time(poll: float) -> types.ModuleType:
    """A stand-in for ``time`` whose ``sleep`` is capped at ``poll`` seconds."""
    module = types.ModuleType("time")
    module.__dict__.update(time.__dict__)

    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, poll))

    module.sleep = sleep  # type: ignore[attr-defined]
    return module


# --- 3. The HTTP Grid's reply pulls ----------------------------------------------------------
#
# Flower 1.39. HttpGrid.pull_messages asks the SuperLink once for the replies that are in
# (PullMessages), then, one reply after another, pulls the reply's objects, confirms it and
# inflates it: a reply whose upload takes 10 s holds back every reply behind it.
# fedsync.serverapp.reply_pulls splits the two steps (announced_replies on the caller's
# thread, pull_reply on a pool) with the grid's own Runtime API client, the private
# HttpGrid._runtime_client (its HTTP client is safe to share between threads). Another
# layout (reply_pulls_import_problem, http_grid_layout_problem): the channel keeps the
# Grid's own pull_messages and logs why once. Tests:
# test_reply_pulls_find_the_http_grid_layout; tests/unit/test_reply_pulls.py.


@dataclass(frozen=True)
class AnnouncedReply:
    """A reply the SuperLink handed out (``PullMessages``); its objects are not pulled yet.

    Attributes
    ----------
    task_id : str
        The id of the task message it answers.
    reply_id : str
        Its own message id (the id of its head object).
    object_ids : tuple of str
        Every object of its tree.
    """

    task_id: str
    reply_id: str
    object_ids: tuple[str, ...]


class ReplyUnavailable(Exception):
    """A reply's objects could not be pulled, as Flower's own pull reports it.

    Attributes
    ----------
    code : int
        Flower's error code (``MESSAGE_UNAVAILABLE``).
    reason : str
        Flower's wording, and the failed object's.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def reply_pulls_import_problem() -> str:
    """Why this Flower lacks the modules reply pulls need; ``""`` on Flower 1.39."""
    return _REPLY_PULLS_PROBLEM


def is_http_grid(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's ``HttpGrid`` (a deployment's ServerApp)."""
    return not _REPLY_PULLS_PROBLEM and isinstance(grid, HttpGrid)


def http_grid_layout_problem(grid: Grid) -> str:
    """Why ``grid``, an ``HttpGrid``, is not laid out as in Flower 1.39; ``""`` if it is."""
    if not hasattr(ErrorCode, "MESSAGE_UNAVAILABLE"):
        return "no ErrorCode.MESSAGE_UNAVAILABLE"
    for name in ("pull_objects", "inflate_object_from_contents", "ObjectPullError"):
        if not hasattr(inflatable_utils, name):
            return f"no inflatable_utils.{name}"
    if not isinstance(getattr(type(grid), "_runtime_client", None), property):
        return "HttpGrid has no _runtime_client"
    if not hasattr(grid, "node"):
        return "HttpGrid has no node"
    return ""


def runtime_client(grid: Grid) -> RuntimeHttpClient:
    """The Runtime API client an ``HttpGrid`` uses itself (connecting on first use)."""
    return cast("HttpGrid", grid)._runtime_client


def announced_replies(grid: Grid, message_ids: list[str]) -> list[AnnouncedReply]:
    """Ask the SuperLink (one ``PullMessages``) for the replies to ``message_ids`` that are in.

    The SuperLink hands each reply out once; its objects stay in its object store until
    :func:`pull_reply` confirms it.

    Raises
    ------
    httpx.HTTPStatusError
        As the request does (Flower's own pull logs a 413 and goes on).
    """
    response = runtime_client(grid).PullMessages(PullAppMessagesRequest(message_ids=message_ids))
    return [
        AnnouncedReply(
            proto.metadata.reply_to_message_id,
            proto.metadata.message_id,
            tuple(t.object_id for t in iterate_object_tree(tree)),
        )
        for proto, tree in zip(response.messages_list, response.message_object_trees, strict=True)
    ]


def pull_reply(grid: Grid, reply: AnnouncedReply, *, stopped: Callable[[], bool]) -> Message:
    """Pull a reply's objects, confirm it to the SuperLink and inflate it.

    What ``HttpGrid.pull_messages`` does for each reply. An unavailable object is tried
    again (:func:`shorten_object_pulls` sets how soon) until Flower's time limit, or
    until ``stopped()`` says nobody waits for the reply any more.

    Raises
    ------
    ReplyUnavailable
        When an object never arrived, or ``stopped()``.
    TypeError
        When the reply does not inflate to a message.
    """
    http_grid = cast("HttpGrid", grid)
    client, node, run_id = runtime_client(grid), http_grid.node, http_grid.run.run_id
    fetch = make_pull_object_fn_protobuf(
        pull_object_protobuf=client.PullObject, node=node, run_id=run_id
    )

    def fetch_unless_stopped(object_id: str) -> bytes:
        if stopped():
            raise inflatable_utils.ObjectPullError(object_id, "no longer awaited")
        return fetch(object_id)

    try:
        contents = inflatable_utils.pull_objects(
            list(reply.object_ids), pull_object_fn=fetch_unless_stopped
        )
    except inflatable_utils.ObjectPullError as err:
        reason = (
            "Reply message objects are unavailable. The sender may not have completed "
            f"the upload before the object-push session expired. {err}"
        )
        raise ReplyUnavailable(ErrorCode.MESSAGE_UNAVAILABLE, reason) from err
    client.ConfirmMessageReceived(
        ConfirmMessageReceivedRequest(node=node, run_id=run_id, message_object_id=reply.reply_id)
    )
    message = inflatable_utils.inflate_object_from_contents(reply.reply_id, contents)
    if not isinstance(message, Message):
        raise TypeError(f"reply {reply.reply_id} inflated to {type(message).__name__}")
    message.metadata.__dict__["_message_id"] = reply.reply_id  # as Flower's own pull sets it
    return message


# --- 4. The warm executor --------------------------------------------------------------------
#
# Flower 1.39. With --isolation process a SuperNode waits for an executor to connect to
# its Runtime API; fedsync.clientapp.node_exec is that executor and runs the steps of
# flwr-clientapp (pull_task_input, install the FAB, load and run the ClientApp,
# push_message, push_task_output) in one long-lived process. Flower ships those steps
# only in its internal modules: the names imported in the second try block above are
# re-exported as they are. Another layout: node_exec prints warm_executor_problem() and
# exits 2. Tests: test_warm_executor_finds_flowers_runtime_functions;
# tests/integration/test_warm_deployment.py runs it.


def warm_executor_problem() -> str:
    """Why this Flower lacks what the warm executor needs; ``""`` on Flower 1.39."""
    return _WARM_EXECUTOR_PROBLEM


# --- 5. The run-config parser ----------------------------------------------------------------
#
# Flower 1.39. fedsync's commands take --run-config in Flower's syntax (space-separated
# key=value TOML literals, or a TOML file) and must read it as `flwr run` will:
# flwr.common.config.parse_config_args is that parser, and flwr.common does not export
# it. Another layout: ImportError at the call. Test:
# test_run_config_is_parsed_as_flower_parses_it.


def parse_config_args(items: Sequence[str]) -> dict[str, Any]:
    """Flower's ``--run-config`` strings (or TOML file paths) as one flat dict.

    Raises
    ------
    click.ClickException
        On a malformed string, as ``flwr run`` reports it.
    """
    from flwr.common import config

    return dict(config.parse_config_args(list(items)))


# --- 6. The simulation engine's deliveries ---------------------------------------------------
#
# Flower 1.39. In a simulation, a thread of the flwr-simulation process
# (vce_api.add_messages_to_queue) hands pending messages to the ClientApp actors: every
# 0.1 s it calls InMemoryLinkState.get_message_ins(node_id, limit=1) for every simulated
# node, and each call walks the whole message store, checking each message's TTL and
# federation under the state's lock. A pass costs nodes x stored messages checks: with
# 1,000 nodes and 32 tasks in flight about 32,000 per pass, all on the GIL the ServerApp
# needs; a start-up probe of 10,000 nodes stores 10,000 messages, 10^8 checks per pass,
# and no node answered within a minute. deliver_pending makes the same choice in one pass
# over the store: each message checked once as Flower checks it (expired ones deleted;
# those already handed out only every DELIVERED_CHECK_EVERY passes), and per node the
# first undelivered message addressed to it, marked delivered as Flower marks it. Only
# the order in which the pass's messages enter the queue changes: by when they were
# stored, not by node. index_simulation_deliveries installs it in
# vce_api, where run_api looks the function up when it starts the thread; it acts only in
# a process that has imported vce_api (the simulation engine's own), and only where the
# state is Flower's InMemoryLinkState with the attributes it reads; otherwise nothing
# changes. Test: test_simulation_deliveries_match_flowers_choice.

SIMULATION_DELIVERY_PASS_S: Final = 0.1
"""Seconds between two delivery passes: Flower's (``f_stop.wait(0.1)``)."""

DELIVERED_CHECK_EVERY: Final = 50
"""Every this many passes (5 s) the pass also checks the messages already handed out,
as Flower's checks each pass: an expired one whose reply nobody pulls is deleted. The
other passes skip them (with 10,000 probes out, checking them was 15 % of the engine's
time); the ServerApp's pull checks the ones it asks for anyway."""


def deliver_pending(
    state: Any, nodes: Mapping[int, Any], *, check_delivered: bool = True
) -> list[Message]:
    """Per node of ``nodes``, its first undelivered message in ``state``; marked delivered.

    ``state`` is Flower 1.39's ``InMemoryLinkState``: what ``get_message_ins(node,
    limit=1)`` for each node would return, found in one pass (module section 6). Each
    message is checked (and deleted when expired) as Flower checks it; with
    ``check_delivered=False`` only those not yet handed out.
    """
    from flwr.supercore.date import now

    taken: set[int] = set()
    found: list[Message] = []
    store = state.message_ins_store
    with state.lock:
        for message_id in list(store):
            message = store.get(message_id)
            if message is None or (not check_delivered and message.metadata.delivered_at):
                continue
            state._check_stored_messages({message_id})
            message = store.get(message_id)
            if message is None or message.metadata.delivered_at != "":
                continue
            node = message.metadata.dst_node_id
            if node in taken or node not in nodes:
                continue
            taken.add(node)
            found.append(message)
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
    return found


def _indexed_add_messages_to_queue(
    state: Any, queue: Any, nodes_mapping: Mapping[int, Any], f_stop: Any
) -> None:
    """``vce_api.add_messages_to_queue`` with one pass over the store per round.

    Where the pass cannot run (another state, or it raised: the thread dying would stall
    the simulation), Flower's own per-node calls take over, with a warning.
    """
    from logging import WARNING

    from flwr.common.logger import log

    one_pass = _has_in_memory_layout(state)
    passes = 0
    while not f_stop.is_set():
        messages: list[Message] = []
        if one_pass:
            try:
                check = passes % DELIVERED_CHECK_EVERY == 0
                messages = deliver_pending(state, nodes_mapping, check_delivered=check)
                passes += 1
            except Exception as err:  # the engine's own loop takes over
                log(WARNING, "[fedsync] one-pass deliveries failed, Flower's own used: %r", err)
                one_pass = False
        if not one_pass:
            messages = [m for n in nodes_mapping for m in state.get_message_ins(n, limit=1)]
        for message in messages:
            queue.put(message)
        f_stop.wait(SIMULATION_DELIVERY_PASS_S)


def _has_in_memory_layout(state: Any) -> bool:
    return all(
        hasattr(state, name) for name in ("message_ins_store", "lock", "_check_stored_messages")
    )


# The engine's RayBackend submits every message as actor.run.remote(app_fn, message,
# cid, context), app_fn being a closure start_vce defines around the loaded ClientApp: Ray
# pickles that closure by value on every call (about 2 ms of the simulation process's
# GIL each; a quarter of its time while 10,000 probes went out). SharedClientApp stands
# in for it: the first time it is pickled it puts the closure into Ray's object store
# once and pickles as a reference to it; each actor fetches it on its first message and
# keeps the ClientApp it returns (as start_vce itself keeps the loaded app, and a
# SuperNode's warm process would). If the object store refuses, it pickles the closure
# as before. Installed by wrapping vce_api.run_api (looked up by start_vce after it has
# loaded the ClientApp) so that the backend it builds gets it. Test:
# test_the_client_app_travels_to_each_actor_once.


class SharedClientApp:
    """Flower's ``app_fn`` of a simulation, pickled as one object-store reference."""

    def __init__(self, app_fn: Callable[[], Any]) -> None:
        self.app_fn = app_fn
        self._ref: Any = None

    def __call__(self) -> Any:
        return self.app_fn()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._ref is None:
            try:
                import ray

                self._ref = ray.put(self.app_fn)
            except Exception:  # no Ray or no object store: ship the closure itself
                return (_return, (self.app_fn,))
        return (_FetchedClientApp, (self._ref,))


def _return(value: Any) -> Any:
    return value


class _FetchedClientApp:
    """A ClientApp loader on a Ray actor: the app fetched once per actor and kept."""

    _apps: ClassVar[dict[str, Any]] = {}  # object ref -> ClientApp (this process's run)

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def __call__(self) -> Any:
        key = self.ref.hex()
        app = self._apps.get(key)
        if app is None:
            import ray

            app = ray.get(self.ref)()
            self._apps.clear()  # a new run's app replaces the last
            self._apps[key] = app
        return app


def _sharing_run_api(run_api: Callable[..., Any]) -> Callable[..., Any]:
    """``vce_api.run_api`` whose backend ships the ClientApp as :class:`SharedClientApp`."""

    def run_api_sharing_the_app(
        app_fn: Callable[[], Any], backend_fn: Callable[[], Any], *args: Any, **kwargs: Any
    ) -> Any:
        def backend() -> Any:
            made = backend_fn()
            build = made.build

            def build_sharing(fn: Callable[[], Any]) -> None:
                build(fn)
                if getattr(made, "app_fn", None) is fn:
                    made.app_fn = SharedClientApp(fn)

            made.build = build_sharing
            return made

        return run_api(app_fn, backend, *args, **kwargs)

    run_api_sharing_the_app.fedsync_wraps = run_api  # type: ignore[attr-defined]
    return run_api_sharing_the_app


ENGINE_PATCH_VARIABLE: Final = "FEDSYNC_SIMULATION_ENGINE_PATCH"
"""Set to ``0`` to keep Flower's own simulation engine functions (section 6)."""


def index_simulation_deliveries() -> bool:
    """Install :func:`deliver_pending`'s pass and :class:`SharedClientApp` in Flower's
    simulation engine, if this process runs it (``vce_api`` imported) and
    ``FEDSYNC_SIMULATION_ENGINE_PATCH`` is not ``0``; returns whether it did (module
    section 6). It says so once in the log, and how to turn it off."""
    from logging import INFO

    from flwr.common.logger import log

    vce_api = sys.modules.get(SIMULATION_ENGINE)
    if vce_api is None or not callable(getattr(vce_api, "add_messages_to_queue", None)):
        return False
    patch = os.environ.get(ENGINE_PATCH_VARIABLE, "1").strip() != "0"
    if not getattr(vce_api, "fedsync_announced", False):
        vce_api.fedsync_announced = True  # type: ignore[attr-defined]
        said = (
            "messages delivered in one pass per round, one ClientApp object per worker "
            "(fedsync.compat.flower139, section 6); %s=0 keeps Flower's own"
            if patch
            else "%s=0: as Flower ships it (each round scans its message store once per "
            "node; one ClientApp load per message)"
        )
        log(INFO, "[fedsync] Flower's simulation engine: " + said, ENGINE_PATCH_VARIABLE)
    if not patch:
        return False
    vce_api.add_messages_to_queue = _indexed_add_messages_to_queue  # type: ignore[attr-defined]
    run_api = getattr(vce_api, "run_api", None)
    if callable(run_api) and not hasattr(run_api, "fedsync_wraps"):
        vce_api.run_api = _sharing_run_api(run_api)  # type: ignore[attr-defined]
    return True
