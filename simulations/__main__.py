"""``python -m simulations SCENARIO ...``: the same as ``python -m simulations.compare``."""

from __future__ import annotations

import sys

from simulations.compare import main

if __name__ == "__main__":
    sys.exit(main())
