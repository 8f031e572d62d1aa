"""The fedsync Flower ClientApp: ``fedsync.clients.app:app``."""
