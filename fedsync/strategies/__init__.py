"""fedsync's asynchronous strategies, one file each, registered here in one line each.

``STRATEGIES[name]`` is the class the ``strategy`` run-config value names; Flower's
own FedAvg (``fedavg``) is the synchronous baseline and lives in ``server/``.
"""

from fedsync.strategies.base import Arrival, Contribution, Strategy
from fedsync.strategies.diloco import DiLoCo
from fedsync.strategies.fedasync import FedAsync
from fedsync.strategies.fedasync_mix import FedAsyncMix
from fedsync.strategies.fedbuff import FedBuff
from fedsync.strategies.teasq import TEASQ

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (TEASQ, FedBuff, FedAsync, FedAsyncMix, DiLoCo)
}
"""Strategy classes by run-config name."""

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
