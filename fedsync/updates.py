"""The shapes an update takes between the compressor, the wire and the server.

These three small types are the contracts the rest of fedsync is built on:

* :class:`TensorSpec` -- what a tensor is (name, shape, dtype), carried in the frame's
  tensor table so the decoder can check every count against it; :func:`tensor_specs`
  makes them from a state dict.
* :class:`QuantizedValues` and :class:`CompressedTensor` -- what a compressor hands to
  the wire format: positions (or none, for dense and fixed-mask tensors) and integer
  codes of a known bit width plus the float parameters needed to turn codes back
  into values. The wire format packs them without knowing what the codes mean.
* :class:`SparseTensor` -- what the server aggregates: flat indices and float32 values
  per tensor, never densified unless asked (:func:`densify`); its subclass
  :class:`LowRankTensor` holds factors ``P``, ``Q`` instead (PowerSGD), which
  :func:`accumulate_lowrank` adds many at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

Array = np.ndarray | torch.Tensor
"""Codes, params and positions on the sender's side: numpy arrays on the host, or
torch tensors on the device the update lives on until the frame is written (the wire
encoder then brings them to the host in one copy, see :mod:`fedsync.wire.staging`).
A received frame always holds numpy arrays."""


def host_array(array: Array) -> np.ndarray:
    """``array`` as a numpy array (copied off a device; zero-copy on the host)."""
    if isinstance(array, torch.Tensor):
        return array.detach().cpu().numpy()
    return np.asarray(array)


def device_tensor(
    array: Array, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``array`` as a torch tensor on ``device`` (no copy when it already is one there)."""
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.asarray(array))
    return tensor.to(device=device, dtype=dtype)


IndexMode = Literal["explicit", "dense", "mask", "lowrank"]
"""How positions travel: ``explicit`` indices, ``dense`` (every position, in order,
no indices), ``mask`` (the positions of a mask both sides already share), or
``lowrank`` (no positions: the values are the factors ``P`` (m x r) then ``Q``
(n x r), row-major, of the tensor viewed as an m x n matrix, see
:func:`matrix_dims`; ``r = count / (m + n)``)."""


def matrix_dims(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(m, n)``: a tensor of >= 2 dimensions viewed as a matrix, first dimension by
    the product of the rest; ``None`` for 0-d and 1-d shapes.

    The one place that fixes how a low-rank tensor's factors map to its shape.
    """
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def factored_rank(shape: tuple[int, ...], rank: int, min_rate: float) -> int:
    """The rank a tensor of ``shape`` is factored at, or 0 when it is not worth it.

    PowerSGD's "worth it?" rule, shared by the ``powersgd`` stage and AB-Training: the
    rank is capped at ``min(m, n)``, and the tensor is factored only when its factors
    are at least ``min_rate`` times smaller than it, ``r * (m + n) * min_rate < m * n``.
    """
    dims = matrix_dims(shape)
    if dims is None:
        return 0
    m, n = dims
    r = min(rank, m, n)
    if r < 1 or r * (m + n) * min_rate >= m * n:
        return 0
    return r


def lowrank_rank(shape: tuple[int, ...], count: int) -> int | None:
    """The rank ``r`` of a ``lowrank`` tensor of ``shape`` carrying ``count`` values:
    ``count == r * (m + n)`` with ``1 <= r <= min(m, n)``; ``None`` when no such ``r``."""
    dims = matrix_dims(shape)
    if dims is None:
        return None
    m, n = dims
    if m <= 0 or n <= 0 or count <= 0 or count % (m + n):
        return None
    rank = count // (m + n)
    return rank if rank <= min(m, n) else None


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


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype``'s name in a :class:`TensorSpec`: torch's, less ``torch.`` (``float32``)."""
    return str(dtype).removeprefix("torch.")


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    """The :class:`TensorSpec` of one tensor: ``name``, its shape and its dtype's name."""
    return TensorSpec(name, tuple(int(d) for d in tensor.shape), dtype_name(tensor.dtype))


def tensor_specs(state: Mapping[str, torch.Tensor | TensorSpec]) -> dict[str, TensorSpec]:
    """The :class:`TensorSpec` (name, shape, dtype) of every tensor of ``state``, in order.

    The one place a model's specs are made: what an :class:`~fedsync.codecs.UpdateCodec`
    is given as ``specs=`` and checks frames against (``decode(expected=)``). Nothing is
    left out: a codec compresses floating-point tensors only, so give it those (the
    engine's trained tensors, :func:`fedsync.recipe.model_state`), or let
    :class:`~fedsync.codecs.Codec` pick them (:func:`~fedsync.codecs.float_tensors`).

    Parameters
    ----------
    state : mapping of str to torch.Tensor or to TensorSpec
        A state dict or update (any device; nothing is copied), or specs, which are
        returned as given.

    Raises
    ------
    TypeError
        If an entry is neither a tensor nor a :class:`TensorSpec`.
    ValueError
        If a spec's name differs from its key.
    """
    specs: dict[str, TensorSpec] = {}
    for name, item in state.items():
        if isinstance(item, torch.Tensor):
            specs[name] = tensor_spec(name, item)
        elif isinstance(item, TensorSpec):
            if item.name != name:
                raise ValueError(f"entry {name!r} is the spec of {item.name!r}")
            specs[name] = item
        else:
            raise TypeError(
                f"entry {name!r} must be a torch.Tensor or TensorSpec, got {type(item).__name__}"
            )
    return specs


@dataclass
class QuantizedValues:
    """Integer codes of a fixed bit width plus the floats needed to decode them.

    Parameters
    ----------
    scheme : str
        The quantizer that produced the codes (``"fp32"``, ``"fp16"``, ``"bf16"``,
        ``"uniform"``, ``"qsgd"``, ``"sign"``, ``"ternary"``, ``"binmean"``).
    bits : int
        Width of one code on the wire, 1 to 32.
    codes : numpy.ndarray or torch.Tensor
        One unsigned integer code per kept value (any unsigned dtype wide enough for
        ``bits``; a device tensor may hold them in the signed dtype of the same width,
        read as unsigned); for float schemes, the raw bit pattern of each value.
        A sender whose kernels run on a device keeps them there (see :data:`Array`).
    params : dict of str to numpy.ndarray or torch.Tensor
        Float32 side information (per-chunk scales, the norm, ...), by name. The wire
        format stores each array's length and raw bytes.
    """

    scheme: str
    bits: int
    codes: Array
    params: dict[str, Array] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@dataclass
class CompressedTensor:
    """One tensor of an update as the compressor hands it to the wire format.

    Parameters
    ----------
    spec : TensorSpec
        The dense tensor this came from.
    index_mode : {"explicit", "dense", "mask", "lowrank"}
        How positions travel (see :data:`IndexMode`).
    indices : numpy.ndarray or torch.Tensor or None
        Sorted, unique flat positions (int64) for ``explicit``; ``None`` otherwise.
        A device tensor on a sender whose kernels run on a device.
    values : QuantizedValues
        One code per kept position.
    seed : int or None
        The frame seed a seeded rotation (``rht``) of the values was drawn from, in
        ``[0, 2**64)``; ``None`` without one. Every tensor of a frame has the same,
        and the frame carries it once.
    """

    spec: TensorSpec
    index_mode: IndexMode
    indices: Array | None
    values: QuantizedValues
    seed: int | None = None


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


class LowRankTensor(SparseTensor):
    """A tensor that travelled as low-rank factors: ``P @ Q.T``, viewed as m x n.

    The receiver keeps the factors (``r * (m + n)`` floats) rather than the product.
    It is a :class:`SparseTensor` with every position, so code that only knows sparse
    tensors stays correct: :attr:`indices` and :attr:`values` materialise the dense
    product on first access (and cache it). Aggregation that knows factors reads
    :attr:`p` and :attr:`q` and adds many updates at once with
    :func:`accumulate_lowrank`, never forming one product per update.

    Parameters
    ----------
    spec : TensorSpec
        The dense tensor's name, shape (>= 2 dimensions) and dtype.
    p : torch.Tensor
        float32 ``(m, r)``.
    q : torch.Tensor
        float32 ``(n, r)``, on ``p``'s device; ``(m, n)`` is :func:`matrix_dims`.

    Raises
    ------
    ValueError
        If the factor shapes do not fit the spec (the decoder checks received factors
        before building one, so this guards programming errors).
    """

    def __init__(self, spec: TensorSpec, p: torch.Tensor, q: torch.Tensor) -> None:
        dims = matrix_dims(spec.shape)
        rank = int(p.shape[1]) if p.ndim == 2 else -1
        if (
            dims is None
            or p.ndim != 2
            or q.ndim != 2
            or tuple(p.shape) != (dims[0], rank)
            or tuple(q.shape) != (dims[1], rank)
        ):
            raise ValueError(
                f"low-rank factors of {spec.name!r} {spec.shape} must be (m, r) and (n, r) "
                f"with (m, n) = {dims}; got P {tuple(p.shape)} and Q {tuple(q.shape)}"
            )
        self.spec = spec
        self.p = p
        self.q = q
        self._indices: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        """Columns of each factor."""
        return int(self.p.shape[1])

    @property
    def factor_count(self) -> int:
        """Floats the factors hold: ``r * (m + n)``."""
        return int(self.p.numel() + self.q.numel())

    @property
    def indices(self) -> torch.Tensor:
        """Every flat position (materialised on first access)."""
        if self._indices is None:
            self._indices = torch.arange(self.spec.numel, dtype=torch.int64, device=self.p.device)
        return self._indices

    @indices.setter
    def indices(self, value: torch.Tensor) -> None:
        raise AttributeError("a LowRankTensor's positions follow from its spec")

    @property
    def values(self) -> torch.Tensor:
        """The product ``P @ Q.T``, flat (materialised on first access)."""
        if self._values is None:
            self._values = (self.p @ self.q.T).reshape(-1)
        return self._values

    @values.setter
    def values(self, value: torch.Tensor) -> None:
        raise AttributeError("a LowRankTensor's values follow from its factors")

    def to_dense(self) -> torch.Tensor:
        """Return the dense tensor (float32, the spec's shape)."""
        return (self.p @ self.q.T).reshape(self.spec.shape)

    def __repr__(self) -> str:
        return f"LowRankTensor({self.spec!r}, rank={self.rank}, device={self.p.device.type!r})"

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LowRankTensor)
            and self.spec == other.spec
            and torch.equal(self.p, other.p)
            and torch.equal(self.q, other.q)
        )


def accumulate_lowrank(
    buffer: torch.Tensor, terms: Sequence[tuple[float, LowRankTensor]]
) -> torch.Tensor:
    """Add ``sum_i w_i * P_i @ Q_i.T`` into ``buffer`` in place, with one matrix product.

    The factors are stacked side by side, ``[w_1 P_1 | ... | w_K P_K]`` (m x R) and
    ``[Q_1 | ... | Q_K]`` (n x R) with ``R = sum r_i``, and added with one ``addmm``:
    holding the terms costs ``R * (m + n)`` floats and the product ``m * n * R``
    multiply-adds, once per flush rather than once per update.

    Parameters
    ----------
    buffer : torch.Tensor
        float32 accumulator of the tensors' spec shape or flat (``m * n`` values),
        contiguous, on the factors' device.
    terms : sequence of (float, LowRankTensor)
        Weights and low-rank tensors of the same spec shape.

    Returns
    -------
    torch.Tensor
        ``buffer`` (modified in place).

    Raises
    ------
    ValueError
        If a term's shape differs from the buffer's or the buffer is not contiguous.
    """
    if not terms:
        return buffer
    shape = terms[0][1].spec.shape
    dims = matrix_dims(shape)
    if dims is None or buffer.numel() != math.prod(shape) or not buffer.is_contiguous():
        raise ValueError(
            f"buffer of shape {tuple(buffer.shape)} cannot hold low-rank terms of shape {shape}"
        )
    for _, term in terms:
        if term.spec.shape != shape:
            raise ValueError(
                f"low-rank term {term.spec.name!r} has shape {term.spec.shape}, the others {shape}"
            )
    ps = torch.cat([term.p * float(weight) for weight, term in terms], dim=1)
    qs = torch.cat([term.q for _, term in terms], dim=1)
    buffer.view(dims).addmm_(ps, qs.T)
    return buffer


SparseUpdate = dict[str, SparseTensor]
"""A model update as the server aggregates it: tensor name to sparse tensor."""


def densify(update: Mapping[str, SparseTensor]) -> dict[str, torch.Tensor]:
    """Turn a sparse update into dense float32 tensors, by name."""
    return {name: tensor.to_dense() for name, tensor in update.items()}
