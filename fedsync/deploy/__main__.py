"""``python -m fedsync.deploy``: the same as the ``fedsync-deploy`` command."""

from fedsync.deploy.cli import main

raise SystemExit(main())
