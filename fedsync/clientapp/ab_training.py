"""The device's side of AB-Training: train one factor of each large weight matrix.

A task of an AB-Training run (:mod:`fedsync.factored`) names the side it trains and
carries the frozen other factor of every factored tensor. :class:`FactoredModel` wraps
the task's model so that training sees ``W = W_v + dA B`` (side ``A``) or
``W = W_v + A dB`` (side ``B``) for those tensors: ``W_v`` (the downlinked weight) and
the frozen factor are fixed, only the zero-initialised delta is a parameter, and the
other tensors (biases, small matrices) train as usual. The weights are put together
on every forward pass with :func:`torch.func.functional_call`, so any module (linear,
convolution, LSTM) takes part without being rewritten. The reply then carries the
factor deltas, not the weights' change, and the server rebuilds the change exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedsync.codecs import UpdateCodec
from fedsync.factored import FactorShape, Side, factor_shapes, frozen_specs, other
from fedsync.updates import TensorSpec, densify

__all__ = ["FactorTaskError", "FactoredModel", "decode_frozen"]


class FactorTaskError(ValueError):
    """An AB-Training task this node cannot train (its factors do not fit its model)."""


def decode_frozen(
    payload: bytes,
    side: str,
    specs: Mapping[str, TensorSpec],
    *,
    rank: int,
    min_rate: float,
) -> tuple[Side, dict[str, FactorShape], dict[str, torch.Tensor]]:
    """The task's side, the factored tensors and their frozen factors, decoded.

    The factor shapes follow from the model and the run's ``ab-rank`` (``rank``) and
    ``ab-min-rate`` (``min_rate``), which the task carries, as on the server; the frame
    is checked against them before anything is allocated.

    Raises
    ------
    FactorTaskError
        If the run config has no ``ab-rank`` or the side is not ``A`` / ``B``.
    fedsync.wire.PayloadError
        If the frame is broken or holds factors of other shapes (it names the tensor).
    """
    if rank <= 0:
        raise FactorTaskError(
            f"the task trains factor {side!r}, but names ab-rank = {rank} (no factors)"
        )
    if side not in ("A", "B"):
        raise FactorTaskError(f"the task's ab-side must be 'A' or 'B', got {side!r}")
    trained: Side = "A" if side == "A" else "B"
    shapes = factor_shapes(specs, rank, min_rate)
    expected = frozen_specs(shapes, trained)
    return trained, shapes, densify(UpdateCodec().decode(payload, expected))


class FactoredModel(nn.Module):
    """``model`` with each factored weight trained as one factor's delta.

    Parameters
    ----------
    model : torch.nn.Module
        The task's model, holding the downlinked weights ``W_v``.
    shapes : mapping of str to FactorShape
        The factored tensors (parameter names of ``model``).
    frozen : mapping of str to torch.Tensor
        The frozen factor of each: ``B`` (r x n) for side ``A``, ``A`` (m x r) for ``B``.
    side : {"A", "B"}
        The factor trained.

    Raises
    ------
    FactorTaskError
        If a factored name is not a parameter of ``model`` or a frozen factor has the
        wrong shape.
    """

    def __init__(
        self,
        model: nn.Module,
        shapes: Mapping[str, FactorShape],
        frozen: Mapping[str, torch.Tensor],
        side: Side,
    ) -> None:
        super().__init__()
        self.model = model
        self.side = side
        self.names = list(shapes)
        parameters = dict(model.named_parameters())
        self._weights: list[nn.Parameter] = []
        """The factored weights ``W_v``, in :attr:`names` order (``to()`` keeps them)."""
        self.deltas = nn.ParameterList()
        for index, name in enumerate(self.names):
            weight = parameters.get(name)
            if weight is None:
                raise FactorTaskError(f"factored tensor {name!r} is not a parameter of the model")
            shape = shapes[name]
            want = shape.factor(other(side)).shape
            if tuple(frozen[name].shape) != want:
                raise FactorTaskError(
                    f"tensor {name!r}: frozen factor {tuple(frozen[name].shape)} != {want}"
                )
            weight.requires_grad_(False)  # W_v stays; its change is the factor's product
            self._weights.append(weight)
            self.deltas.append(nn.Parameter(torch.zeros(shape.factor(side).shape)))
            self.register_buffer(f"frozen_{index}", frozen[name])

    def weights(self) -> dict[str, torch.Tensor]:
        """The factored weights as training sees them: ``W_v + dA B`` or ``W_v + A dB``."""
        weights: dict[str, torch.Tensor] = {}
        for index, (name, weight) in enumerate(zip(self.names, self._weights, strict=True)):
            delta, frozen = self.deltas[index], self.get_buffer(f"frozen_{index}")
            product = delta @ frozen if self.side == "A" else frozen @ delta
            weights[name] = weight + product.reshape(weight.shape)
        return weights

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self.model, self.weights(), args, kwargs)

    def factor_deltas(self) -> dict[str, torch.Tensor]:
        """The trained deltas (``dA`` or ``dB``), detached, on the training device."""
        return {name: self.deltas[i].detach() for i, name in enumerate(self.names)}
