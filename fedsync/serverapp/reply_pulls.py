"""Pull the replies of Flower's HTTP Grid concurrently, each as soon as its objects are in.

Flower 1.39's ``HttpGrid.pull_messages`` asks the SuperLink once for the replies that are
in (``PullMessages``), then, one reply after another, pulls the reply's objects
(retrying while its node is still uploading them), confirms it and inflates it: a
reply whose upload takes 10 s holds back every reply behind it, and the call blocks for
the whole upload.

What the SuperLink does makes a split safe: ``PullMessages`` hands each reply out once
(it marks the reply delivered and deletes the task and the reply from its state; asking
again for the same id is answered with a "message unavailable" error), while the reply's
objects stay in its object store until ``ConfirmMessageReceived`` deletes them. So
:class:`ReplyPulls` asks ``PullMessages`` on the caller's thread, for the awaited ids
whose reply it does not already hold, and hands each reply it gets to a small thread
pool that pulls the objects, confirms and inflates; :meth:`ReplyPulls.pull` returns the
replies whose pulls have finished and never waits for one that has not.

The two steps use the grid's own Runtime API client through
:mod:`fedsync.compat.flower139` (``announced_replies``, ``pull_reply``), and
:func:`concurrent_pulls` checks Flower's layout first: any other Grid, or another Flower
layout, keeps the Grid's own ``pull_messages``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import Final

import httpx
from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync.compat import flower139

__all__ = ["DEFAULT_WORKERS", "PulledReply", "ReplyPulls", "SerialPulls", "concurrent_pulls"]

DEFAULT_WORKERS: Final = 8
"""Replies whose objects are pulled at the same time; more wait for a free worker. Each
worker mostly waits on the network (a slow node's upload), so a few cost little."""

_layout_logged = False


@dataclass(frozen=True)
class PulledReply:
    """One reply, pulled: the message, or why it could not be.

    Attributes
    ----------
    message_id : str
        The id of the task message this reply answers.
    message : flwr.app.Message or None
        The inflated reply (it may carry Flower's error); ``None`` if the pull failed.
    code : int
        When ``message`` is ``None``: Flower's error code for the failure (``3``,
        message unavailable, as Flower's own pull reports objects that never
        arrived), or ``0`` for an unexpected error.
    reason : str
        When ``message`` is ``None``: what went wrong.
    """

    message_id: str
    message: Message | None
    code: int = 0
    reason: str = ""


class SerialPulls:
    """A Grid's own ``pull_messages``, one reply after another, behind the interface of
    :class:`ReplyPulls` (the simulation's in-memory Grid, or an unknown Flower layout)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def pull(self, message_ids: Iterable[str]) -> list[PulledReply]:
        """The replies that are in, pulled by the Grid."""
        return [
            PulledReply(reply.metadata.reply_to_message_id, reply)
            for reply in self._grid.pull_messages(list(message_ids))
        ]

    def forget(self, message_ids: Iterable[str]) -> None:
        """Nothing is in flight between two :meth:`pull` calls."""

    def close(self) -> None:
        """Nothing to end."""


class ReplyPulls:
    """Replies of one Flower ``HttpGrid``, pulled on a thread pool (see the module doc).

    Build it with :func:`concurrent_pulls`, which checks Flower's layout first.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        A Flower 1.39 ``HttpGrid`` with its run set.
    workers : int
        Replies pulled at the same time.
    """

    def __init__(self, grid: Grid, *, workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._grid = grid
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedsync-pull")
        self._pulling: dict[str, Future[PulledReply]] = {}
        """Task message id -> the pull of its reply, until :meth:`pull` returns it."""
        self._closed = threading.Event()
        self._forgotten: set[str] = set()
        """Task message ids whose pull :meth:`forget` stopped."""

    @property
    def pulling(self) -> frozenset[str]:
        """Task message ids whose reply is in hand and not yet returned by :meth:`pull`."""
        return frozenset(self._pulling)

    def pull(self, message_ids: Iterable[str]) -> list[PulledReply]:
        """Start pulling the replies that are in; return those whose pull finished.

        Asks the SuperLink (one ``PullMessages``) for the ids in ``message_ids`` whose
        reply is not already being pulled, and never waits for an upload.

        Raises
        ------
        RuntimeError
            If called after :meth:`close`.
        """
        if self._closed.is_set():
            raise RuntimeError("ReplyPulls is closed")
        wanted = [m for m in message_ids if m not in self._pulling]
        if wanted:
            try:
                announced = flower139.announced_replies(self._grid, wanted)
            except httpx.HTTPStatusError as err:
                # As Flower's own pull: a response too large to take is logged, not raised.
                if err.response.status_code != httpx.codes.REQUEST_ENTITY_TOO_LARGE:
                    raise
                log(ERROR, "[fedsync] PullMessages for %d replies: %s", len(wanted), err)
                announced = []
            for reply in announced:
                self._pulling[reply.task_id] = self._pool.submit(self._pull_one, reply)
        done = [m for m, future in self._pulling.items() if future.done()]
        pulled = []
        for message_id in done:
            future = self._pulling.pop(message_id)
            error = future.exception()
            if error is None:
                pulled.append(future.result())
            else:  # the request failed, not the upload: the reply is gone all the same
                reason = f"{type(error).__name__}: {error}"
                pulled.append(PulledReply(message_id, None, code=0, reason=reason))
        return pulled

    def forget(self, message_ids: Iterable[str]) -> None:
        """Stop pulling the replies to these task messages (the caller stopped waiting).

        A pull in flight ends at its next try for an object; none of them is returned.
        """
        for message_id in message_ids:
            future = self._pulling.pop(message_id, None)
            if future is not None and not future.cancel() and not future.done():
                self._forgotten.add(message_id)  # running: its next try stops it

    def close(self) -> None:
        """Stop every pull in flight and end the worker threads (waits for them)."""
        self._closed.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pulling.clear()

    # --- on a worker thread -------------------------------------------------------------------
    def _pull_one(self, reply: flower139.AnnouncedReply) -> PulledReply:
        task_id = reply.task_id
        try:
            message = flower139.pull_reply(
                self._grid,
                reply,
                stopped=lambda: self._closed.is_set() or task_id in self._forgotten,
            )
        except flower139.ReplyUnavailable as err:
            return PulledReply(task_id, None, code=err.code, reason=err.reason)
        finally:
            self._forgotten.discard(task_id)
        return PulledReply(task_id, message)


def concurrent_pulls(
    grid: Grid, *, retry_from: float, workers: int = DEFAULT_WORKERS
) -> ReplyPulls | None:
    """:class:`ReplyPulls` for Flower 1.39's HTTP Grid; ``None`` for any other Grid.

    ``None`` too, with a one-time log line, when the Grid is Flower's HTTP Grid but
    Flower's layout is not the one :class:`ReplyPulls` was written for: the caller then
    keeps the Grid's own (one reply after another) ``pull_messages``.

    On the HTTP Grid either way, the object pulls of this process retry from
    ``retry_from`` seconds, at most :data:`~fedsync.compat.flower139.LOCAL_PULL_RETRY_CAP_S`
    apart: Flower announces a reply while its node is still uploading it and would
    retry 1, 2, 4 ... 10 s apart, and the SuperLink that started the ServerApp is on
    its host.
    """
    why = flower139.reply_pulls_import_problem()
    if why:
        _log_fallback(why)
        return None
    if not flower139.is_http_grid(grid):
        return None
    flower139.shorten_object_pulls(retry_from, cap=flower139.LOCAL_PULL_RETRY_CAP_S)
    why = flower139.http_grid_layout_problem(grid)
    if why:
        _log_fallback(why)
        return None
    return ReplyPulls(grid, workers=workers)


def _log_fallback(why: str) -> None:
    global _layout_logged
    if not _layout_logged:
        _layout_logged = True
        log(
            WARNING,
            "[fedsync] replies are pulled one after another (Flower's layout: %s)",
            why,
        )
