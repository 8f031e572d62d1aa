"""Magnitude pruning of a model into a fixed subnetwork, and codec specs restricted to it.

A pruned run (run config ``prune-at-version``, ``prune-sparsity``) cuts the global model
once: every floating-point tensor with two or more dimensions (the convolution and
linear weights; biases and norms stay whole) keeps its ``round((1 - sparsity) * numel)``
largest-magnitude entries and the rest are set to zero. From then on both directions
send values at the kept positions only: :func:`masked_spec` swaps a codec spec's
sparsifier for ``mask:digest=<hex>`` (the explicit-mask stage of
:mod:`fedsync.compression.sparsifiers.mask`), keeping its quantizer and error feedback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

import torch

from fedsync.compression.sparsifiers.mask import MaskConfig, mask_digest
from fedsync.compression.spec import parse_spec

__all__ = ["apply_masks", "magnitude_masks", "mask_digest", "masked_spec", "prunable"]


def prunable(tensor: torch.Tensor) -> bool:
    """Whether pruning cuts ``tensor``: floating point, two or more dimensions."""
    return tensor.is_floating_point() and tensor.dim() >= 2


def magnitude_masks(state: Mapping[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """Per-tensor magnitude masks: True at the entries a pruned model keeps.

    Parameters
    ----------
    state : mapping of str to torch.Tensor
        The model (only :func:`prunable` tensors get a mask).
    sparsity : float
        Fraction of each tensor's entries set to zero, in (0, 1); at least one entry of
        every tensor is kept.

    Returns
    -------
    dict of str to torch.Tensor
        Name -> bool tensor of the tensor's shape. Ties in magnitude go to the lower
        index (a stable sort), so the same model always gives the same masks.
    """
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity must be in (0, 1), got {sparsity!r}")
    masks: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not prunable(tensor):
            continue
        flat = tensor.detach().to("cpu", torch.float32).reshape(-1)
        keep = max(1, math.floor((1.0 - sparsity) * flat.numel() + 0.5))
        order = torch.argsort(flat.abs(), descending=True, stable=True)
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[order[:keep]] = True
        masks[name] = mask.reshape(tensor.shape)
    return masks


def apply_masks(
    state: MutableMapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]
) -> None:
    """Zero the pruned entries of ``state``'s masked tensors, in place."""
    for name, mask in masks.items():
        tensor = state[name]
        tensor.mul_(mask.to(tensor.device, tensor.dtype))


def masked_spec(spec: str, digest: str) -> str:
    """``spec`` with its sparsifier replaced by the explicit masks ``digest`` names.

    ``"topk:0.1+uniform:8+ef"`` becomes ``"mask:digest=<digest>+uniform:8+ef"``: the
    quantizer and the error feedback stay, positions no longer travel.

    Raises
    ------
    SpecError
        If ``spec`` does not parse.
    """
    config = parse_spec(spec)
    return replace(config, sparsifier=MaskConfig(digest=digest)).to_spec()
