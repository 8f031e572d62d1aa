"""The one check an update passes before it may touch the global model.

The wire decoder already refuses malformed frames; this is the server's own line: a
frame can be well formed and still be wrong for *this* model (another model's tensor
table, a shape that changed, NaN/Inf values a diverged client produced). Any fault
raises :class:`InvalidUpdate` naming the tensor and what was wrong. What passes comes
back as a :class:`ValidUpdate`, which the buffer adds without looking at it again: an
update is checked once, however many hands it passes through afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

import torch

from fedsync.updates import LowRankTensor, SparseTensor, TensorSpec

__all__ = ["InvalidUpdate", "ValidUpdate", "validate_update"]

UpdateTensor = TypeVar("UpdateTensor", bound="SparseTensor | torch.Tensor", covariant=True)
"""What a tensor of an update is: a :class:`~fedsync.updates.SparseTensor` (or
:class:`~fedsync.updates.LowRankTensor`) as decoded, or a dense ``torch.Tensor`` (a
strategy's own contribution, e.g. FedAsync's model mixing)."""


class InvalidUpdate(ValueError):
    """A decoded update that does not fit the model or carries non-finite values."""


@dataclass(frozen=True, slots=True)
class ValidUpdate(Generic[UpdateTensor]):
    """An update that fits the model exactly: every model tensor, no other, each of its
    shape, with finite float32 values at sorted unique positions (or finite float32
    factors, or a finite floating-point dense tensor).

    Made by :func:`validate_update`; the buffer
    (:meth:`~fedsync.aggregation.UpdateBuffer.add`) takes only this type and trusts it.
    Building one directly vouches for the tensors without a check: the engine does so
    only for what it derives exactly from a valid update (AB-Training's rebuild).

    Attributes
    ----------
    tensors : mapping of str to SparseTensor or torch.Tensor
        The update by model tensor name (read-only).
    specs : mapping of str to TensorSpec
        The model tensors it was checked against (read-only): the buffer takes it only
        when they are its own.
    """

    tensors: Mapping[str, UpdateTensor]
    specs: Mapping[str, TensorSpec]


def validate_update(
    update: Mapping[str, UpdateTensor], specs: Mapping[str, TensorSpec]
) -> ValidUpdate[UpdateTensor]:
    """``update`` as a :class:`ValidUpdate`, or :class:`InvalidUpdate` unless it fits
    ``specs`` exactly.

    Parameters
    ----------
    update : mapping of str to SparseTensor or torch.Tensor
        The decoded update (or a strategy's contribution): sparse and low-rank tensors,
        or dense ones of the model tensor's shape.
    specs : mapping of str to TensorSpec
        The global model's tensors: every one must be present (the codec always sends
        every tensor, if only with zero entries; a missing one means a different model).

    Returns
    -------
    ValidUpdate
        A read-only view of a copy of ``update`` (the tensors themselves are not copied).

    Raises
    ------
    InvalidUpdate
        Unknown or missing tensor, shape mismatch, index/value arrays of the wrong
        dtype, rank or length, positions out of range or not strictly increasing,
        non-finite values, a dense tensor that is not floating point.
    """
    unknown = sorted(set(update) - set(specs))
    if unknown:
        raise InvalidUpdate(f"update has tensors the model does not: {unknown[:5]}")
    missing = sorted(set(specs) - set(update))
    if missing:
        raise InvalidUpdate(f"update lacks model tensors: {missing[:5]}")
    for name, tensor in update.items():
        if isinstance(tensor, SparseTensor):
            _validate_tensor(name, tensor, specs[name])
        else:
            _validate_dense(name, tensor, specs[name])
    return ValidUpdate(MappingProxyType(dict(update)), MappingProxyType(dict(specs)))


def _validate_tensor(name: str, tensor: SparseTensor, spec: TensorSpec) -> None:
    if tuple(tensor.spec.shape) != tuple(spec.shape):
        raise InvalidUpdate(
            f"tensor {name!r}: shape {tuple(tensor.spec.shape)} != model shape {tuple(spec.shape)}"
        )
    if isinstance(tensor, LowRankTensor):  # factors: check them, never form the product
        for field, factor in (("P", tensor.p), ("Q", tensor.q)):
            if factor.dtype != torch.float32 or not bool(torch.isfinite(factor).all()):
                raise InvalidUpdate(f"tensor {name!r}: factor {field} is not finite float32")
        return
    indices, values = tensor.indices, tensor.values
    if indices.dtype != torch.int64 or indices.dim() != 1:
        raise InvalidUpdate(
            f"tensor {name!r}: indices must be 1-d int64, got {indices.dtype} "
            f"with {indices.dim()} dims"
        )
    if values.dtype != torch.float32 or values.dim() != 1:
        raise InvalidUpdate(
            f"tensor {name!r}: values must be 1-d float32, got {values.dtype} "
            f"with {values.dim()} dims"
        )
    if indices.numel() != values.numel():
        raise InvalidUpdate(
            f"tensor {name!r}: {indices.numel()} indices but {values.numel()} values"
        )
    if indices.numel() > spec.numel:
        raise InvalidUpdate(f"tensor {name!r}: {indices.numel()} entries for {spec.numel} elements")
    if indices.numel() == 0:
        return
    if int(indices[0]) < 0 or int(indices[-1]) >= spec.numel:
        raise InvalidUpdate(f"tensor {name!r}: positions outside [0, {spec.numel})")
    # Sorted and unique is what makes the scatter-add a plain sum; a duplicate would
    # count one coordinate twice.
    if indices.numel() > 1 and not bool(torch.all(indices[1:] > indices[:-1])):
        raise InvalidUpdate(f"tensor {name!r}: positions not strictly increasing")
    if not bool(torch.isfinite(values).all()):
        raise InvalidUpdate(f"tensor {name!r}: values contain NaN or Inf")


def _validate_dense(name: str, tensor: torch.Tensor, spec: TensorSpec) -> None:
    if tuple(tensor.shape) != tuple(spec.shape):
        raise InvalidUpdate(
            f"tensor {name!r}: shape {tuple(tensor.shape)} != model shape {tuple(spec.shape)}"
        )
    if not tensor.is_floating_point():
        raise InvalidUpdate(f"tensor {name!r}: dense values must be floating point")
    if not bool(torch.isfinite(tensor).all()):
        raise InvalidUpdate(f"tensor {name!r}: values contain NaN or Inf")
