"""The component contracts: a sparsifier picks positions, a quantizer codes values,
and an optional rotation between them maps the kept values to ones that quantize better.

Each works on one flat float32 tensor at a time, on whatever device it lives, and calls
device kernels only through :func:`fedsync.kernels.dispatch.backend_for` (a rotation
only through torch ops). None keeps anything about a tensor between calls except what
it declares as state (SIDCo's stage count), which the codec can export with the
error-feedback residuals.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.config import QuantizerConfig, RotationConfig, SparsifierConfig
from fedsync.compression.errors import CodecMismatch, NonFiniteUpdate
from fedsync.updates import IndexMode, QuantizedValues, TensorSpec, host_array

__all__ = [
    "Kept",
    "Quantizer",
    "Rotation",
    "Sparsifier",
    "expect_params",
    "target_count",
    "top_per_row",
]


def target_count(numel: int, density: float) -> int:
    """Values a sparsifier of ``density`` keeps of ``numel``: ``round(density * numel)``,
    at least 1 when the tensor is not empty (biases and 0-d tensors still travel),
    at most ``numel``."""
    if numel <= 0:
        return 0
    return max(1, min(numel, math.floor(density * numel + 0.5)))


def top_per_row(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of the ``k`` largest magnitudes of each row of a 2-d tensor, ties
    to the lower column (a stable sort: the kept set is a function of the data alone)."""
    order = torch.sort(rows.abs(), dim=1, descending=True, stable=True).indices
    return order[:, :k]


@dataclass
class Kept:
    """What a sparsifier keeps of one flat tensor.

    Attributes
    ----------
    mode : {"explicit", "dense", "mask", "lowrank"}
        How the positions travel.
    positions : torch.Tensor or None
        int64 increasing positions on the input's device (explicit and mask modes);
        ``None`` for dense (every position, in order) and lowrank.
    values : torch.Tensor
        float32 values at those positions, on the input's device; for lowrank the
        factors ``P`` then ``Q``, row-major (see :data:`fedsync.updates.IndexMode`).
    """

    mode: IndexMode
    positions: torch.Tensor | None
    values: torch.Tensor


class Sparsifier(ABC):
    """Picks which entries of a flat float32 tensor travel.

    Subclasses implement :meth:`select` and :meth:`max_count`; the mask sparsifier
    also :meth:`mask_positions`. ``state`` is a plain dict of numpy arrays the codec
    exports and restores (``context.state`` in Flower); most sparsifiers leave it
    empty. ``memory`` is the same for tensors that stay on the update's device
    (PowerSGD's warm-start ``Q``); the codec shares and exports it too.
    """

    config: SparsifierConfig

    def __init__(self, config: SparsifierConfig) -> None:
        self.config = config
        self.state: dict[str, np.ndarray] = {}
        self.memory: dict[str, torch.Tensor] = {}

    def select_for(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Kept:
        """:meth:`select` for a tensor whose shape matters (the pipeline calls this);
        by default the shape is ignored."""
        return self.select(spec.name, x, seed)

    def quantizer_for(self, spec: TensorSpec, default: Quantizer) -> Quantizer:
        """The quantizer of ``spec``'s values: ``default`` (the pipeline's) unless the
        sparsifier sends some tensors another way (PowerSGD's dense fallback)."""
        return default

    @abstractmethod
    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        """Choose the entries of ``x`` (1-d float32) to send for tensor ``name``.

        ``seed`` is this tensor's own seed for this call; only stochastic
        sparsifiers use it.
        """

    @abstractmethod
    def max_count(self, spec: TensorSpec) -> int:
        """Most values this sparsifier ever sends for ``spec`` (the decoder's bound)."""

    def index_mode(self, spec: TensorSpec) -> IndexMode:
        """How positions of ``spec`` travel."""
        return "explicit"

    def mask_positions(self, spec: TensorSpec) -> np.ndarray:
        """The shared positions of a ``mask``-mode tensor (int64, increasing).

        Only sparsifiers whose :meth:`index_mode` is ``"mask"`` have them; asking any
        other is a caller's error.
        """
        raise TypeError(
            f"{self.config.name} sends explicit positions (index mode "
            f"{self.index_mode(spec)!r}), not a shared mask"
        )


class Rotation(ABC):
    """An orthonormal, seeded map of a tensor's kept values, applied between the
    sparsifier and the quantizer and undone by the receiver after it dequantizes.

    It keeps the count (the frame carries as many codes as without it) and the
    positions; only the values change. Its randomness comes from the *frame seed*,
    which the frame carries once (see :mod:`fedsync.wire.layout`), and the tensor's
    name, so the receiver rebuilds the same map without it ever travelling.
    """

    config: RotationConfig

    def __init__(self, config: RotationConfig) -> None:
        self.config = config

    @abstractmethod
    def rotate(self, name: str, values: torch.Tensor, seed: int) -> torch.Tensor:
        """The rotated 1-d float32 ``values`` of tensor ``name`` (a new tensor on the
        values' device, the same length) under the frame seed ``seed``."""

    @abstractmethod
    def unrotate(self, name: str, values: torch.Tensor, seed: int) -> torch.Tensor:
        """The inverse of :meth:`rotate` (a new tensor; the input is not changed)."""


class Quantizer(ABC):
    """Turns float32 values into fixed-width integer codes plus float params, and back.

    Class attributes
    ----------------
    scheme : str
        The wire's scheme name (``"uniform"``, ``"qsgd"``, ...).
    unbiased : bool
        Whether ``E[dequantize(quantize(v))] == v`` over the seed.
    """

    scheme: ClassVar[str] = ""
    unbiased: ClassVar[bool] = False
    config: QuantizerConfig

    def __init__(self, config: QuantizerConfig) -> None:
        self.config = config

    @property
    @abstractmethod
    def bits(self) -> int:
        """Width of one code on the wire."""

    @abstractmethod
    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        """Codes for the 1-d float32 ``values`` (all finite): numpy arrays from a host
        backend, tensors on the values' device from any other (see
        :data:`fedsync.updates.Array`)."""

    @abstractmethod
    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        """float32 values of codes already checked by :meth:`dequantize`."""

    @abstractmethod
    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        """Per-value bound on ``|dequantize(q) - values|`` (float32, like ``values``).

        This is the quantizer's promise, which the property tests hold it to.
        """

    def param_lengths(self, count: int) -> dict[str, int]:
        """Name and length of every float param for ``count`` values."""
        return {}

    def check_codes(self, codes: np.ndarray) -> str | None:
        """Why these codes are not in the quantizer's alphabet, or ``None``."""
        return None

    def dequantize(
        self, q: QuantizedValues, device: torch.device | str = "cpu", *, tensor: str = ""
    ) -> torch.Tensor:
        """Validate ``q`` against this quantizer and return float32 values.

        Raises
        ------
        CodecMismatch
            If the scheme, bit width, params or codes are not what this quantizer
            produces.
        """
        label = repr(tensor) if tensor else None
        if q.scheme != self.scheme or q.bits != self.bits:
            raise CodecMismatch(
                "values were not produced by this codec's quantizer",
                field="scheme/bits",
                tensor=label,
                expected=f"{self.scheme}/{self.bits}",
                got=f"{q.scheme}/{q.bits}",
            )
        expect_params(q, self.param_lengths(len(q)), label)
        why = self.check_codes(host_array(q.codes))
        if why is not None:
            raise CodecMismatch(why, field="codes", tensor=label)
        return self.decode(q, torch.device(device))


def expect_params(q: QuantizedValues, lengths: dict[str, int], label: str | None) -> None:
    """Raise :class:`CodecMismatch` unless ``q.params`` has exactly these names and
    lengths, and :class:`NonFiniteUpdate` if one holds NaN or Inf."""
    if set(q.params) != set(lengths):
        raise CodecMismatch(
            "params differ from the quantizer's",
            field="params",
            tensor=label,
            expected=sorted(lengths),
            got=sorted(q.params),
        )
    for name, length in lengths.items():
        array = host_array(q.params[name])
        if array.shape != (length,):
            raise CodecMismatch(
                f"param {name!r} has the wrong length",
                field="params",
                tensor=label,
                expected=length,
                got=array.shape,
            )
        if not np.isfinite(array).all():
            raise NonFiniteUpdate(f"param {name!r} is not finite", field="params", tensor=label)
