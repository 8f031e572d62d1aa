"""The fedsync Flower ClientApp (``clients.app:app``)."""
