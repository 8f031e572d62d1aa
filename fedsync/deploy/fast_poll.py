"""``flower-supernode`` with a shorter Fleet API poll (opt-in, Flower 1.39 only).

Flower 1.39's SuperNode sleeps a hard-coded 3 s between requests for work and 0.5 s
between checks for a finished reply; no flag or environment variable changes either.
This launcher runs the unchanged ``flower-supernode`` entry point in this process after
replacing the ``time`` module *seen by* ``flwr.supernode.start_client_internal`` with one
whose ``sleep`` waits at most ``FEDSYNC_SUPERNODE_POLL`` seconds (everything else is the
real ``time``)::

    FEDSYNC_SUPERNODE_POLL=0.2 python -m fedsync.deploy.fast_poll <flower-supernode args>

Each poll is one ``PullMessages`` call to the SuperLink: ``n`` idle nodes polling every
``p`` seconds cost it ``n / p`` calls a second (measured in
``benchmarks/results/deploy_overhead.json``, ``superlink_cpu_s``). It relies on a module
layout of Flower 1.39 and refuses to run on any other version.

A message's payload travels as separate objects: the SuperNode stores a pulled message
before its objects have arrived, and the SuperLink can hand a message out before the
ServerApp has pushed all of its objects. A reader that asks too early gets "object
unavailable" and Flower retries after 1 s, doubling (:func:`shorten_object_pulls`).
On loopback that 1 s was the largest part of a warm task's overhead once the poll was
short, so this launcher also starts those retries at the poll interval; the warm
executor (:mod:`clients.node_exec`) does the same for its pulls from its own SuperNode.
"""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Final

POLL_ENV: Final = "FEDSYNC_SUPERNODE_POLL"


def patched_time(poll: float) -> types.ModuleType:
    """A stand-in for ``time`` whose ``sleep`` is capped at ``poll`` seconds."""
    module = types.ModuleType("time")
    module.__dict__.update(time.__dict__)

    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, poll))

    module.sleep = sleep  # type: ignore[attr-defined]
    return module


def shorten_object_pulls(initial_backoff: float) -> bool:
    """Start Flower's retries of an unavailable object at ``initial_backoff`` seconds.

    Flower 1.39 pulls a message's objects with an exponential backoff that starts at
    1 s (``pull_objects`` and ``pull_and_inflate_object_from_tree``, keyword defaults);
    this sets the start for every caller in this process, keeping the doubling and the
    10 s cap. Returns whether it could (``False``: another Flower layout, nothing
    changed).
    """
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    defaults = [getattr(function, "__kwdefaults__", None) or {} for function in functions]
    if not all("initial_backoff" in d for d in defaults):
        return False
    for d in defaults:
        d["initial_backoff"] = initial_backoff
    return True


def main() -> int:
    """Run ``flower-supernode`` with the shorter poll (arguments passed through)."""
    import flwr
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli import flower_supernode

    if not flwr.__version__.startswith("1.39."):
        sys.stderr.write(f"fast_poll supports Flower 1.39 only, found {flwr.__version__}\n")
        return 2
    poll = float(os.environ.get(POLL_ENV, "3"))
    if not 0.01 <= poll <= 3.0:
        sys.stderr.write(f"{POLL_ENV} must be in [0.01, 3] seconds, got {poll}\n")
        return 2
    internal.time = patched_time(poll)
    shorten_object_pulls(min(poll, 1.0))
    sys.argv = ["flower-supernode", *sys.argv[1:]]
    flower_supernode()
    return 0


if __name__ == "__main__":
    sys.exit(main())
