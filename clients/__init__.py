"""The fedsync Flower ClientApp: ``fedsync.clients.warm:app`` runs ``fedsync.clients.app``."""
