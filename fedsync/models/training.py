"""Local training and evaluation loops shared by the ClientApp and the ServerApp.

SGD (with momentum) or AdamW over in-memory arrays: the tensors are built once per call
from numpy and moved to the device once, and batches are drawn by indexing them with a seeded
permutation -- no ``DataLoader``, no worker processes, no per-batch host-to-device
copies. Thread counts are the caller's business (``torch.set_num_threads``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedsync.data.types import ArrayDataset

CLIENT_OPTIMIZERS: Final = ("sgd", "adamw")
"""Local optimizers :func:`train` can use (the ``client-optimizer`` run-config values)."""
OPTIMIZER_STATE_MODES: Final = ("reset", "keep")
"""Whether a device's optimizer state carries over between tasks (``client-optimizer-state``):
a fresh optimizer per task, or an :class:`InnerOptimizer` kept on the device."""
LOCAL_STEPS_POLICIES: Final = ("fixed", "speed")
"""How a task's step budget is set (``local-steps-policy``): ``local-steps`` for every
task, or scaled to the device's measured speed (:mod:`fedsync.aggregation.local_steps`)."""
SCHEDULE_CLOCKS: Final = ("run", "device")
"""Whose steps a :class:`LearningRateSchedule` counts (``client-schedule-clock``): the
run's progress each task carries (:mod:`fedsync.aggregation.schedule_clock`), or the
device's own (:attr:`InnerOptimizer.steps`)."""

GlobalParams = Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
"""The reference point of the proximal term: tensors in ``model.parameters()`` order,
or a mapping from parameter name (as in ``named_parameters``/``state_dict``)."""


class TrainResult(TypedDict):
    """What :func:`train` reports."""

    train_loss: float
    """Mean cross-entropy over the examples seen (without the proximal term)."""
    num_examples: int
    """Size of the local training set (the FedAvg weight)."""
    steps: int
    """Optimizer steps taken."""


@dataclass
class InnerOptimizer:
    """What a device's local optimizer carries from one task to the next.

    DiLoCo and its successors keep each worker's inner AdamW (moments and step count)
    across outer rounds; a fresh optimizer per task restarts AdamW's bias correction
    and forgets the moments every H steps. :func:`train` starts from :attr:`state` when
    it is set, and writes the optimizer's state and the steps it took back.

    Attributes
    ----------
    state : dict or None
        The optimizer's per-parameter state (``optimizer.state_dict()["state"]``:
        parameter index -> ``{"step", "exp_avg", "exp_avg_sq"}`` for AdamW,
        ``{"momentum_buffer"}`` for SGD), or ``None`` for a fresh optimizer.
    steps : int
        Optimizer steps this device has taken in the run: where the learning-rate
        schedule stands (counted even when the moments are not kept).
    """

    state: dict[int, dict[str, torch.Tensor]] | None = None
    steps: int = 0

    def load_into(self, optimizer: torch.optim.Optimizer) -> bool:
        """Start ``optimizer`` (your own training loop's) from :attr:`state`.

        Returns whether there was a state to load. Raises ``ValueError`` when it does
        not fit the optimizer's parameters (another model).
        """
        if self.state is None:
            return False
        self.check_fits([p for group in optimizer.param_groups for p in group["params"]])
        saved = optimizer.state_dict()
        saved["state"] = self.state
        optimizer.load_state_dict(saved)  # casts to each parameter's device and dtype
        return True

    def save_from(self, optimizer: torch.optim.Optimizer, steps: int) -> None:
        """Keep ``optimizer``'s state after it took ``steps`` more steps."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.state = {
            int(index): {name: _detached(value) for name, value in entries.items()}
            for index, entries in optimizer.state_dict()["state"].items()
        }
        self.steps += steps

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Host arrays of this optimizer, for a node's store: ``"steps"`` and one
        ``"<parameter index>/<name>"`` per state entry (float32 for a float tensor that
        is not float64: numpy has no bfloat16, and loading casts back)."""
        arrays = {"steps": np.asarray([self.steps], dtype=np.int64)}
        for index, entries in (self.state or {}).items():
            for name, value in entries.items():
                held = value.detach().to("cpu")
                if held.is_floating_point() and held.dtype != torch.float64:
                    held = held.float()
                arrays[f"{index}/{name}"] = held.numpy().copy()
        return arrays

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray] | None, *, keep_moments: bool = True
    ) -> InnerOptimizer:
        """The optimizer :meth:`to_arrays` gave (``None``: none was kept, a fresh one);
        ``keep_moments=False``: the step count only (a schedule across tasks, fresh
        moments)."""
        if arrays is None:
            return cls()
        steps = int(np.asarray(arrays.get("steps", [0])).reshape(-1)[0])
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, array in arrays.items():
            if key == "steps":
                continue
            index, _, name = key.partition("/")
            state.setdefault(int(index), {})[name] = torch.from_numpy(np.array(array))
        return cls(state if keep_moments and state else None, steps)

    def check_fits(self, params: Sequence[torch.Tensor]) -> None:
        """Raise ``ValueError`` unless :attr:`state` holds tensors of ``params``' shapes."""
        if self.state is None:
            return
        unknown = sorted(set(self.state) - set(range(len(params))))
        if unknown:
            raise ValueError(
                f"inner optimizer state names parameters {unknown[:5]}; the model has {len(params)}"
            )
        for index, entries in self.state.items():
            for name, value in entries.items():
                if value.dim() > 0 and tuple(value.shape) != tuple(params[index].shape):
                    raise ValueError(
                        f"inner optimizer state {index}/{name} has shape "
                        f"{tuple(value.shape)}, parameter {index} {tuple(params[index].shape)}"
                    )


@dataclass(frozen=True)
class LearningRateSchedule:
    """Linear warm-up, then a cosine decay to ``floor`` times the learning rate.

    The position is the run's progress a task carries (its ``schedule_step``: every
    device of an asynchronous fleet then decays together) or the device's own step count
    (:attr:`InnerOptimizer.steps`), so the schedule runs across tasks; without warm-up
    and decay the rate is constant.

    Parameters
    ----------
    warmup_steps : int
        Steps over which the rate rises linearly from ``lr / warmup_steps`` to ``lr``.
    decay_steps : int
        Steps (counted from the start, warm-up included) over which it then follows a
        half cosine down to ``floor * lr``, and stays there (0: no decay).
    floor : float
        The final fraction of the rate, in ``[0, 1]``.
    """

    warmup_steps: int = 0
    decay_steps: int = 0
    floor: float = 0.1

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(
                f"schedule steps must be >= 0, got warm-up {self.warmup_steps}, decay "
                f"{self.decay_steps}"
            )
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"the decay ({self.decay_steps} steps) must end after the warm-up "
                f"({self.warmup_steps} steps)"
            )
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError(f"schedule floor must be in [0, 1], got {self.floor}")

    def factor(self, step: int) -> float:
        """The multiple of the learning rate at ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if not self.decay_steps:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class EvalResult(TypedDict):
    """What :func:`evaluate` reports."""

    loss: float
    accuracy: float
    num_examples: int


def as_tensors(
    dataset: ArrayDataset, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` as tensors on ``device``: float32 features, or int64 token ids.

    The arrays are copied (``torch.tensor``), so read-only cached arrays are fine and
    training can never write into the shared cache.
    """
    x_dtype = torch.long if np.issubdtype(dataset.x.dtype, np.integer) else torch.float32
    x = torch.tensor(dataset.x, dtype=x_dtype, device=device)
    y = torch.tensor(dataset.y, dtype=torch.long, device=device)
    return x, y


def train(
    model: nn.Module,
    dataset: ArrayDataset,
    *,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.05,
    momentum: float = 0.0,
    device: torch.device | str = "cpu",
    proximal_mu: float = 0.0,
    global_params: GlobalParams | None = None,
    max_steps: int | None = None,
    seed: int = 0,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    optimizer: str = "sgd",
    betas: tuple[float, float] = (0.9, 0.999),
    inner: InnerOptimizer | None = None,
    schedule: LearningRateSchedule | None = None,
    schedule_step: int | None = None,
) -> TrainResult:
    """Train ``model`` in place with mini-batch SGD or AdamW on cross-entropy.

    Parameters
    ----------
    model : torch.nn.Module
        Moved to ``device`` and left there, in training mode.
    dataset : ArrayDataset
        Local training data.
    epochs : int
        Passes over the data (stopped early by ``max_steps``).
    batch_size : int
        Samples per step; the last batch of an epoch may be smaller.
    lr, momentum, weight_decay : float
        Learning rate, SGD momentum (ignored by AdamW) and weight decay (SGD: L2 added
        to the gradient; AdamW: decoupled, ``w -= lr * weight_decay * w``).
    device : torch.device or str
        Where to train.
    proximal_mu : float
        FedProx: adds ``mu / 2 * ||w - w_global||^2`` to the loss when > 0.
    global_params : sequence or mapping of torch.Tensor, optional
        ``w_global``; defaults to the model's parameters at the start of the call
        (i.e. the global model the client was just given).
    max_steps : int, optional
        Stop after this many steps in total (a compute budget for slow devices).
    seed : int
        Seeds the batch order, so the same call gives the same model.
    max_grad_norm : float, optional
        Clip the gradient norm (useful for the LSTM).
    optimizer : {"sgd", "adamw"}
        The local optimizer, built for the call: fresh, or from ``inner``'s state.
    betas : tuple of float
        AdamW's moment decay rates.
    inner : InnerOptimizer, optional
        The device's optimizer memory: the optimizer starts from its ``state`` (when
        set) and the schedule from its ``steps``; on return both are updated (the
        state stays on ``device``). ``None``: a fresh optimizer, the schedule at step 0.
    schedule : LearningRateSchedule, optional
        Warm-up and cosine decay of ``lr`` over the device's steps (``None``: constant).
    schedule_step : int, optional
        Where the schedule stands at this call's first step: the run's position a task
        carries (:attr:`fedsync.clientapp.Task.schedule_step`). ``None``: the device's
        own count, ``inner.steps`` (0 without ``inner``).

    Returns
    -------
    TrainResult
        ``train_loss``, ``num_examples`` (``len(dataset)``) and ``steps``.
    """
    _check_positive(epochs=epochs, batch_size=batch_size)
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0, got {max_steps}")
    if proximal_mu < 0:
        raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
    if schedule_step is not None and schedule_step < 0:
        raise ValueError(f"schedule_step must be >= 0, got {schedule_step}")
    if optimizer not in CLIENT_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {CLIENT_OPTIMIZERS}, got {optimizer!r}")
    model.to(device)
    model.train()
    n = len(dataset)
    if n == 0 or max_steps == 0:
        return TrainResult(train_loss=0.0, num_examples=n, steps=0)

    x, y = as_tensors(dataset, device)
    params = [p for p in model.parameters() if p.requires_grad]
    anchor = _anchor(model, params, global_params) if proximal_mu > 0 else []
    step_rule = _optimizer(optimizer, params, lr, momentum, weight_decay, betas)
    if inner is not None:
        inner.load_into(step_rule)
    if schedule_step is not None:
        first_step = schedule_step
    else:
        first_step = inner.steps if inner is not None else 0
    generator = torch.Generator().manual_seed(seed)
    # The model's own randomness (dropout) draws from torch's global generators: seeded
    # here for the call and restored after, so a task repeats whatever its process ran
    # before (a Ray actor, a warm executor).
    with _seeded_global_rng(seed, torch.device(device)):
        loss_sum = torch.zeros((), device=device)  # summed on device: no sync per step
        seen = steps = 0
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(device)
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]
                step_rule.zero_grad(set_to_none=True)
                loss = _cross_entropy(model(x[batch]), y[batch])
                if anchor:
                    (loss + _proximal(params, anchor, proximal_mu)).backward()
                else:
                    loss.backward()
                if max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(params, max_grad_norm)
                if schedule is not None:
                    for group in step_rule.param_groups:
                        group["lr"] = lr * schedule.factor(first_step + steps)
                step_rule.step()
                loss_sum += loss.detach() * len(batch)
                seen += len(batch)
                steps += 1
                if max_steps is not None and steps >= max_steps:
                    break
            if max_steps is not None and steps >= max_steps:
                break
    if inner is not None:
        inner.save_from(step_rule, steps)
    return TrainResult(train_loss=float(loss_sum) / seen, num_examples=n, steps=steps)


@contextlib.contextmanager
def _seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's global CPU generator (and ``device``'s, on CUDA) with ``seed`` for the
    block; their previous states come back after it."""
    cuda = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if (device.type == "cuda")
        else []
    )
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def _detached(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.tensor(value)  # a plain number (an optimizer's float step)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ArrayDataset,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``dataset``, per target: per
    sample, or per position for sequence targets (``y`` of shape ``(N, T)``).

    The model is moved to ``device``; its train/eval mode is restored afterwards. An
    empty dataset gives zeros and ``num_examples = 0`` (so it weighs nothing in a
    weighted average, rather than spreading NaN).
    """
    _check_positive(batch_size=batch_size)
    n = len(dataset)
    if n == 0:
        return EvalResult(loss=0.0, accuracy=0.0, num_examples=0)
    was_training = model.training
    model.to(device)
    model.eval()
    try:
        x, y = as_tensors(dataset, device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        for start in range(0, n, batch_size):
            logits = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            loss_sum += _cross_entropy(logits, target, reduction="sum")
            correct += (logits.argmax(dim=-1) == target).sum()
    finally:
        model.train(was_training)
    targets = y.numel()  # one per sample, or one per position of a sequence
    return EvalResult(
        loss=float(loss_sum) / targets, accuracy=int(correct) / targets, num_examples=n
    )


def _cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of ``(batch, classes)`` logits, or of ``(batch, length, classes)``
    logits against a target per position (a language model), over every target."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction=reduction)
    return F.cross_entropy(logits, target, reduction=reduction)


def _optimizer(
    name: str,
    params: Sequence[torch.Tensor],
    lr: float,
    momentum: float,
    weight_decay: float,
    betas: tuple[float, float],
) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def _anchor(
    model: nn.Module, params: Sequence[torch.Tensor], global_params: GlobalParams | None
) -> list[torch.Tensor]:
    """The proximal term's reference tensors, aligned with ``params``, on their device."""
    if global_params is None:
        return [p.detach().clone() for p in params]
    if isinstance(global_params, Mapping):
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        missing = [name for name in names if name not in global_params]
        if missing:
            raise ValueError(f"global_params lacks parameters {missing[:5]}")
        tensors = [global_params[name] for name in names]
    else:
        tensors = list(global_params)
    if len(tensors) != len(params):
        raise ValueError(f"global_params has {len(tensors)} tensors, the model {len(params)}")
    anchor = []
    for p, g in zip(params, tensors, strict=True):
        if g.shape != p.shape:
            raise ValueError(f"global_params shape {tuple(g.shape)} != parameter {tuple(p.shape)}")
        anchor.append(g.detach().to(device=p.device, dtype=p.dtype))
    return anchor


def _proximal(
    params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    squares = [((p - g) ** 2).sum() for p, g in zip(params, anchor, strict=True)]
    return (mu / 2) * torch.stack(squares).sum()


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
