"""The fedsync Flower ServerApp (``fedsync.server.app:app``)."""
