"""``flower-supernode``, its Fleet API poll shortened (Flower 1.39; ``fedsync-node``'s default).

Flower 1.39's SuperNode sleeps a hard-coded 3 s between requests for work and 0.5 s
between checks for a finished reply; no flag or environment variable changes either.
This launcher runs the unchanged ``flower-supernode`` entry point in this process with
both sleeps capped at ``FEDSYNC_SUPERNODE_POLL`` seconds
(:func:`fedsync.compat.flower139.cap_supernode_poll`)::

    FEDSYNC_SUPERNODE_POLL=0.2 python -m fedsync.deploy.fast_poll <flower-supernode args>

Each poll is one ``PullMessages`` call to the SuperLink: ``n`` idle nodes polling every
``p`` seconds cost it ``n / p`` calls a second (measured in
``benchmarks/results/deploy_overhead.json``, ``superlink_cpu_s``). It refuses to run on
any Flower but 1.39.

Once the poll is short, Flower's 1 s wait before pulling an object again was the largest
part of a warm task's overhead on loopback, so this launcher also retries those pulls
from the poll interval on (:func:`fedsync.compat.flower139.shorten_object_pulls`); the
warm executor and the ServerApp do the same for theirs.
"""

from __future__ import annotations

import os
import sys
from typing import Final

POLL_ENV: Final = "FEDSYNC_SUPERNODE_POLL"


def main() -> int:
    """Run ``flower-supernode`` with the shorter poll (arguments passed through)."""
    from fedsync.compat import flower139

    problem = flower139.version_problem("fast_poll")
    if problem:
        sys.stderr.write(f"{problem}\n")
        return 2
    poll = float(os.environ.get(POLL_ENV, "3"))
    if not 0.01 <= poll <= 3.0:
        sys.stderr.write(f"{POLL_ENV} must be in [0.01, 3] seconds, got {poll}\n")
        return 2
    flower139.cap_supernode_poll(poll)
    flower139.shorten_object_pulls(min(poll, 1.0), cap=max(poll, flower139.PULL_RETRY_CAP_S))
    flower139.run_flower_supernode(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
