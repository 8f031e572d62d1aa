"""The fedsync Flower ClientApp (``clients.warm:app``, which runs ``clients.app``)."""
