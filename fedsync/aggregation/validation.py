"""Checks a decoded update must pass before it may touch the global model.

The wire decoder already refuses malformed frames; this is the server's own second
line: a frame can be well formed and still be wrong for *this* model (another model's
tensor table, a shape that changed, NaN/Inf values a diverged client produced). Any
fault raises :class:`InvalidUpdate` naming the tensor and what was wrong, before a
single accumulator is touched.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedsync.updates import LowRankTensor, SparseTensor, TensorSpec

__all__ = ["InvalidUpdate", "validate_dense", "validate_update"]


class InvalidUpdate(ValueError):
    """A decoded update that does not fit the model or carries non-finite values."""


def validate_update(
    update: Mapping[str, SparseTensor],
    specs: Mapping[str, TensorSpec],
    *,
    require_all: bool = True,
) -> None:
    """Raise :class:`InvalidUpdate` unless ``update`` fits ``specs`` exactly.

    Parameters
    ----------
    update : mapping of str to SparseTensor
        The decoded update.
    specs : mapping of str to TensorSpec
        The global model's tensors.
    require_all : bool
        Whether every tensor of the model must be present (the codec always sends
        every tensor, if only with zero entries; a missing one means a different model).

    Raises
    ------
    InvalidUpdate
        Unknown or missing tensor, shape mismatch, index/value arrays of the wrong
        dtype, rank or length, positions out of range or not strictly increasing,
        non-finite values.
    """
    unknown = sorted(set(update) - set(specs))
    if unknown:
        raise InvalidUpdate(f"update has tensors the model does not: {unknown[:5]}")
    if require_all:
        missing = sorted(set(specs) - set(update))
        if missing:
            raise InvalidUpdate(f"update lacks model tensors: {missing[:5]}")
    for name, tensor in update.items():
        _validate_tensor(name, tensor, specs[name])


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


def validate_dense(update: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec]) -> None:
    """Raise :class:`InvalidUpdate` unless every dense tensor is a known model tensor of
    its shape, floating point and finite (missing tensors are allowed here)."""
    unknown = sorted(set(update) - set(specs))
    if unknown:
        raise InvalidUpdate(f"update has tensors the model does not: {unknown[:5]}")
    for name, tensor in update.items():
        if tuple(tensor.shape) != tuple(specs[name].shape):
            raise InvalidUpdate(
                f"tensor {name!r}: shape {tuple(tensor.shape)} != model shape "
                f"{tuple(specs[name].shape)}"
            )
        if not tensor.is_floating_point():
            raise InvalidUpdate(f"tensor {name!r}: dense values must be floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise InvalidUpdate(f"tensor {name!r}: values contain NaN or Inf")
