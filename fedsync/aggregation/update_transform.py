"""Transforms of the aggregated update before the server optimizer steps with it.

The buffer hands out ``Δ``, the weighted mean of the decoded updates; a transform maps
each tensor of ``Δ`` to the ``Δ'`` the server optimizer sees (``x += η Δ'`` for ``sgd``).

* ``none``: ``Δ' = Δ`` (FedAvg, FedBuff, TEASQ-Fed).
* ``sign``: ``Δ' = sign(Δ)``, DeMo's receiver step: every coordinate moves by the server
  learning rate in the direction the devices agree on on average, however large their
  mean, and a coordinate no device moved (``Δ = 0``) stays put. Use it with a small
  ``server-learning-rate`` (the step of every moved coordinate is ``η``).

Run-config key ``server-update-transform``; a new transform is one entry in
:data:`UPDATE_TRANSFORMS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["UPDATE_TRANSFORMS", "UpdateTransform", "resolve_update_transform"]

UpdateTransform = Callable[[torch.Tensor], torch.Tensor]
"""One float32 tensor of ``Δ`` -> the tensor the server optimizer steps with."""


def _identity(delta: torch.Tensor) -> torch.Tensor:
    return delta


def _sign(delta: torch.Tensor) -> torch.Tensor:
    return torch.sign(delta)


UPDATE_TRANSFORMS: dict[str, UpdateTransform] = {
    "none": _identity,
    "sign": _sign,
}
"""Name (``server-update-transform`` run-config value) -> transform."""


def resolve_update_transform(name: str) -> UpdateTransform:
    """The transform registered under ``name`` (case and surrounding blanks ignored).

    Raises
    ------
    ValueError
        If no transform has that name.
    """
    transform = UPDATE_TRANSFORMS.get(name.strip().lower())
    if transform is None:
        raise ValueError(
            f"unknown server update transform {name!r}; known: "
            f"{', '.join(sorted(UPDATE_TRANSFORMS))}"
        )
    return transform
