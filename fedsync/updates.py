"""The shapes an update takes between the compressor, the wire and the server.

These three small types are the contracts the rest of fedsync is built on:

* :class:`TensorSpec` -- what a tensor is (name, shape, dtype), carried in the frame's
  tensor table so the decoder can check every count against it.
* :class:`QuantizedValues` and :class:`CompressedTensor` -- what a compressor hands to
  the wire format: positions (or none, for dense and fixed-mask tensors) and integer
  codes of a known bit width plus the float parameters needed to turn codes back
  into values. The wire format packs them without knowing what the codes mean.
* :class:`SparseTensor` -- what the server aggregates: flat indices and float32 values
  per tensor, never densified unless asked (:func:`densify`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

IndexMode = Literal["explicit", "dense", "mask"]
"""How positions travel: ``explicit`` indices, ``dense`` (every position, in order,
no indices), or ``mask`` (the positions of a mask both sides already share)."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of a model update.

    Parameters
    ----------
    name : str
        The tensor's key in the model's state dict.
    shape : tuple of int
        The tensor's shape; ``()`` for a 0-d tensor.
    dtype : str
        The dense dtype the tensor is restored to (``"float32"``, ``"float16"``,
        ``"bfloat16"``, ``"float64"``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        """Number of elements of the dense tensor."""
        return math.prod(self.shape)


@dataclass
class QuantizedValues:
    """Integer codes of a fixed bit width plus the floats needed to decode them.

    Parameters
    ----------
    scheme : str
        The quantizer that produced the codes (``"fp32"``, ``"fp16"``, ``"bf16"``,
        ``"uniform"``, ``"qsgd"``, ``"sign"``, ``"ternary"``).
    bits : int
        Width of one code on the wire, 1 to 32.
    codes : numpy.ndarray
        One unsigned integer code per kept value (any unsigned dtype wide enough for
        ``bits``); for float schemes, the raw bit pattern of each value.
    params : dict of str to numpy.ndarray
        Float32 side information (per-chunk scales, the norm, ...), by name. The wire
        format stores each array's length and raw bytes.
    """

    scheme: str
    bits: int
    codes: np.ndarray
    params: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@dataclass
class CompressedTensor:
    """One tensor of an update as the compressor hands it to the wire format.

    Parameters
    ----------
    spec : TensorSpec
        The dense tensor this came from.
    index_mode : {"explicit", "dense", "mask"}
        How positions travel (see :data:`IndexMode`).
    indices : numpy.ndarray or None
        Sorted, unique flat positions (int64) for ``explicit``; ``None`` otherwise.
    values : QuantizedValues
        One code per kept position.
    """

    spec: TensorSpec
    index_mode: IndexMode
    indices: np.ndarray | None
    values: QuantizedValues


@dataclass
class SparseTensor:
    """A sparse tensor the server can scatter-add: flat indices and float32 values.

    Parameters
    ----------
    spec : TensorSpec
        The dense tensor's name, shape and dtype.
    indices : torch.Tensor
        Sorted unique flat positions, int64, on any device.
    values : torch.Tensor
        Float32 values, one per index, on the same device.
    """

    spec: TensorSpec
    indices: torch.Tensor
    values: torch.Tensor

    @property
    def nnz(self) -> int:
        """Number of stored values."""
        return int(self.indices.numel())

    def to_dense(self) -> torch.Tensor:
        """Return the dense tensor (float32, the spec's shape)."""
        dense = torch.zeros(self.spec.numel, dtype=torch.float32, device=self.values.device)
        dense[self.indices] = self.values
        return dense.reshape(self.spec.shape)


SparseUpdate = dict[str, SparseTensor]
"""A model update as the server aggregates it: tensor name to sparse tensor."""


def densify(update: Mapping[str, SparseTensor]) -> dict[str, torch.Tensor]:
    """Turn a sparse update into dense float32 tensors, by name."""
    return {name: tensor.to_dense() for name, tensor in update.items()}
