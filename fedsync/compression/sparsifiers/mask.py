"""A fixed mask for pruned subnetworks: both sides know the positions, only values travel.

Two ways to share the mask:

* ``mask:<density>[,seed=<s>]`` derives it: for each tensor, ``round(density * numel)``
  positions drawn without replacement from a generator seeded by ``(seed, name)``
  (:func:`fedsync.kernels.sample.sorted_sample`: memory in proportion to the kept count).
  The decoder derives the same positions from the spec in the frame.
* ``mask:digest=<hex>`` names explicit masks (name -> bool tensor) that both sides
  were given (``UpdateCodec(..., masks=...)``); the digest (BLAKE2b of names, shapes
  and bits) proves they are the same masks. A tensor without a mask travels whole
  (``index_mode="dense"``).

Every tensor travels with ``index_mode="mask"`` (no positions in the frame).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Kept, Sparsifier, target_count
from fedsync.compression.config import BuildContext, SparsifierConfig, check_density
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import register
from fedsync.compression.seeding import rng_for
from fedsync.kernels.sample import sorted_sample
from fedsync.updates import IndexMode, TensorSpec

__all__ = ["FixedMask", "MaskConfig", "mask_digest"]


def mask_digest(masks: Mapping[str, torch.Tensor]) -> str:
    """16 hex digits identifying a set of masks (names, shapes and kept positions)."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(masks):
        mask = masks[name].detach().to("cpu")
        h.update(name.encode("utf-8") + b"\x00" + repr(tuple(mask.shape)).encode())
        h.update(np.packbits(mask.reshape(-1).numpy() != 0).tobytes())
    return h.hexdigest()


@register()
@dataclass(frozen=True)
class MaskConfig(SparsifierConfig):
    """``mask:<density>[,seed=<s>]`` or ``mask:digest=<hex>``.

    Parameters
    ----------
    density : float, optional
        Kept fraction of a derived mask, in (0, 1].
    seed : int
        Seed of a derived mask (shared by both sides, fixed across rounds).
    digest : str, optional
        :func:`mask_digest` of explicit masks; exclusive with ``density``. A config
        with neither is completed by the codec from the masks it is given.
    """

    name: ClassVar[str] = "mask"
    primary: ClassVar[str | None] = "density"
    density: float | None = None
    seed: int = 0
    digest: str | None = None

    def __post_init__(self) -> None:
        if self.density is not None:
            check_density("mask", self.density)
            if self.digest is not None:
                raise SpecError("mask: give a density (derived mask) or a digest, not both")
        if not isinstance(self.seed, int):
            raise SpecError(f"mask: seed must be an int, got {self.seed!r}")
        if self.digest is not None and (
            len(self.digest) != 16 or any(c not in "0123456789abcdef" for c in self.digest)
        ):
            raise SpecError(f"mask: digest must be 16 lowercase hex digits, got {self.digest!r}")

    def with_density(self, density: float) -> MaskConfig:
        if self.density is None:
            raise SpecError("mask: explicit masks have no density to override")
        return MaskConfig(density=density, seed=self.seed)

    def build(self, context: BuildContext) -> FixedMask:
        if self.density is not None:
            return FixedMask(self, None)
        if context.masks is None:
            raise SpecError(
                "mask: explicit masks (mask:digest=...) need the shared masks; "
                "pass masks= to the codec"
            )
        digest = mask_digest(context.masks)
        if self.digest is not None and self.digest != digest:
            raise SpecError(
                f"mask: the codec's masks have digest {digest}, the spec names {self.digest}"
            )
        return FixedMask(self, context.masks)


class FixedMask(Sparsifier):
    """Sends the values at fixed, shared positions."""

    config: MaskConfig

    def __init__(self, config: MaskConfig, masks: Mapping[str, torch.Tensor] | None) -> None:
        super().__init__(config)
        self._masks = masks
        self._cache: dict[tuple[str, int], np.ndarray] = {}
        self._device_cache: dict[tuple[str, int, str], torch.Tensor] = {}

    def index_mode(self, spec: TensorSpec) -> IndexMode:
        if self._masks is not None and spec.name not in self._masks:
            return "dense"
        return "mask"

    def mask_positions(self, spec: TensorSpec) -> np.ndarray:
        key = (spec.name, spec.numel)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if self._masks is None:
            assert self.config.density is not None
            k = target_count(spec.numel, self.config.density)
            # Memory in proportion to k, never to numel: a decoder derives these
            # from a frame's declared shape (see fedsync.kernels.sample).
            positions = sorted_sample(rng_for(self.config.seed, spec.name, "mask"), spec.numel, k)
        else:
            mask = self._masks[spec.name].detach().to("cpu").reshape(-1)
            if mask.numel() != spec.numel:
                raise ValueError(
                    f"mask for {spec.name!r} has {mask.numel()} entries, the tensor {spec.numel}"
                )
            positions = np.flatnonzero(mask.numpy() != 0).astype(np.int64)
        self._cache[key] = positions
        return positions

    def max_count(self, spec: TensorSpec) -> int:
        if self.index_mode(spec) == "dense":
            return spec.numel
        if self._masks is None:
            # Computed, not drawn: the decoder checks a frame's count against this
            # before it spends memory on the positions of a (maybe huge) tensor.
            assert self.config.density is not None
            return target_count(spec.numel, self.config.density)
        return int(self.mask_positions(spec).shape[0])

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        spec = TensorSpec(name, (x.numel(),))
        if self.index_mode(spec) == "dense":
            return Kept("dense", None, x)
        key = (name, x.numel(), str(x.device))
        positions = self._device_cache.get(key)
        if positions is None:
            positions = torch.from_numpy(self.mask_positions(spec)).to(x.device)
            self._device_cache[key] = positions
        return Kept("mask", positions, x[positions])
