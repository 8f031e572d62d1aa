"""fedsync's compressors inside PyTorch data-parallel training.

* :func:`fedsync_hook` with :class:`FedsyncHookState`: a communication hook for
  ``DistributedDataParallel.register_comm_hook`` that sends every gradient bucket as
  a fedsync frame (any spec: ``topk:0.01+uniform:4+ef``, ``dct:8+fp32+demo:0.999``).
* :class:`DeMo`: the decoupled-momentum optimizer (DCT top-k exchange per step, sign
  of the update), built on the same stages and the same exchange.

Both exchange frames with :func:`all_gather_bytes` and decode every rank's frame on
every rank, so a bad frame fails the step on all ranks (:class:`FrameExchangeError`).
"""

from fedsync.ddp.demo_optimizer import DeMo
from fedsync.ddp.exchange import (
    Exchange,
    FrameExchangeError,
    all_gather_bytes,
    decode_and_average,
    exchange_average,
)
from fedsync.ddp.hook import DDPCompressionStats, FedsyncHookState, fedsync_hook

__all__ = [
    "DDPCompressionStats",
    "DeMo",
    "Exchange",
    "FedsyncHookState",
    "FrameExchangeError",
    "all_gather_bytes",
    "decode_and_average",
    "exchange_average",
    "fedsync_hook",
]
