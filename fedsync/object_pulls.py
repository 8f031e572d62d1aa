"""How soon Flower retries pulling a message's objects (Flower 1.39).

A Flower 1.39 message travels as its metadata and then its payload objects, and the
metadata is visible first: the SuperNode stores a pulled task before its objects have
arrived, the SuperLink hands out a message before its sender has pushed all of the
objects, and it announces a reply while the node is still uploading it. A reader that
asks too early gets "object unavailable", and Flower retries after 1 s, doubling up to
10 s (``pull_objects`` and ``pull_and_inflate_object_from_tree``). On a slow link that
overshoots the end of an upload by up to several seconds, and on loopback the first
1 s was most of a warm task's overhead. :func:`shorten_object_pulls` makes the
retries start at a process's poll interval and caps them at :data:`PULL_RETRY_CAP_S`:
the warm executor (``clients.node_exec``), ``fedsync-node --supernode-poll`` and the
ServerApp's reply channel (``server.channel``) call it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PULL_RETRY_CAP_S", "shorten_object_pulls"]

PULL_RETRY_CAP_S: Final = 0.5
"""The longest wait between two pulls of an unavailable object (Flower's: 10 s). Each
retry is one small local request, so a reader waiting out a 10 s upload makes about 20."""


def shorten_object_pulls(initial_backoff: float, cap: float = PULL_RETRY_CAP_S) -> bool:
    """Retry an unavailable object after ``initial_backoff`` seconds, doubling up to ``cap``.

    Sets the keyword defaults of Flower 1.39's ``pull_objects`` and
    ``pull_and_inflate_object_from_tree`` for every caller in this process. Returns
    whether it could (``False``: another Flower layout; nothing changed).
    """
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    defaults = [getattr(function, "__kwdefaults__", None) or {} for function in functions]
    if not all("initial_backoff" in d and "backoff_cap" in d for d in defaults):
        return False
    for d in defaults:
        d["initial_backoff"] = initial_backoff
        d["backoff_cap"] = max(cap, initial_backoff)
    return True
