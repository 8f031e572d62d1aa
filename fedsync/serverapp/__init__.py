"""fedsync's asynchronous strategies for your own Flower ServerApp.

``TEASQ(...).start(grid=..., initial_arrays=..., evaluate_fn=...)`` as with Flower's
``FedAvg``; see :mod:`fedsync.serverapp.strategy` and docs/library.md.
"""

from fedsync.serverapp.diloco import DiLoCo
from fedsync.serverapp.fedasync import FedAsync
from fedsync.serverapp.fedbuff import FedBuff
from fedsync.serverapp.strategy import _CLASSES, AsyncStrategy, FlowerEvaluateFn, Result
from fedsync.serverapp.teasq import TEASQ

_CLASSES.update({cls.name: cls for cls in (TEASQ, FedBuff, FedAsync, DiLoCo)})

__all__ = ["TEASQ", "AsyncStrategy", "DiLoCo", "FedAsync", "FedBuff", "FlowerEvaluateFn", "Result"]
