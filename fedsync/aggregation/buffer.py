"""The K-update cache: sparse updates scatter-added, weighted, into per-tensor sums.

FedBuff and TEASQ-Fed aggregate once ``K`` updates are cached. An update is never
densified on its own: each arriving :class:`~fedsync.updates.SparseTensor` is
scatter-added (``index_add_``) with its weight into its tensor's accumulator. Low-rank
updates (PowerSGD's ``P Q^T``) are kept as their factors, ``r (m + n)`` floats each,
and added with one matrix product when the buffer is taken.

Each tensor's accumulator is one of two kinds, switched by the union density it sees
(how many positions the cached updates touch together, over the tensor's size):

* *sparse*: the decoded updates' positions and values are kept as they arrived
  (``12 * nnz`` bytes each) and folded at :meth:`UpdateBuffer.take`: one sort of
  their positions gives the union, then one scatter-add per update into the union's
  compact slots, and only the union is scaled and written into the (zeroed) result.
* *dense*: one float32 slot per element, a model's worth of memory; an update costs
  ``O(nnz)`` (the scatter alone), but the slots are zeroed and read out whole,
  ``O(numel)``, per aggregation.

No single kind wins everywhere (Zen's finding for sparse synchronisation, measured
for this buffer by ``benchmarks/buffer_accumulators.py``): at small union densities
the sparse kind skips a pass over the whole tensor, and as the union grows its sort
costs more than that pass. ``"auto"`` (the default) starts every tensor sparse at each
aggregation and turns it dense once its union passes :data:`DENSE_ABOVE` (or a dense
or low-rank update arrives for it) by replaying the cached updates into dense slots.
Both kinds add ``acc + value * weight`` with the same kernel in the same arrival
order, so the aggregate has the same bits whichever kind held each tensor
(``tests/unit/test_buffer.py`` checks it).

With ``normalization = "selected"`` (SparseLoCo's aggregation) each coordinate is
divided by the summed weights of the updates that *sent* it, not by ``K``: a dense
float32 tally per tensor counts them (a sparse update adds its weight at its
positions, a dense or low-rank one everywhere), so a coordinate only one of ``K``
sites selected moves by that site's value, not by a ``K``-th of it.

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

from fedsync.aggregation.validation import ValidUpdate
from fedsync.kernels.triton import scatter_add_
from fedsync.updates import LowRankTensor, SparseTensor, TensorSpec, accumulate_lowrank

__all__ = [
    "DENSE_ABOVE",
    "NORMALIZATIONS",
    "Accumulator",
    "BufferFull",
    "BufferNotReady",
    "BufferedAggregate",
    "UpdateBuffer",
]

Normalization = Literal["count", "weight", "selected"]
NORMALIZATIONS: tuple[Normalization, ...] = ("count", "weight", "selected")
"""How :meth:`UpdateBuffer.take` turns the weighted sums into a mean (see the class)."""
Accumulator = Literal["auto", "sparse", "dense"]
"""How the buffer sums a tensor: by union density (``auto``), or always one kind."""

DENSE_ABOVE = 0.005
"""Union density (positions touched by the cached updates over the tensor's size)
above which ``"auto"`` turns a tensor's accumulator dense.

Measured by ``benchmarks/buffer_accumulators.py`` (``benchmarks/results/
buffer_accumulators.json``: CPU time per aggregation, K = 3 and 10 updates of a 1M
and a 4M-element tensor): the sparse kind costs 0.54-0.83x the dense one up to a union
density of 0.001, 0.76-1.05x at 0.003, 0.81-1.33x at 0.01 (above 1 in three of the four
cases), 1.8-2.0x at 0.02 and 3.9-4.8x at 0.1 (the sort of the union grows with it, the
dense kind's two passes over the tensor do not), so the switch sits between 0.003 and
0.01. The sparse kind also
holds less memory there: ``12 * K * nnz`` bytes against ``4 * numel``."""


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
    normalization : {"count", "weight", "selected"}
        How :meth:`take` turns the weighted sum into a mean: divide by ``K``
        (``"count"``, FedBuff: staleness weights shrink the step), by the sum of the
        weights (``"weight"``, TEASQ-Fed: a convex combination, weights only
        re-balance), or each coordinate by the sum of the weights of the updates that
        sent it (``"selected"``, SparseLoCo's mean over the replicas that selected it).
    device : str or torch.device
        Where the accumulators live (``"cpu"``, ``"cuda"``).
    accumulator : {"auto", "sparse", "dense"}
        How each tensor is summed (see the module docstring): by the union density
        it sees (``"auto"``), or always sparse, or always dense. The aggregate is the
        same, bit for bit, either way.
    dense_above : float
        The union density at which ``"auto"`` turns a tensor dense, in ``[0, 1]``.
    """

    def __init__(
        self,
        specs: Mapping[str, TensorSpec],
        *,
        capacity: int,
        normalization: Normalization = "count",
        device: str | torch.device = "cpu",
        accumulator: Accumulator = "auto",
        dense_above: float = DENSE_ABOVE,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity K must be >= 1, got {capacity}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}"
            )
        if not specs:
            raise ValueError("buffer needs at least one tensor spec")
        if accumulator not in ("auto", "sparse", "dense"):
            raise ValueError(
                f"accumulator must be 'auto', 'sparse' or 'dense', got {accumulator!r}"
            )
        if not (math.isfinite(dense_above) and 0.0 <= dense_above <= 1.0):
            raise ValueError(f"dense_above must be in [0, 1], got {dense_above}")
        self.specs: dict[str, TensorSpec] = dict(specs)
        self.capacity = capacity
        self.normalization: Normalization = normalization
        self.device = torch.device(device)
        self.accumulator: Accumulator = accumulator
        self.dense_above = dense_above
        # --- accumulation state (reset by take) ---
        # Dense sums, by tensor: every tensor with "dense" (allocated once, zeroed by
        # clear), else those that passed the threshold in this aggregation.
        self._sums: dict[str, torch.Tensor] = {}
        if accumulator == "dense":
            self._sums = {
                name: torch.zeros(spec.numel, dtype=torch.float32, device=self.device)
                for name, spec in self.specs.items()
            }
        self._sparse: dict[str, _SparseSums] = {}
        self.last_kinds: dict[str, str] = {}
        """Which kind held each tensor at the last :meth:`take` (``"sparse"`` or
        ``"dense"``): what the union densities made ``"auto"`` choose."""
        self._lowrank: dict[str, list[tuple[float, LowRankTensor]]] = {}
        # "selected": per tensor, the summed weight of the updates that sent each slot.
        self._senders: dict[str, torch.Tensor] = {}
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

    def add(self, update: ValidUpdate[SparseTensor | torch.Tensor], weight: float) -> int:
        """Add ``weight * update`` into the accumulators.

        The update was checked once, when it became a :class:`ValidUpdate`
        (:func:`~fedsync.aggregation.validation.validate_update`); it is not checked
        again here.

        Parameters
        ----------
        update : ValidUpdate
            An update with every model tensor: sparse tensors are scatter-added, dense
            tensors (of the model tensor's shape) added whole.
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
        TypeError
            If ``update`` is not a :class:`ValidUpdate` (a plain mapping was never checked).
        ValueError
            Also if ``update`` was validated against other tensors than the buffer's.
        """
        if not isinstance(update, ValidUpdate):
            raise TypeError(
                f"the buffer adds a ValidUpdate (fedsync.aggregation.validate_update), "
                f"not {type(update).__name__}"
            )
        if update.specs != self.specs:
            raise ValueError(
                "the update was validated against other tensors than this buffer's model"
            )
        if self._count >= self.capacity:
            raise BufferFull(
                f"buffer already holds K={self.capacity} updates; take() before adding more"
            )
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"update weight must be finite and >= 0, got {weight}")
        tensors = update.tensors
        lowrank = {n: t for n, t in tensors.items() if isinstance(t, LowRankTensor)}
        sparse = {
            n: t
            for n, t in tensors.items()
            if isinstance(t, SparseTensor) and not isinstance(t, LowRankTensor)
        }
        dense = {n: t for n, t in tensors.items() if not isinstance(t, SparseTensor)}
        for name, tensor in sparse.items():
            if tensor.nnz == 0:
                continue
            indices = tensor.indices.to(self.device)
            values = tensor.values.to(self.device, dtype=torch.float32)
            # Indices are validated sorted and unique: the scatter-add is then an exact,
            # deterministic per-coordinate sum (Triton on CUDA, index_add_ elsewhere,
            # bit-identical; see fedsync.kernels.triton.scatter).
            if self.normalization == "selected":
                scatter_add_(self._tally(name), indices, torch.ones_like(values), weight)
            if name in self._sums:
                scatter_add_(self._sums[name], indices, values, weight)
                continue
            held = self._sparse.setdefault(name, _SparseSums())
            held.add(indices, values, weight)
            limit = self.dense_above * self.specs[name].numel
            # The union is at least this update's support and at most all the cached
            # positions: it is counted (a sort) only where those bounds do not decide.
            if (
                self.accumulator == "auto"
                and held.total > limit
                and (tensor.nnz > limit or held.count > limit)
            ):
                self._densify(name)
        for name, array in dense.items():
            flat = array.reshape(-1).to(self.device, dtype=torch.float32)
            self._densify(name).add_(flat, alpha=weight)
        if self.normalization == "selected":
            for name in (*dense, *lowrank):  # every slot sent
                self._tally(name).add_(weight)
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
            accumulate_lowrank(self._densify(name), terms)
        if self.normalization == "selected":
            scale = 1.0  # each slot is divided by its senders' weight below
        elif self.normalization == "count":
            scale = 1.0 / self._count
        else:
            # All weights zero (every update infinitely stale): move nowhere.
            scale = 1.0 / self._weight_sum if self._weight_sum > 0.0 else 0.0
        update: dict[str, torch.Tensor] = {}
        for name, spec in self.specs.items():
            if name in self._sums:
                flat = self._sums[name] * scale
                self.last_kinds[name] = "dense"
            else:
                # The untouched slots of a dense sum would read 0 * scale = +0.0 too.
                flat = torch.zeros(spec.numel, dtype=torch.float32, device=self.device)
                if name in self._sparse:
                    union, sums = self._sparse[name].fold()
                    flat[union] = sums * scale
                self.last_kinds[name] = "sparse"
            if self.normalization == "selected":
                senders = self._senders.get(name)
                if senders is None:  # no update sent this tensor
                    flat = torch.zeros_like(flat)
                else:  # slots no one sent (or only updates of weight 0) stay 0
                    flat = torch.where(senders > 0, flat / senders.clamp_min(1e-30), 0.0)
            update[name] = flat.reshape(spec.shape)
        result = BufferedAggregate(update=update, count=self._count, weight_sum=self._weight_sum)
        self.clear()
        return result

    def clear(self) -> None:
        """Drop whatever is cached (the run ended between aggregations)."""
        if self.accumulator == "dense":
            for acc in self._sums.values():
                acc.zero_()
        else:
            self._sums.clear()  # every tensor starts sparse again
        self._sparse.clear()
        self._lowrank.clear()
        self._senders.clear()
        self._count = 0
        self._weight_sum = 0.0

    def union_density(self, name: str) -> float:
        """Positions the cached updates touch together in tensor ``name``, over its size,
        while it is held sparse; ``1.0`` once it is dense (every slot is held)."""
        if name in self._sums:
            return 1.0
        held = self._sparse.get(name)
        return held.count / self.specs[name].numel if held is not None else 0.0

    def _tally(self, name: str) -> torch.Tensor:
        """The ``"selected"`` tally of tensor ``name``: summed weight of its senders."""
        tally = self._senders.get(name)
        if tally is None:
            tally = torch.zeros(self.specs[name].numel, dtype=torch.float32, device=self.device)
            self._senders[name] = tally
        return tally

    def _densify(self, name: str) -> torch.Tensor:
        """The dense sum of tensor ``name``, made from its sparse sums if needed."""
        acc = self._sums.get(name)
        if acc is None:
            acc = torch.zeros(self.specs[name].numel, dtype=torch.float32, device=self.device)
            held = self._sparse.pop(name, None)
            if held is not None:
                held.replay(acc)  # the same additions, in the same order, as if dense
            self._sums[name] = acc
        return acc


class _SparseSums:
    """One tensor's sparse accumulator: the cached updates' positions and values, kept
    as they arrived (the decoder's tensors, not copies), folded at the read-out.

    Appending costs nothing per element; :attr:`count` (the union's size) is computed
    only when the updates' combined size could pass the threshold, and
    :meth:`fold` sums once: one sort of all the positions, then one scatter-add per
    update, in arrival order, into the union's compact slots.
    """

    def __init__(self) -> None:
        self.terms: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self.total = 0
        """Positions over all cached updates: an upper bound of the union's size."""
        self._union: torch.Tensor | None = None

    def add(self, indices: torch.Tensor, values: torch.Tensor, weight: float) -> None:
        """Cache ``weight * values`` at ``indices`` (sorted, unique)."""
        self.terms.append((indices, values, weight))
        self.total += int(indices.numel())
        self._union = None

    def union(self) -> torch.Tensor:
        """The sorted positions any cached update touches."""
        if self._union is None:
            self._union = torch.unique(torch.cat([t[0] for t in self.terms]), sorted=True)
        return self._union

    @property
    def count(self) -> int:
        """Positions in the union."""
        return int(self.union().numel())

    def fold(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(union, sums)``: each union position's weighted sum, added in arrival order
        with the dense accumulator's kernel (``0 + v1 w1 + v2 w2 ...``)."""
        union = self.union()
        sums = torch.zeros(union.numel(), dtype=torch.float32, device=union.device)
        for indices, values, weight in self.terms:
            scatter_add_(sums, torch.searchsorted(union, indices), values, weight)
        return union, sums

    def replay(self, acc: torch.Tensor) -> None:
        """Add every cached update into the dense ``acc``, in arrival order."""
        for indices, values, weight in self.terms:
            scatter_add_(acc, indices, values, weight)
