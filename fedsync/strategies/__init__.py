"""fedsync's asynchronous strategies, one class per file on one small base.

``STRATEGIES[name]`` is the class the ``strategy`` run-config value names, filled by
subclassing :class:`Strategy`; Flower's own FedAvg (``fedavg``) is the synchronous
baseline (:mod:`fedsync.serverapp.run_fedavg`). Your ServerApp imports the classes from
:mod:`fedsync.serverapp`. Every module of this folder is imported here, so a new
strategy is its file alone (docs/architecture.md, "Adding a strategy").
"""

from fedsync.plugins import import_submodules
from fedsync.strategies.base import STRATEGIES, Arrival, Contribution, Strategy
from fedsync.strategies.diloco import DiLoCo
from fedsync.strategies.fedasync import FedAsync
from fedsync.strategies.fedasync_mix import FedAsyncMix
from fedsync.strategies.fedbuff import FedBuff
from fedsync.strategies.teasq import TEASQ

import_submodules(__name__, __path__)

__all__ = [
    "STRATEGIES",
    "TEASQ",
    "Arrival",
    "Contribution",
    "DiLoCo",
    "FedAsync",
    "FedAsyncMix",
    "FedBuff",
    "Strategy",
]
