"""``python -m fedsync.simulations SCENARIO ...``: ``python -m fedsync.simulations.compare``."""

from __future__ import annotations

import sys

from fedsync.simulations.compare import main

if __name__ == "__main__":
    sys.exit(main())
