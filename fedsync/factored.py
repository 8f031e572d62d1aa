"""AB-Training's factored form of a model: which tensors, their split, and the shapes both
ends agree on.

A run with ``ab-rank = r`` trains the large weight matrices of the global model in
factored form. The server splits each such tensor ``W``, viewed as the m x n matrix of
:func:`fedsync.updates.matrix_dims`, by its SVD: ``W = A B + R`` with the rank-``r``
part ``A B = U_r S_r V_r^T`` and the remainder ``R``, which is never sent and stays in
the server's model. A task trains one *side*; the other factor is frozen, and it is the
one sent with orthonormal rows or columns:

* side ``A``: the device gets ``B = V_r^T`` (r x n), trains ``dA`` (m x r) with
  ``W = W_v + dA B`` and sends ``dA``;
* side ``B``: the device gets ``A = U_r`` (m x r), trains ``dB`` (r x n) with
  ``W = W_v + A dB`` and sends ``dB``.

With an orthonormal frozen factor a step on the trained one moves ``W`` by the gradient
projected onto the top-``r`` singular subspace (``G V_r V_r^T`` or ``U_r U_r^T G``), at
the run's own learning rate. Split evenly (``U_r sqrt(S_r)``, ``sqrt(S_r) V_r^T``) the
same step would be scaled by the singular values, so a learning rate that suits one
layer is too small or too large for another (measured on the digits MLP at rank 4, 12
tasks of 20 SGD steps, test accuracy even split vs orthonormal: 0.29 vs 0.39 at learning
rate 0.05, 0.73 vs 0.76 at 0.2, diverged (0.10) vs 0.86 at 0.5).

The factor the device did not train was frozen, so the server rebuilds the update
exactly from what was sent: ``dA B`` or ``A dB``, a rank-``r`` product it adds to its
buffer as factors (:class:`fedsync.updates.LowRankTensor`), never as a dense matrix.
Tensors that are not factored (biases, norms, small matrices) train and travel as in
any other run.

Which tensors are factored follows from the shapes alone (PowerSGD's "worth it?"
rule, :func:`fedsync.updates.factored_rank`), so the
device derives the shapes of the frozen factors it decodes and of the deltas it sends
from the model and the run config, as the server does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import torch

from fedsync.updates import LowRankTensor, TensorSpec, factored_rank, matrix_dims

__all__ = [
    "SCHEDULES",
    "SIDES",
    "FactorShape",
    "Side",
    "factor_shapes",
    "frozen_specs",
    "other",
    "rebuild",
    "split",
    "uplink_specs",
]

Side = Literal["A", "B"]
SIDES: Final[tuple[Side, ...]] = ("A", "B")
"""The factor a task trains (the other one is frozen)."""
SCHEDULES: Final = ("alternate", "version")
"""``ab-schedule``: ``alternate`` sides task by task (odd task numbers train ``A``);
``version`` by the model version the task starts from (even versions train ``A``)."""


@dataclass(frozen=True)
class FactorShape:
    """One factored tensor: its model spec and the rank of its factors.

    Attributes
    ----------
    spec : TensorSpec
        The model tensor (two or more dimensions).
    m, n : int
        Its matrix view (:func:`fedsync.updates.matrix_dims`).
    rank : int
        Columns of ``A`` / rows of ``B``: ``min(ab-rank, m, n)``.
    """

    spec: TensorSpec
    m: int
    n: int
    rank: int

    def factor(self, which: Side) -> TensorSpec:
        """The spec of factor ``which``: ``A`` is (m, r), ``B`` is (r, n)."""
        shape = (self.m, self.rank) if which == "A" else (self.rank, self.n)
        return TensorSpec(self.spec.name, shape, "float32")


def other(side: Side) -> Side:
    """The factor that is frozen while ``side`` trains."""
    return "B" if side == "A" else "A"


def factor_shapes(
    specs: Mapping[str, TensorSpec], rank: int, min_rate: float
) -> dict[str, FactorShape]:
    """The tensors of a model that AB-Training factors, in the model's order.

    Parameters
    ----------
    specs : mapping of str to TensorSpec
        The model's floating-point tensors.
    rank : int
        ``ab-rank`` (>= 1); a tensor's rank is ``min(rank, m, n)``.
    min_rate : float
        Factor a tensor only when ``r * (m + n) * min_rate < m * n`` (>= 1).
    """
    shapes: dict[str, FactorShape] = {}
    for name, spec in specs.items():
        r = factored_rank(spec.shape, rank, min_rate)
        dims = matrix_dims(spec.shape)
        if r and dims is not None:
            shapes[name] = FactorShape(spec, *dims, r)
    return shapes


def uplink_specs(
    specs: Mapping[str, TensorSpec], shapes: Mapping[str, FactorShape], side: Side
) -> dict[str, TensorSpec]:
    """What a task of ``side`` sends: the trained factor's delta for every factored
    tensor, the tensor itself for the rest (the frame's schema, both ends)."""
    return {
        name: shapes[name].factor(side) if name in shapes else spec for name, spec in specs.items()
    }


def frozen_specs(shapes: Mapping[str, FactorShape], side: Side) -> dict[str, TensorSpec]:
    """What a task of ``side`` receives besides the model: the other factor of each
    factored tensor."""
    frozen = other(side)
    return {name: shape.factor(frozen) for name, shape in shapes.items()}


def split(weight: torch.Tensor, shape: FactorShape) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen factors of ``weight`` (its m x n view): ``(U_r, V_r^T)``, float32.

    ``U_r`` (m x r, orthonormal columns) is what a side-``B`` task holds fixed as ``A``;
    ``V_r^T`` (r x n, orthonormal rows) is what a side-``A`` task holds fixed as ``B``.
    The SVD runs in float64 on the host, so the split does not depend on the device the
    model lives on.
    """
    matrix = weight.detach().to("cpu", torch.float64).reshape(shape.m, shape.n)
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    a = u[:, : shape.rank]
    b = vh[: shape.rank]
    return a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()


def rebuild(
    delta: torch.Tensor, frozen: torch.Tensor, shape: FactorShape, side: Side
) -> LowRankTensor:
    """The model update a factor delta stands for, exactly: ``dA B`` or ``A dB``.

    Parameters
    ----------
    delta : torch.Tensor
        The decoded delta of the trained factor (``shape.factor(side)``'s shape).
    frozen : torch.Tensor
        The other factor, as the device decoded it (on ``delta``'s device).
    shape : FactorShape
        The tensor.
    side : {"A", "B"}
        The factor the task trained.

    Returns
    -------
    LowRankTensor
        ``P Q^T`` with ``P = dA, Q = B^T`` (side ``A``) or ``P = A, Q = dB^T`` (side
        ``B``): rank ``r``, never densified by the buffer.
    """
    if side == "A":
        p, q = delta, frozen.T
    else:
        p, q = frozen, delta.T
    return LowRankTensor(shape.spec, p.contiguous(), q.contiguous())
