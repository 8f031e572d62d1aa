"""``python -m fedsync.analysis``: see :mod:`fedsync.analysis.cli`."""

from fedsync.analysis.cli import main

raise SystemExit(main())
