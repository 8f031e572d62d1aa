"""fedsync: sparsified, quantized, asynchronous federated training on Flower.

In your own Flower app (docs/library.md):

* :mod:`fedsync.serverapp`: the asynchronous strategies as objects for your
  ServerApp (``TEASQ``, ``FedBuff``, ``FedAsync``, ``FedAsyncMix``, ``DiLoCo``, each a
  :class:`~fedsync.strategies.Strategy`), Flower-style ``start()``;
* :mod:`fedsync.clientapp`: ``receive`` / ``Task.reply`` around your ``@app.train()``
  training loop, ``probe_reply`` for ``@app.query()``;
* :mod:`fedsync.codecs`: the codecs on state dicts and tensors (``Codec``);
* :class:`fedsync.config.RunConfig`: every setting, typed, from a run config
  (``prefix="fedsync."`` reads a ``[tool.flwr.app.config.fedsync]`` section).

The names below are loaded on first use: ``import fedsync`` stays light. The core
(codecs, wire format, aggregation, staleness, clocks, data, models, reports) imports
without Flower; ``serverapp`` and ``clientapp`` need it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "TEASQ": "fedsync.serverapp",
    "FedBuff": "fedsync.serverapp",
    "FedAsync": "fedsync.serverapp",
    "DiLoCo": "fedsync.serverapp",
    "FedAsyncMix": "fedsync.serverapp",
    "Strategy": "fedsync.serverapp",
    "Result": "fedsync.serverapp",
    "receive": "fedsync.clientapp",
    "probe_reply": "fedsync.clientapp",
    "Task": "fedsync.clientapp",
    "Codec": "fedsync.codecs",
    "codec_names": "fedsync.codecs",
    "PayloadError": "fedsync.codecs",
    "UnexpectedCodec": "fedsync.codecs",
    "RunConfig": "fedsync.config",
    "SettingsError": "fedsync.config",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fedsync' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
