"""Local training and evaluation loops shared by the ClientApp and the ServerApp.

SGD (with momentum) or AdamW over in-memory arrays: the tensors are built once per call
from numpy and moved to the device once, and batches are drawn by indexing them with a seeded
permutation -- no ``DataLoader``, no worker processes, no per-batch host-to-device
copies. Thread counts are the caller's business (``torch.set_num_threads``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, TypedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedsync.data.types import ArrayDataset

CLIENT_OPTIMIZERS: Final = ("sgd", "adamw")
"""Local optimizers :func:`train` can use (the ``client-optimizer`` run-config values)."""

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
        The local optimizer, built fresh for the call (a task starts from fresh
        optimizer state).
    betas : tuple of float
        AdamW's moment decay rates.

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
    generator = torch.Generator().manual_seed(seed)

    loss_sum = torch.zeros((), device=device)  # summed on device: no sync per step
    seen = steps = 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n, batch_size):
            batch = order[start : start + batch_size]
            step_rule.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[batch]), y[batch])
            if anchor:
                (loss + _proximal(params, anchor, proximal_mu)).backward()
            else:
                loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(params, max_grad_norm)
            step_rule.step()
            loss_sum += loss.detach() * len(batch)
            seen += len(batch)
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        if max_steps is not None and steps >= max_steps:
            break
    return TrainResult(train_loss=float(loss_sum) / seen, num_examples=n, steps=steps)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ArrayDataset,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``dataset``.

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
            loss_sum += F.cross_entropy(logits, target, reduction="sum")
            correct += (logits.argmax(dim=1) == target).sum()
    finally:
        model.train(was_training)
    return EvalResult(loss=float(loss_sum) / n, accuracy=int(correct) / n, num_examples=n)


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
