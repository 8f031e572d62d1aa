"""fedsync for your own Flower ServerApp: the strategies, and the server loop they run on.

``TEASQ(...).start(grid=..., initial_arrays=..., evaluate_fn=...)`` as with Flower's
``FedAvg``: each strategy is one class of :mod:`fedsync.strategies` (one file each, on
:class:`~fedsync.strategies.Strategy`); the loop, the channel to the Grid, checkpoints and
the run's journal are this package's modules (docs/library.md, docs/architecture.md).
"""

from fedsync.serverapp.run import FlowerEvaluateFn, Result
from fedsync.strategies import STRATEGIES, TEASQ, DiLoCo, FedAsync, FedAsyncMix, FedBuff, Strategy

__all__ = [
    "STRATEGIES",
    "TEASQ",
    "DiLoCo",
    "FedAsync",
    "FedAsyncMix",
    "FedBuff",
    "FlowerEvaluateFn",
    "Result",
    "Strategy",
]
