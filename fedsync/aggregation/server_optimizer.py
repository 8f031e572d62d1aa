"""Server optimizers: how an aggregated update moves the global model.

The buffer hands out ``Δ``, the weighted mean of the devices' model deltas (local model
minus start model) -- the negative of the pseudo-gradient. The server then steps:

* ``sgd`` (plain, FedAvg/FedBuff): ``x += η Δ``.
* ``momentum`` (FedAvgM, Hsu et al. 2019): ``v = β v + Δ``; ``x += η v``
  (Nesterov: ``x += η (Δ + β v)``).
* ``nesterov`` (DiLoCo's outer optimizer, Douillard et al. 2023): the momentum update
  with the Nesterov look-ahead; with ``Δ = -g`` it is PyTorch's ``SGD(nesterov=True)``
  on the pseudo-gradient ``g`` (DiLoCo: ``η = 0.7``, ``β = 0.9``).
* ``delayed-nesterov`` (Liu et al. 2024, asynchronous local SGD): the plain update
  ``x += η Δ / N`` at every aggregation, and once per ``N`` aggregations the velocity
  ``v = β v + mean(Δ over the N)`` and its look-ahead ``x += η β v``. Over ``N``
  aggregations the model moves as ``nesterov`` moves it on their mean, where naive
  Nesterov on stale asynchronous updates feeds each of them into the velocity: with
  ``N = 1`` the two are the same optimizer, bit for bit.
* ``adam`` (FedAdam, Reddi et al. 2021, Algorithm 2): ``m = β1 m + (1-β1) Δ``;
  ``v = β2 v + (1-β2) Δ²``; ``x += η m / (sqrt(v) + τ)``; the paper has no bias
  correction, and it is off by default here too.

Before the step, each tensor of ``Δ`` passes through the optimizer's update transform
(:mod:`fedsync.aggregation.update_transform`; ``none`` by default, ``sign`` for DeMo's
sign-of-update): the optimizer steps with ``Δ' = transform(Δ)`` in place of ``Δ``.

All step the model in place and keep their state in float32 tensors beside it, on its
device; :meth:`ServerOptimizer.state_dict` (CPU tensors) /
:meth:`ServerOptimizer.load_state_dict` (onto a given device) carry that state through a
checkpoint so a restarted run continues the same trajectory, on any device.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from fedsync.aggregation.update_transform import resolve_update_transform

__all__ = [
    "SERVER_OPTIMIZERS",
    "ServerAdam",
    "ServerDelayedNesterov",
    "ServerMomentum",
    "ServerOptimizer",
    "ServerSGD",
    "build_server_optimizer",
    "optimizer_from_hyperparameters",
]


def _check_finite_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")


def _check_unit_interval(name: str, value: float) -> None:
    if not (0.0 <= value < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {value}")


class ServerOptimizer(ABC):
    """Base class: one :meth:`step` per aggregation, state that survives checkpoints.

    Parameters
    ----------
    learning_rate : float
        The server learning rate ``η`` (``1.0`` with ``sgd`` applies the mean update
        as is), finite and ``> 0``.
    transform : str
        The update transform applied to each tensor of ``Δ`` before the step
        (:data:`~fedsync.aggregation.update_transform.UPDATE_TRANSFORMS`: ``none``,
        ``sign``).
    """

    kind: str = ""

    def __init__(self, *, learning_rate: float = 1.0, transform: str = "none") -> None:
        _check_finite_positive("server learning rate", learning_rate)
        self.learning_rate = float(learning_rate)
        self.transform = transform.strip().lower()
        self._transform = resolve_update_transform(self.transform)
        self.steps = 0

    @torch.no_grad()
    def step(self, params: dict[str, torch.Tensor], update: Mapping[str, torch.Tensor]) -> None:
        """Move ``params`` in place along the aggregated update ``Δ``.

        Parameters
        ----------
        params : dict of str to torch.Tensor
            The global model's floating-point tensors (changed in place).
        update : mapping of str to torch.Tensor
            ``Δ`` per tensor, same names and shapes as ``params``.

        Raises
        ------
        ValueError
            If names or shapes differ, or a parameter is not floating point.
        """
        if set(update) != set(params):
            raise ValueError(
                f"update tensors {sorted(set(update) ^ set(params))[:5]} do not match the model"
            )
        for name, param in params.items():
            delta = update[name]
            if tuple(delta.shape) != tuple(param.shape):
                raise ValueError(
                    f"tensor {name!r}: update shape {tuple(delta.shape)} != {tuple(param.shape)}"
                )
            if not param.is_floating_point():
                raise ValueError(f"tensor {name!r}: server optimizers need float tensors")
        self.steps += 1
        for name, param in params.items():
            delta = self._transform(update[name].to(param.device, torch.float32))
            direction = self._direction(name, delta)
            param.add_(direction.to(param.dtype), alpha=self.learning_rate)

    @abstractmethod
    def _direction(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        """The step direction for one tensor (before the learning rate); updates state."""

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state: kind, hyper-parameters, step count, per-tensor buffers."""
        return {
            "kind": self.kind,
            "learning_rate": self.learning_rate,
            "steps": self.steps,
            "buffers": {
                slot: {
                    name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()
                }
                for slot, tensors in self._buffers().items()
            },
        }

    def load_state_dict(
        self, state: Mapping[str, Any], *, device: str | torch.device | None = None
    ) -> None:
        """Restore what :meth:`state_dict` returned (hyper-parameters are kept as built).

        Parameters
        ----------
        state : mapping
            :meth:`state_dict` output (CPU tensors, as a checkpoint holds them).
        device : str or torch.device, optional
            Where the buffers go: the model's device, so the next step copies nothing
            (default: where ``state``'s tensors are).

        Raises
        ------
        ValueError
            If the state is of another optimizer kind or has unknown buffer slots.
        """
        if state.get("kind") != self.kind:
            raise ValueError(
                f"checkpoint holds a {state.get('kind')!r} optimizer state, this is {self.kind!r}"
            )
        buffers = state.get("buffers", {})
        own = self._buffers()
        unknown = set(buffers) - set(own)
        if unknown:
            raise ValueError(f"{self.kind} optimizer has no state slots {sorted(unknown)}")
        self.steps = int(state.get("steps", 0))
        for slot, tensors in buffers.items():
            own[slot].clear()
            own[slot].update(
                {
                    name: tensor.detach().to(device=device, dtype=torch.float32, copy=True)
                    for name, tensor in tensors.items()
                }
            )

    def _buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        """Named per-tensor state slots (none for plain SGD)."""
        return {}

    def hyperparameters(self) -> dict[str, Any]:
        """``kind`` and the keyword arguments that build this optimizer again
        (:func:`optimizer_from_hyperparameters`): what a relay downlink sends its devices
        so they step their copies of the model as the server does."""
        return {"kind": self.kind, "learning_rate": self.learning_rate, "transform": self.transform}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(learning_rate={self.learning_rate}, "
            f"transform={self.transform!r})"
        )


class ServerSGD(ServerOptimizer):
    """``x += η Δ`` (FedAvg / FedBuff / FedAsync)."""

    kind = "sgd"

    def _direction(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        return delta


class ServerMomentum(ServerOptimizer):
    """FedAvgM: ``v = β v + Δ``; ``x += η v`` (or ``η (Δ + β v)`` with Nesterov).

    Parameters
    ----------
    learning_rate : float
        ``η``, ``> 0``.
    momentum : float
        ``β``, in ``[0, 1)``.
    nesterov : bool
        Use the Nesterov look-ahead step.
    transform : str
        The update transform (see :class:`ServerOptimizer`).
    """

    kind = "momentum"

    def __init__(
        self,
        *,
        learning_rate: float = 1.0,
        momentum: float = 0.9,
        nesterov: bool = False,
        transform: str = "none",
    ) -> None:
        super().__init__(learning_rate=learning_rate, transform=transform)
        _check_unit_interval("server momentum", momentum)
        self.momentum = float(momentum)
        self.nesterov = nesterov
        # Its own kind: a checkpoint of one does not resume as the other.
        self.kind = "nesterov" if nesterov else "momentum"
        self._velocity: dict[str, torch.Tensor] = {}

    def _direction(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        velocity = self._velocity.get(name)
        if velocity is None:
            velocity = delta.clone()
        else:
            velocity = velocity.to(delta.device).mul_(self.momentum).add_(delta)
        self._velocity[name] = velocity
        if self.nesterov:
            return delta + self.momentum * velocity
        return velocity

    def _buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"velocity": self._velocity}

    def hyperparameters(self) -> dict[str, Any]:
        """The base's, with ``momentum`` and ``nesterov``."""
        return {**super().hyperparameters(), "momentum": self.momentum, "nesterov": self.nesterov}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(learning_rate={self.learning_rate}, "
            f"momentum={self.momentum}, nesterov={self.nesterov}, transform={self.transform!r})"
        )


class ServerDelayedNesterov(ServerOptimizer):
    """Delayed Nesterov: plain steps at every aggregation, momentum once per ``period``.

    At aggregation ``t`` (counted from 1) with update ``Δ_t``::

        p += Δ_t                                   (the pending sum)
        x += η Δ_t / N                             (every aggregation)
        if t % N == 0:  v = β v + p / N;  x += η β v;  p = 0

    so after each ``N`` aggregations the model stands where :class:`ServerMomentum` with
    ``nesterov=True`` puts it after one step on their mean (``x += η (Δ̄ + β v)``), and
    every device between those milestones still gets each update at once.

    Parameters
    ----------
    learning_rate : float
        ``η``, ``> 0``.
    momentum : float
        ``β``, in ``[0, 1)``.
    period : int
        ``N``, aggregations per velocity update, ``>= 1`` (the asynchronous strategies
        pick ``C / K`` for run-config ``server-momentum-period = 0``: a synchronous
        round's worth of updates).
    transform : str
        The update transform (see :class:`ServerOptimizer`).
    """

    kind = "delayed-nesterov"

    def __init__(
        self,
        *,
        learning_rate: float = 1.0,
        momentum: float = 0.9,
        period: int = 1,
        transform: str = "none",
    ) -> None:
        super().__init__(learning_rate=learning_rate, transform=transform)
        _check_unit_interval("server momentum", momentum)
        if isinstance(period, bool) or int(period) != period or period < 1:
            raise ValueError(f"delayed Nesterov's period must be an int >= 1, got {period!r}")
        self.momentum = float(momentum)
        self.period = int(period)
        self._velocity: dict[str, torch.Tensor] = {}
        self._pending: dict[str, torch.Tensor] = {}

    def _direction(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        pending = self._pending.get(name)
        pending = delta.clone() if pending is None else pending.to(delta.device).add_(delta)
        if self.steps % self.period:
            self._pending[name] = pending
            return delta / self.period if self.period > 1 else delta
        mean = pending / self.period if self.period > 1 else pending
        velocity = self._velocity.get(name)
        velocity = (
            mean if velocity is None else velocity.to(delta.device).mul_(self.momentum).add_(mean)
        )
        self._velocity[name] = velocity
        self._pending.pop(name, None)
        plain = delta / self.period if self.period > 1 else delta
        return plain + self.momentum * velocity

    def _buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"velocity": self._velocity, "pending": self._pending}

    def hyperparameters(self) -> dict[str, Any]:
        """The base's, with ``momentum`` and ``period``."""
        return {**super().hyperparameters(), "momentum": self.momentum, "period": self.period}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(learning_rate={self.learning_rate}, "
            f"momentum={self.momentum}, period={self.period}, transform={self.transform!r})"
        )


class ServerAdam(ServerOptimizer):
    """FedAdam: adaptive server steps from first and second moments of ``Δ``.

    Parameters
    ----------
    learning_rate : float
        ``η``, ``> 0`` (FedAdam papers use 1e-2 .. 1e-1).
    beta1, beta2 : float
        Moment decay rates, in ``[0, 1)``.
    tau : float
        Adaptivity floor added to ``sqrt(v)``, ``> 0``.
    bias_correction : bool
        Scale ``η`` by ``sqrt(1 - β2^t) / (1 - β1^t)`` as Adam does (the FedAdam paper
        does not).
    transform : str
        The update transform (see :class:`ServerOptimizer`).
    """

    kind = "adam"

    def __init__(
        self,
        *,
        learning_rate: float = 0.1,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        bias_correction: bool = False,
        transform: str = "none",
    ) -> None:
        super().__init__(learning_rate=learning_rate, transform=transform)
        _check_unit_interval("server beta1", beta1)
        _check_unit_interval("server beta2", beta2)
        _check_finite_positive("server tau", tau)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.tau = float(tau)
        self.bias_correction = bias_correction
        self._m: dict[str, torch.Tensor] = {}
        self._v: dict[str, torch.Tensor] = {}

    def _direction(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        m = self._m.get(name)
        v = self._v.get(name)
        m = torch.zeros_like(delta) if m is None else m.to(delta.device)
        v = torch.zeros_like(delta) if v is None else v.to(delta.device)
        m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)
        # Not addcmul_: CUDA fuses its multiply-add, the CPU does not (other bits).
        v.mul_(self.beta2).add_((delta * delta).mul_(1.0 - self.beta2))
        self._m[name], self._v[name] = m, v
        # torch's float32 sqrt on the CPU is not correctly rounded (0.7 % of values off by
        # an ulp, where an H100's were exact): float64's root rounded to float32 is the
        # correctly rounded float32 root, the same bits on every device.
        root = torch.sqrt(v.to(torch.float64)).to(torch.float32)
        direction = m / (root + self.tau)
        if self.bias_correction:
            t = self.steps
            direction = direction * (math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t))
        return direction

    def _buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"m": self._m, "v": self._v}

    def hyperparameters(self) -> dict[str, Any]:
        """The base's, with the moments' rates, ``tau`` and ``bias_correction``."""
        return {
            **super().hyperparameters(),
            "beta1": self.beta1,
            "beta2": self.beta2,
            "tau": self.tau,
            "bias_correction": self.bias_correction,
        }


SERVER_OPTIMIZERS: dict[str, type[ServerOptimizer]] = {
    "sgd": ServerSGD,
    "plain": ServerSGD,
    "momentum": ServerMomentum,
    "fedavgm": ServerMomentum,
    "nesterov": ServerMomentum,
    "delayed-nesterov": ServerDelayedNesterov,
    "adam": ServerAdam,
    "fedadam": ServerAdam,
}
"""Name (``server-optimizer`` run-config value) -> class."""


def optimizer_from_hyperparameters(values: Mapping[str, Any]) -> ServerOptimizer:
    """The optimizer :meth:`ServerOptimizer.hyperparameters` describes.

    Raises
    ------
    ValueError
        If the kind is unknown or an argument is not the optimizer's (or out of range).
    """
    arguments = dict(values)
    kind = arguments.pop("kind", None)
    cls = SERVER_OPTIMIZERS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(sorted(SERVER_OPTIMIZERS))
        raise ValueError(f"unknown server optimizer kind {kind!r}; known: {known}")
    try:
        optimizer = cls(**arguments)
    except TypeError as err:
        raise ValueError(f"{kind} optimizer: {err}") from None
    if optimizer.kind != kind:
        raise ValueError(f"the arguments build a {optimizer.kind} optimizer, not {kind}")
    return optimizer


def build_server_optimizer(
    name: str,
    *,
    learning_rate: float = 1.0,
    momentum: float = 0.9,
    period: int = 1,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
    transform: str = "none",
) -> ServerOptimizer:
    """Build a server optimizer by name, passing each only the arguments it takes.

    Every kind takes ``transform``, the update transform applied to ``Δ`` before the step;
    ``period`` is ``delayed-nesterov``'s ``N``.

    Raises
    ------
    ValueError
        If the name or the transform is unknown or a hyper-parameter is out of range.
    """
    key = name.strip().lower()
    cls = SERVER_OPTIMIZERS.get(key)
    if cls is None:
        raise ValueError(
            f"unknown server optimizer {name!r}; known: {', '.join(sorted(SERVER_OPTIMIZERS))}"
        )
    if cls is ServerMomentum:
        return ServerMomentum(
            learning_rate=learning_rate,
            momentum=momentum,
            nesterov=key == "nesterov",
            transform=transform,
        )
    if cls is ServerDelayedNesterov:
        return ServerDelayedNesterov(
            learning_rate=learning_rate, momentum=momentum, period=period, transform=transform
        )
    if cls is ServerAdam:
        return ServerAdam(
            learning_rate=learning_rate, beta1=beta1, beta2=beta2, tau=tau, transform=transform
        )
    return ServerSGD(learning_rate=learning_rate, transform=transform)
