"""The server's side of AB-Training: the factors, each task's side, and the exact rebuild.

Every ``ab-refactor-every`` versions the engine splits the global model's factored
tensors by SVD (:func:`fedsync.factored.split`). A task planned from a version of that
epoch trains side ``A`` or ``B`` by the ``ab-schedule`` and carries the other factor as
a frame (the run's ``downlink-codec``, e.g. ``none+fp16``). The server keeps that
factor *as the device decodes it* on the task's record for as long as the task is out
(:class:`fedsync.engine.InFlight`), so when the reply's factor delta arrives it
rebuilds ``dA B`` or ``A dB`` from exactly the factors the device trained with: the
only error in the update is what the uplink quantizer put in the delta. Factors of an
epoch live until its last task is answered or lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from fedsync.aggregation.downlink import UpdateCodecLike
from fedsync.config import SettingsError
from fedsync.factored import (
    SIDES,
    FactorShape,
    Side,
    factor_shapes,
    frozen_specs,
    other,
    rebuild,
    split,
    uplink_specs,
)
from fedsync.updates import SparseTensor, TensorSpec, densify

__all__ = ["ABTraining"]


@dataclass
class _Epoch:
    """The factors of one split: what each side's tasks receive and rebuild with."""

    number: int
    payload: dict[Side, bytes] = field(default_factory=dict)
    """The frozen-factor frame a task of each side carries."""
    frozen: dict[Side, dict[str, torch.Tensor]] = field(default_factory=dict)
    """That frame decoded: the frozen factors exactly as the device holds them."""


class ABTraining:
    """Factors of the global model and the tasks that train them.

    Parameters
    ----------
    specs : mapping of str to TensorSpec
        The global model's floating-point tensors.
    rank, min_rate : int, float
        ``ab-rank`` and ``ab-min-rate`` (:func:`fedsync.factored.factor_shapes`).
    schedule : {"alternate", "version"}
        ``ab-schedule``.
    refactor_every : int
        ``ab-refactor-every``: versions per split.
    codec_factory : callable
        Schema -> codec of the frozen-factor frames.
    device : str or torch.device
        Where the frozen factors are kept (the engine's ``server-device``).

    Raises
    ------
    fedsync.config.SettingsError
        If no tensor of the model is worth factoring at this rank.
    """

    def __init__(
        self,
        specs: Mapping[str, TensorSpec],
        *,
        rank: int,
        min_rate: float,
        schedule: str,
        refactor_every: int,
        codec_factory: Callable[[Mapping[str, TensorSpec]], UpdateCodecLike],
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.shapes: dict[str, FactorShape] = factor_shapes(specs, rank, min_rate)
        if not self.shapes:
            raise SettingsError(
                f"run config 'ab-rank' = {rank} factors no tensor of this model: a tensor of "
                f"m x n is factored only when r * (m + n) * {min_rate} < m * n "
                f"(shapes: {sorted({s.shape for s in specs.values()})[:6]})"
            )
        self.rank = rank
        self.schedule = schedule
        self.refactor_every = refactor_every
        self.uplink: dict[Side, dict[str, TensorSpec]] = {
            side: uplink_specs(specs, self.shapes, side) for side in SIDES
        }
        """The schema of a reply of each side (the frame's digest covers it)."""
        self._frozen_specs = {side: frozen_specs(self.shapes, side) for side in SIDES}
        self._codecs = {side: codec_factory(self._frozen_specs[side]) for side in SIDES}
        self._epoch: _Epoch | None = None
        self.splits = 0
        """SVD splits made so far."""
        self.tasks = {side: 0 for side in SIDES}
        """Tasks planned per side."""
        self.factor_bytes = 0
        """Bytes of frozen-factor frames handed out."""

    # --- planning -----------------------------------------------------------------------------
    def for_task(
        self, number: int, version: int, model: Mapping[str, torch.Tensor]
    ) -> tuple[Side, bytes, dict[str, torch.Tensor]]:
        """The side the task trains, the frozen-factor frame it carries, and that frame
        decoded (what :meth:`rebuild` needs when the reply is in; the task keeps it).

        Parameters
        ----------
        number : int
            The task's number (it picks the side under ``alternate``).
        version : int
            The model version it starts from; a new epoch splits ``model`` first.
        model : mapping of str to torch.Tensor
            The global model at ``version``.
        """
        epoch = self._epoch_for(version, model)
        if self.schedule == "alternate":
            side: Side = "A" if number % 2 == 1 else "B"
        else:
            side = "A" if version % 2 == 0 else "B"
        self.tasks[side] += 1
        payload = epoch.payload[side]
        self.factor_bytes += len(payload)
        return side, payload, epoch.frozen[side]

    def _epoch_for(self, version: int, model: Mapping[str, torch.Tensor]) -> _Epoch:
        number = version // self.refactor_every
        if self._epoch is not None and self._epoch.number == number:
            return self._epoch
        epoch = _Epoch(number=number)
        factors: dict[Side, dict[str, torch.Tensor]] = {"A": {}, "B": {}}
        for name, shape in self.shapes.items():
            factors["A"][name], factors["B"][name] = split(model[name], shape)
        for side in SIDES:
            frozen = other(side)
            codec = self._codecs[side]
            payload = codec.encode(factors[frozen])
            epoch.payload[side] = payload
            epoch.frozen[side] = densify(
                codec.decode(payload, self._frozen_specs[side], device=self.device)
            )
        self._epoch = epoch
        self.splits += 1
        return epoch

    # --- replies ------------------------------------------------------------------------------
    def rebuild(
        self, side: Side, frozen: Mapping[str, torch.Tensor], update: Mapping[str, SparseTensor]
    ) -> dict[str, SparseTensor]:
        """The model update a reply stands for.

        ``update`` is the decoded, validated reply of a task of ``side`` (schema
        ``uplink[side]``), ``frozen`` the factors that task carried, decoded
        (:meth:`for_task`): each factored tensor's factor delta becomes the exact
        rank-``r`` product with the frozen factor (:func:`fedsync.factored.rebuild`); the
        other tensors pass through.
        """
        rebuilt: dict[str, SparseTensor] = {}
        for name, tensor in update.items():
            shape = self.shapes.get(name)
            if shape is None:
                rebuilt[name] = tensor
                continue
            delta = tensor.to_dense()
            rebuilt[name] = rebuild(delta, frozen[name].to(delta.device), shape, side)
        return rebuilt

    def describe(self) -> dict[str, object]:
        """For ``summary.json``: the factored form and what it cost."""
        factored = sum(s.m * s.n for s in self.shapes.values())
        return {
            "rank": self.rank,
            "schedule": self.schedule,
            "refactor_every": self.refactor_every,
            "factored_tensors": len(self.shapes),
            "factored_numel": factored,
            "factor_numel": {
                side: sum(s.factor(side).numel for s in self.shapes.values()) for side in SIDES
            },
            "splits": self.splits,
            "tasks": dict(self.tasks),
            "factor_bytes": self.factor_bytes,
        }
