"""How soon Flower retries pulling a message's objects (Flower 1.39).

A Flower 1.39 message travels as its metadata and then its payload objects, and the
metadata is visible first: the SuperNode stores a pulled task before its objects have
arrived, the SuperLink hands out a message before its sender has pushed all of the
objects, and it announces a reply while the node is still uploading it. A reader that
asks too early gets "object unavailable", and Flower retries after 1 s, doubling up to
10 s (``pull_objects`` and ``pull_and_inflate_object_from_tree``). On a slow link that
overshoots the end of an upload by up to several seconds, and on loopback the first
1 s was most of a warm task's overhead. :func:`shorten_object_pulls` makes the
retries start at a process's poll interval and caps them: at :data:`LOCAL_PULL_RETRY_CAP_S`
for a reader whose objects come from a process on its own host (the warm executor,
``fedsync.clients.node_exec``, from its SuperNode; the ServerApp's reply channel,
``fedsync.server.reply_pulls``, from the SuperLink that started it), at :data:`PULL_RETRY_CAP_S` for
``fedsync-node --supernode-poll``, whose pulls cross the node's link.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["LOCAL_PULL_RETRY_CAP_S", "PULL_RETRY_CAP_S", "shorten_object_pulls"]

PULL_RETRY_CAP_S: Final = 0.5
"""The longest wait between two pulls of an unavailable object (Flower's: 10 s), for a
reader across a link: a SuperNode waiting out a 10 s upload makes about 20 small requests."""

LOCAL_PULL_RETRY_CAP_S: Final = 0.1
"""The same for a reader on the objects' own host, where a retry is one loopback request:
the time between the end of an upload and the pull that finds it complete is at most
this, and a 10 s upload costs about 100 requests."""


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
