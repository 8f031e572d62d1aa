"""PowerSGD (Vogels et al., NeurIPS 2019): rank-``r`` factors from one warm-started
power iteration per tensor.

Every tensor of two or more dimensions is viewed as the m x n matrix ``M`` (first
dimension by the product of the rest, :func:`fedsync.updates.matrix_dims`). With the
sender's ``Q`` (n x r) from the previous call (seeded Gaussian the first time)::

    Q = orthonormalise(Q)    (keeps the product well scaled; P's span is unchanged)
    P = M Q                  (m x r, float32 product)
    P = orthonormalise(P)    (Gram-Schmidt in float64, see below)
    Q = M^T P                (n x r, float32 product); kept for the next call
    send P, Q                (the receiver's tensor is P Q^T)

Before they travel the factors are balanced column by column (``P_j * sqrt(c_j)``,
``Q_j / sqrt(c_j)`` with ``c_j = |Q_j|``): the product is unchanged, and both factors
then have entries of similar size, which suits one quantizer over the two (``+uniform``
chunks, ``+fp16``'s range). The warm-start memory keeps the unbalanced ``Q``.

Orthonormalisation is Gram-Schmidt, column by column with one reorthogonalisation
pass (:func:`orthonormalize`), in float64, then cast to float32. float64 because the
warm start drives the columns of ``M Q`` towards the same top singular directions,
where float32 Gram-Schmidt loses orthogonality (and the factors' product its
accuracy); the cost is ``O(m r^2)``, negligible next to the two ``O(m n r)`` products.
The fixed column order and fixed operations make it deterministic on a device. The
two products use the device's matrix multiply, whose summation order differs between
devices, so unlike the sparsifiers this stage gives the same bytes for the same input
only on the same kind of device.

"Worth it?" (PowerSGD's ``min_compression_rate``): a tensor is factored only when
``r * (m + n) * min_rate < m * n``; the others (1-d tensors, biases, norms, small
matrices) travel dense in the ``fallback`` quantizer (``fp16`` by default; ``same``
for the pipeline's quantizer). The rank of a tensor is ``min(rank, m, n)``. Both
rules depend on the shape alone, so the receiver knows which tensors are factors.

With error feedback (``+ef``) the residual is ``M - P Q^T`` (the decoded factors'
product), so what one call leaves out the next one sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsync.compression.base import Kept, Quantizer, Sparsifier
from fedsync.compression.config import BuildContext, SparsifierConfig, check_range
from fedsync.compression.errors import NonFiniteInputError, SpecError
from fedsync.compression.registry import REGISTRY, register
from fedsync.updates import IndexMode, TensorSpec, factored_rank, matrix_dims

__all__ = ["FALLBACKS", "PowerSGD", "PowerSGDConfig", "orthonormalize"]

FALLBACKS = ("fp16", "bf16", "fp32", "same")
"""Quantizers for tensors that are not factored (``same``: the pipeline's)."""

MAX_RANK = 1024


@register()
@dataclass(frozen=True)
class PowerSGDConfig(SparsifierConfig):
    """``powersgd:<rank>[,min_rate=<x>][,fallback=fp16|bf16|fp32|same][,warm=true|false]``.

    Parameters
    ----------
    rank : int
        Columns of each factor, 1 to 1024 (a matrix smaller than that gets its own
        ``min(m, n)``).
    min_rate : float
        Factor a tensor only when its factors are at least this many times smaller
        than it: ``r * (m + n) * min_rate < m * n``; >= 1.
    fallback : str
        Quantizer of the tensors not factored: ``fp16``, ``bf16``, ``fp32`` or
        ``same`` (the pipeline's quantizer).
    warm : bool
        Start each call's power iteration from the previous call's ``Q`` (PowerSGD's
        warm start); ``false`` draws a fresh seeded ``Q`` every call.
    """

    name: ClassVar[str] = "powersgd"
    primary: ClassVar[str | None] = "rank"
    rank: int = 4
    min_rate: float = 2.0
    fallback: str = "fp16"
    warm: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int):
            raise SpecError(f"powersgd: rank must be an int, got {self.rank!r}")
        check_range("powersgd", "rank", self.rank, 1, MAX_RANK)
        check_range("powersgd", "min_rate", self.min_rate, 1.0, math.inf, hi_open=True)
        if self.fallback not in FALLBACKS:
            raise SpecError(
                f"powersgd: fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}"
            )
        if not isinstance(self.warm, bool):
            raise SpecError(f"powersgd: warm must be a bool, got {self.warm!r}")

    def build(self, context: BuildContext) -> PowerSGD:
        return PowerSGD(self, context)


def orthonormalize(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``p`` (m x r): Gram-Schmidt in float64, column by
    column, each projected out of the earlier ones twice (classical Gram-Schmidt with
    one reorthogonalisation, as accurate as the modified variant and one matrix-vector
    product per pass).

    A column that is (numerically) in the span of the earlier ones, or zero, becomes
    zero rather than noise: its factor then adds nothing. Returns float32.
    """
    work = p.to(torch.float64).clone()
    scale = float(work.abs().max()) if work.numel() else 0.0
    tiny = scale * 1e-12
    for j in range(work.shape[1]):
        col = work[:, j]
        done = work[:, :j]
        for _ in range(2):  # the second pass removes what rounding left of the first
            col -= done @ (done.T @ col)
        norm = float(torch.linalg.vector_norm(col))
        if norm > tiny and norm > 0.0:
            col /= norm
        else:
            col.zero_()
    return work.to(torch.float32)


class PowerSGD(Sparsifier):
    """Rank-r factors by one warm-started power iteration (see module docstring)."""

    config: PowerSGDConfig

    def __init__(self, config: PowerSGDConfig, context: BuildContext) -> None:
        super().__init__(config)
        self._fallback: Quantizer | None = None
        if config.fallback != "same":
            self._fallback = REGISTRY.lookup(config.fallback, "quantizer")().build(context)

    # -- shape rules (shared by both sides) ------------------------------------------------

    def rank_for(self, spec: TensorSpec) -> int:
        """The rank ``spec`` is factored at, or 0 when it travels as the fallback."""
        return factored_rank(spec.shape, self.config.rank, self.config.min_rate)

    def index_mode(self, spec: TensorSpec) -> IndexMode:
        return "lowrank" if self.rank_for(spec) else "dense"

    def max_count(self, spec: TensorSpec) -> int:
        rank = self.rank_for(spec)
        if not rank:
            return spec.numel
        dims = matrix_dims(spec.shape)
        assert dims is not None
        return rank * (dims[0] + dims[1])

    def quantizer_for(self, spec: TensorSpec, default: Quantizer) -> Quantizer:
        if self._fallback is not None and not self.rank_for(spec):
            return self._fallback
        return default

    # -- sender ----------------------------------------------------------------------------

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        # Without a shape every tensor is 1-d: the fallback.
        return Kept("dense", None, x)

    def select_for(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Kept:
        rank = self.rank_for(spec)
        if not rank:
            return Kept("dense", None, x)
        dims = matrix_dims(spec.shape)
        assert dims is not None
        m, n = dims
        matrix = x.view(m, n)
        q = orthonormalize(self._start(spec, n, rank, x, seed))
        p = orthonormalize(matrix @ q)
        q = matrix.T @ p
        if not (torch.isfinite(p).all() and torch.isfinite(q).all()):
            # Checked before the memory changes: a bad update leaves the state as it was.
            raise NonFiniteInputError(f"tensor {spec.name!r} holds NaN or Inf")
        if self.config.warm:
            self.memory[spec.name] = self._revive(q, seed)
        norms = torch.linalg.vector_norm(q, dim=0)
        root = torch.where(norms > 0, norms.sqrt(), torch.ones_like(norms))
        values = torch.cat([(p * root).reshape(-1), (q / root).reshape(-1)])
        return Kept("lowrank", None, values)

    def _start(
        self, spec: TensorSpec, n: int, rank: int, x: torch.Tensor, seed: int
    ) -> torch.Tensor:
        """The warm-start ``Q`` (n x r) of ``spec`` on ``x``'s device."""
        stored = self.memory.get(spec.name) if self.config.warm else None
        if stored is None:
            return _gaussian(n, rank, seed).to(x.device)
        if tuple(stored.shape) != (n, rank):
            raise ValueError(
                f"PowerSGD memory for {spec.name!r} has shape {tuple(stored.shape)} but the "
                f"update needs {(n, rank)}: the model or the rank changed; reset the state"
            )
        return stored.to(x.device)

    @staticmethod
    def _revive(q: torch.Tensor, seed: int) -> torch.Tensor:
        """``q`` with its all-zero columns (a rank the tensor lacked this call) redrawn,
        so the next call's power iteration can still find that direction."""
        dead = ~(q != 0).any(dim=0)
        if bool(dead.any()):
            fresh = _gaussian(q.shape[0], q.shape[1], seed + 1).to(q.device)
            q = torch.where(dead[None, :], fresh, q)
        return q.contiguous()


def _gaussian(n: int, rank: int, seed: int) -> torch.Tensor:
    """A seeded standard Gaussian ``(n, rank)`` float32 matrix, drawn on the host."""
    generator = torch.Generator().manual_seed(seed % (1 << 63))
    return torch.randn(n, rank, generator=generator, dtype=torch.float32)
