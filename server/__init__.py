"""The fedsync Flower ServerApp (``server.app:app``)."""
