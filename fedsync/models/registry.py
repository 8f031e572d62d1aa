"""The model registry: a name, a class count and an input shape give a model.

A name is a bundled model (:func:`model_names`) or the import path of the user's own
factory, ``"package.module:factory"`` (see :mod:`fedsync.plugins`), imported in the
calling process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedsync.data.registry import dataset_info
from fedsync.models.char_lstm import CharLSTM, small_char_lstm
from fedsync.models.char_transformer import CharTransformer, char_gpt_5m
from fedsync.models.cnn import LeNet5
from fedsync.models.logreg import LogisticRegression
from fedsync.models.mlp import MLP, wide_mlp
from fedsync.plugins import PluginError, is_import_path, load_callable

ModelFactory = Callable[..., nn.Module]
"""``factory(input_shape, num_classes, **kwargs) -> nn.Module``."""

AUTO = "auto"

_REGISTRY: dict[str, ModelFactory] = {
    "mlp": MLP,
    "mlp-wide": wide_mlp,
    "cnn": LeNet5,
    "char-lstm": CharLSTM,
    "char-lstm-small": small_char_lstm,
    "char-gpt": CharTransformer,
    "char-gpt-5m": char_gpt_5m,
    "logreg": LogisticRegression,
}


def model_names() -> tuple[str, ...]:
    """Every registered model name, sorted."""
    return tuple(sorted(_REGISTRY))


def default_model_for(dataset: str) -> str:
    """The model ``"auto"`` means for a dataset (mlp for digits, cnn for the 28x28
    image sets, char-lstm-small for shakespeare, char-gpt for shakespeare-lm, logreg
    for synthetic).

    Raises
    ------
    ValueError
        For an import-path dataset (``"package.module:loader"``): fedsync cannot know
        which model suits it, so the model must be named.
    """
    if is_import_path(dataset):
        raise ValueError(
            f"model 'auto' has no default for the import-path dataset {dataset!r}: name a "
            f"model ({', '.join(model_names())}, or 'package.module:factory')"
        )
    return dataset_info(dataset).default_model


def model_factory(name: str) -> ModelFactory:
    """The factory a model name stands for.

    Parameters
    ----------
    name : str
        A name from :func:`model_names` (``_`` and ``-`` alike), or the import path of
        a factory, ``"package.module:factory"``, called as
        ``factory(input_shape, num_classes, **kwargs)`` like the bundled ones.

    Raises
    ------
    ValueError
        Unknown name (the message lists the valid ones); for an import path a
        :class:`fedsync.plugins.PluginError` saying why it does not resolve (module
        not importable, no such attribute, not callable, or a signature that does not
        take ``(input_shape, num_classes)``).
    """
    if is_import_path(name):
        return load_callable(name, "model", "factory(input_shape, num_classes)", (1,), 2)
    factory = _REGISTRY.get(name.strip().lower().replace("_", "-"))
    if factory is None:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(model_names())} (or {AUTO!r})")
    return factory


def build_model(
    name: str,
    num_classes: int,
    input_shape: Sequence[int],
    *,
    dataset: str | None = None,
    seed: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a model by registry name or import path.

    Parameters
    ----------
    name : str
        A name from :func:`model_names` (``_`` and ``-`` alike), the import path of a
        factory (``"package.module:factory"``, see :func:`model_factory`), or
        ``"auto"`` with ``dataset`` given.
    num_classes : int
        Output logits.
    input_shape : sequence of int
        Shape of one sample, as :attr:`fedsync.data.DatasetSplits.input_shape`; the
        factory gets it as a tuple.
    dataset : str, optional
        Dataset name; needed for ``"auto"`` (a bundled dataset: an import-path dataset
        has no default model).
    seed : int, optional
        Initialise under this seed without touching the global RNG. Without it, the
        initialisation draws from the global RNG, so ``torch.manual_seed(s)`` before
        the call gives the same weights every time.
    **kwargs
        Model-specific settings (``hidden=(128,)`` for mlp, ``hidden_size=128`` for
        char-lstm, ...), passed to the factory.

    Raises
    ------
    ValueError
        Unknown name (the message lists the valid ones), an import path that does not
        resolve or whose factory returns no :class:`torch.nn.Module`
        (:class:`fedsync.plugins.PluginError`), ``"auto"`` without a bundled dataset,
        or sizes the model cannot take.
    """
    key = name.strip().lower().replace("_", "-")
    if key == AUTO:
        if dataset is None:
            raise ValueError(
                'model "auto" needs the dataset name: build_model("auto", ..., dataset=...)'
            )
        name = default_model_for(dataset)
    factory = model_factory(name)
    shape = tuple(int(d) for d in input_shape)
    if seed is None:
        model = factory(shape, int(num_classes), **kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory(shape, int(num_classes), **kwargs)
    if not isinstance(model, nn.Module):
        raise PluginError(
            f"model {name!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model
