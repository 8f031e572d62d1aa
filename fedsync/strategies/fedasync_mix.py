"""FedAsync with the paper's model mixing: ``x <- (1 - a_t) x + a_t x_local``.

Xie et al. (2019) mix the device's trained model ``x_local`` into the global model
with ``a_t = alpha s(tau)``. The device trained from ``x_start`` (the model it decoded)
and sent ``Delta = x_local - x_start``, so::

    (1 - a_t) x + a_t x_local  =  x + a_t ((x_start - x) + Delta)

The contribution is ``(x_start - x) + Delta`` (dense), weighted by ``a_t``; with the
default server optimizer (``sgd``, learning rate 1) the step is exactly the mixing.
Unlike the delta form (:mod:`fedsync.strategies.fedasync`), a stale update also pulls
the global model back towards the older model it started from.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedsync.strategies.base import Arrival, Contribution
from fedsync.strategies.fedasync import FedAsync
from fedsync.updates import SparseTensor

__all__ = ["FedAsyncMix"]


class FedAsyncMix(FedAsync):
    """FedAsync as the paper writes it: ``x <- (1 - a_t) x + a_t x_local`` with
    ``a_t = alpha s(tau)``, one update per aggregation.

    Parameters: ``alpha`` and every keyword argument of :class:`FedAsync`.
    """

    name = "fedasync-mix"
    needs_start_model = True

    def contribution(
        self,
        update: Mapping[str, SparseTensor],
        arrival: Arrival,
        model: Mapping[str, torch.Tensor],
        start: Mapping[str, torch.Tensor] | None,
    ) -> Contribution:
        """``x_local - x = (x_start - x) + Delta`` per tensor, dense float32."""
        if start is None:
            raise ValueError("fedasync-mix needs the model each update started from")
        out: dict[str, torch.Tensor] = {}
        for name, tensor in update.items():
            local = start[name].to(torch.float32) - model[name].to(torch.float32)
            flat = local.reshape(-1)
            flat.index_add_(0, tensor.indices.to(flat.device), tensor.values.to(flat.device))
            out[name] = local
        return out
