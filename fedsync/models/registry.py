"""The model registry: a name, a class count and an input shape give a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedsync.data.registry import dataset_info
from fedsync.models.char_lstm import CharLSTM, small_char_lstm
from fedsync.models.cnn import LeNet5
from fedsync.models.logreg import LogisticRegression
from fedsync.models.mlp import MLP, wide_mlp

ModelFactory = Callable[..., nn.Module]
"""``factory(input_shape, num_classes, **kwargs) -> nn.Module``."""

AUTO = "auto"

_REGISTRY: dict[str, ModelFactory] = {
    "mlp": MLP,
    "mlp-wide": wide_mlp,
    "cnn": LeNet5,
    "char-lstm": CharLSTM,
    "char-lstm-small": small_char_lstm,
    "logreg": LogisticRegression,
}


def model_names() -> tuple[str, ...]:
    """Every registered model name, sorted."""
    return tuple(sorted(_REGISTRY))


def default_model_for(dataset: str) -> str:
    """The model ``"auto"`` means for a dataset (mlp for digits, cnn for the 28x28
    image sets, char-lstm-small for shakespeare, logreg for synthetic)."""
    return dataset_info(dataset).default_model


def build_model(
    name: str,
    num_classes: int,
    input_shape: Sequence[int],
    *,
    dataset: str | None = None,
    seed: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a model by registry name.

    Parameters
    ----------
    name : str
        A name from :func:`model_names` (``_`` and ``-`` alike), or ``"auto"`` with
        ``dataset`` given.
    num_classes : int
        Output logits.
    input_shape : sequence of int
        Shape of one sample, as :attr:`fedsync.data.DatasetSplits.input_shape`.
    dataset : str, optional
        Dataset name; needed for ``"auto"``.
    seed : int, optional
        Initialise under this seed without touching the global RNG. Without it, the
        initialisation draws from the global RNG, so ``torch.manual_seed(s)`` before
        the call gives the same weights every time.
    **kwargs
        Model-specific settings (``hidden=(128,)`` for mlp, ``hidden_size=128`` for
        char-lstm, ...).

    Raises
    ------
    ValueError
        Unknown name (the message lists the valid ones), ``"auto"`` without a dataset,
        or sizes the model cannot take.
    """
    key = name.strip().lower().replace("_", "-")
    if key == AUTO:
        if dataset is None:
            raise ValueError(
                'model "auto" needs the dataset name: build_model("auto", ..., dataset=...)'
            )
        key = default_model_for(dataset)
    factory = _REGISTRY.get(key)
    if factory is None:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(model_names())} (or {AUTO!r})")
    shape = tuple(int(d) for d in input_shape)
    if seed is None:
        return factory(shape, int(num_classes), **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(shape, int(num_classes), **kwargs)
