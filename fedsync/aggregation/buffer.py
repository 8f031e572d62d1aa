"""The K-update cache: sparse updates scatter-added, weighted, into dense accumulators.

FedBuff and TEASQ-Fed aggregate once ``K`` updates are cached. The cache never holds
the updates themselves: each arriving :class:`~fedsync.updates.SparseTensor` is
scatter-added (``index_add_``) with its weight into one dense float32 accumulator per
model tensor, so memory is one model's worth whatever ``K`` is, and an update is never
densified on its own. Low-rank updates (PowerSGD's ``P Q^T``) are kept as their factors,
``r (m + n)`` floats each, and added with one matrix product when the buffer is taken.

Exactly ``K``: :meth:`UpdateBuffer.add` refuses a ``K+1``-th update until
:meth:`UpdateBuffer.take` has emptied the cache. (An async strategy that appends
first and checks ``len >= K`` later aggregates ``K+1`` updates whenever two replies
land in one poll; the refusal makes that a loud error instead of a silent bias.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from fedsync.aggregation.validation import InvalidUpdate, validate_dense, validate_update
from fedsync.updates import LowRankTensor, SparseTensor, TensorSpec, accumulate_lowrank
from kernels.triton import scatter_add_

__all__ = ["BufferFull", "BufferNotReady", "BufferedAggregate", "UpdateBuffer"]

Normalization = Literal["count", "weight"]


class BufferFull(RuntimeError):
    """An update was offered to a cache that already holds ``K`` updates."""


class BufferNotReady(RuntimeError):
    """:meth:`UpdateBuffer.take` was called with fewer than ``K`` updates cached."""


@dataclass
class BufferedAggregate:
    """What one aggregation hands to the server optimizer.

    Attributes
    ----------
    update : dict of str to torch.Tensor
        The weighted mean model delta (local minus start model) per tensor, dense,
        float32: the *negative* pseudo-gradient, the direction the server moves in.
    count : int
        How many updates went in (always the buffer's ``K``).
    weight_sum : float
        Sum of the weights of those updates.
    """

    update: dict[str, torch.Tensor]
    count: int
    weight_sum: float


class UpdateBuffer:
    """Caches exactly ``capacity`` weighted sparse updates, then hands out their mean.

    Parameters
    ----------
    specs : mapping of str to TensorSpec
        The model's tensors; an accumulator of each shape is allocated once.
    capacity : int
        ``K``, the number of updates per aggregation, ``>= 1`` (``1``: FedAsync).
    normalization : {"count", "weight"}
        How :meth:`take` turns the weighted sum into a mean: divide by ``K``
        (``"count"``, FedBuff: staleness weights shrink the step) or by the sum of the
        weights (``"weight"``, TEASQ-Fed: a convex combination, weights only re-balance).
    device : str or torch.device
        Where the accumulators live (``"cpu"``, ``"cuda"``).
    """

    def __init__(
        self,
        specs: Mapping[str, TensorSpec],
        *,
        capacity: int,
        normalization: Normalization = "count",
        device: str | torch.device = "cpu",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity K must be >= 1, got {capacity}")
        if normalization not in ("count", "weight"):
            raise ValueError(f"normalization must be 'count' or 'weight', got {normalization!r}")
        if not specs:
            raise ValueError("buffer needs at least one tensor spec")
        self.specs: dict[str, TensorSpec] = dict(specs)
        self.capacity = capacity
        self.normalization: Normalization = normalization
        self.device = torch.device(device)
        # --- accumulation state (reset by take) ---
        self._sums = {
            name: torch.zeros(spec.numel, dtype=torch.float32, device=self.device)
            for name, spec in self.specs.items()
        }
        self._lowrank: dict[str, list[tuple[float, LowRankTensor]]] = {}
        self._count = 0
        self._weight_sum = 0.0

    def __len__(self) -> int:
        return self._count

    @property
    def is_full(self) -> bool:
        """Whether exactly ``K`` updates are cached (time to :meth:`take`)."""
        return self._count == self.capacity

    @property
    def weight_sum(self) -> float:
        """Sum of the weights cached so far."""
        return self._weight_sum

    def add(self, update: Mapping[str, SparseTensor | torch.Tensor], weight: float) -> int:
        """Add ``weight * update`` into the accumulators.

        The update is validated in full first, so a bad one leaves the cache untouched.

        Parameters
        ----------
        update : mapping of str to SparseTensor or torch.Tensor
            A decoded update with every model tensor: sparse tensors are scatter-added,
            dense tensors (of the model tensor's shape) added whole.
        weight : float
            Its aggregation weight (the strategy's), finite and ``>= 0``.

        Returns
        -------
        int
            Updates cached after this one.

        Raises
        ------
        BufferFull
            If ``K`` updates are already cached (call :meth:`take` first).
        ValueError
            If the weight is negative or not finite.
        fedsync.aggregation.validation.InvalidUpdate
            If the update does not fit the model or carries NaN/Inf.
        """
        if self._count >= self.capacity:
            raise BufferFull(
                f"buffer already holds K={self.capacity} updates; take() before adding more"
            )
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"update weight must be finite and >= 0, got {weight}")
        lowrank = {n: t for n, t in update.items() if isinstance(t, LowRankTensor)}
        sparse = {
            n: t
            for n, t in update.items()
            if isinstance(t, SparseTensor) and not isinstance(t, LowRankTensor)
        }
        dense = {n: t for n, t in update.items() if not isinstance(t, SparseTensor)}
        validate_update({**sparse, **lowrank}, self.specs, require_all=False)
        validate_dense(dense, self.specs)
        missing = sorted(set(self.specs) - set(update))
        if missing:
            raise InvalidUpdate(f"update lacks model tensors: {missing[:5]}")
        for name, tensor in sparse.items():
            if tensor.nnz == 0:
                continue
            indices = tensor.indices.to(self.device)
            values = tensor.values.to(self.device, dtype=torch.float32)
            # Indices are validated sorted and unique: the scatter-add is then an exact,
            # deterministic per-coordinate sum (Triton on CUDA, index_add_ elsewhere,
            # bit-identical; see kernels.triton.scatter).
            scatter_add_(self._sums[name], indices, values, weight)
        for name, array in dense.items():
            flat = array.reshape(-1).to(self.device, dtype=torch.float32)
            self._sums[name].add_(flat, alpha=weight)
        for name, factors in lowrank.items():
            # Kept as factors (r * (m + n) floats); take() adds them all with one product.
            moved = LowRankTensor(
                factors.spec,
                factors.p.to(self.device, torch.float32),
                factors.q.to(self.device, torch.float32),
            )
            self._lowrank.setdefault(name, []).append((float(weight), moved))
        self._count += 1
        self._weight_sum += float(weight)
        return self._count

    def take(self) -> BufferedAggregate:
        """Return the weighted mean of the ``K`` cached updates and empty the cache.

        Raises
        ------
        BufferNotReady
            If fewer than ``K`` updates are cached.
        """
        if self._count != self.capacity:
            raise BufferNotReady(
                f"buffer holds {self._count} of K={self.capacity} updates; aggregate only at K"
            )
        for name, terms in self._lowrank.items():
            accumulate_lowrank(self._sums[name], terms)
        if self.normalization == "count":
            scale = 1.0 / self._count
        else:
            # All weights zero (every update infinitely stale): move nowhere.
            scale = 1.0 / self._weight_sum if self._weight_sum > 0.0 else 0.0
        update = {
            name: (acc * scale).reshape(self.specs[name].shape) for name, acc in self._sums.items()
        }
        result = BufferedAggregate(update=update, count=self._count, weight_sum=self._weight_sum)
        self.clear()
        return result

    def clear(self) -> None:
        """Drop whatever is cached (the run ended between aggregations)."""
        for acc in self._sums.values():
            acc.zero_()
        self._lowrank.clear()
        self._count = 0
        self._weight_sum = 0.0
