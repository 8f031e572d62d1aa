"""Sampled-threshold top-k as in Deep Gradient Compression (Lin et al., 2018).

Exact top-k needs a selection over every entry; DGC estimates the threshold from a
small sample instead and keeps whatever lies above it:

1. draw ``s = sample * numel`` positions, stratified so the sample covers the tensor
   evenly (for a sparse sample, whole cache lines: see
   :func:`fedsync.kernels.select.sample_positions`), and take the threshold that keeps
   ``density * s`` of them; the sample is made large enough to expect >= 64 kept
   entries, below which the estimate is mostly noise;
2. one fused pass counts and compacts the entries above it;
3. if the count is outside ``[lower * k, upper * k]``, move the threshold (to the
   sample's order statistic at the rank the observed count implies, kept inside the
   bracket of thresholds already seen to be too low / too high) and retry, up to
   ``iters`` times;
4. if it is still out of bounds, fall back to exact top-k.

The count is therefore within the bounds, or exactly ``k``: the decoder's bound is
``floor(upper * k)``. Tensors too small for a meaningful sample use exact top-k.
DGC's momentum correction and momentum-factor masking live in error feedback
(``ef:momentum=0.9``), which wraps any sparsifier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Kept, Sparsifier, target_count
from fedsync.compression.config import BuildContext, SparsifierConfig, check_density, check_range
from fedsync.compression.errors import NonFiniteInputError, SpecError
from fedsync.compression.registry import register
from fedsync.compression.sparsifiers.topk import exact_topk_kept
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import TensorSpec

__all__ = ["DGC", "DGCConfig"]

_MIN_SAMPLE_HITS = 64
"""Expected kept entries in the sample; fewer makes the threshold estimate noise."""

_EXACT_BELOW = 1 << 13
"""Tensors smaller than this take exact top-k: cheap, and too small to sample."""


@register()
@dataclass(frozen=True)
class DGCConfig(SparsifierConfig):
    """``dgc:<density>[,sample=..][,lower=..][,upper=..][,iters=..]``.

    Parameters
    ----------
    density : float
        Target kept fraction, in (0, 1].
    sample : float
        Fraction of entries sampled for the threshold, in (0, 1].
    lower, upper : float
        Accepted count range as multiples of ``k``: ``0 < lower <= 1 <= upper``.
    iters : int
        Threshold adaptations before falling back to exact top-k, >= 0.
    """

    name: ClassVar[str] = "dgc"
    primary: ClassVar[str | None] = "density"
    density: float = 0.001
    sample: float = 0.01
    lower: float = 0.8
    upper: float = 1.25
    iters: int = 3

    def __post_init__(self) -> None:
        check_density("dgc", self.density)
        check_range("dgc", "sample", self.sample, 0.0, 1.0, lo_open=True)
        check_range("dgc", "lower", self.lower, 0.0, 1.0, lo_open=True)
        check_range("dgc", "upper", self.upper, 1.0, 1e6)
        if not isinstance(self.iters, int) or not 0 <= self.iters <= 64:
            raise SpecError(f"dgc: iters must be an int in [0, 64], got {self.iters!r}")

    def build(self, context: BuildContext) -> DGC:
        return DGC(self)


class DGC(Sparsifier):
    """Sampled-threshold top-k with bounded adaptation and an exact fallback."""

    config: DGCConfig

    def bounds(self, k: int) -> tuple[int, int]:
        """Accepted count range for a target of ``k``."""
        lo = max(1, math.ceil(self.config.lower * k))
        return lo, max(lo, k, math.floor(self.config.upper * k))

    def max_count(self, spec: TensorSpec) -> int:
        return self.bounds(target_count(spec.numel, self.config.density))[1]

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        cfg = self.config
        n = x.numel()
        k = target_count(n, cfg.density)
        s = min(n, max(math.ceil(cfg.sample * n), math.ceil(_MIN_SAMPLE_HITS / cfg.density)))
        if n < _EXACT_BELOW or 2 * s > n:
            return exact_topk_kept(x, k)
        backend = backend_for(x)
        sample = backend.sample_abs(x, s, seed)
        if not np.isfinite(sample).all():
            raise NonFiniteInputError(f"tensor {name!r} holds NaN or Inf")
        s = sample.shape[0]  # rounded to whole cache lines for a sparse sample
        k_s = max(1, min(s, round(cfg.density * s)))

        def order_stat(rank: int) -> float:
            """The sample's ``rank``-th largest magnitude (1-based)."""
            rank = max(1, min(s, rank))
            return float(np.partition(sample, s - rank)[s - rank])

        lo_k, hi_k = self.bounds(k)
        too_low, too_high = -math.inf, math.inf  # thresholds known to keep too many / few
        t = order_stat(k_s)
        for attempt in range(cfg.iters + 1):
            sel = backend.threshold_select(x, t, hi_k)
            if lo_k <= sel.count <= hi_k and sel.indices is not None:
                assert sel.values is not None
                return Kept("explicit", sel.indices, sel.values)
            if attempt == cfg.iters:
                break
            if sel.count > hi_k:
                too_low = max(too_low, t)
            else:
                too_high = min(too_high, t)
            # The observed count says how far off the sample's rank was: rescale it.
            nxt = order_stat(round(k_s * k / max(sel.count, 1)))
            if not too_low < nxt < too_high:
                if math.isfinite(too_low) and math.isfinite(too_high):
                    nxt = 0.5 * (too_low + too_high)
                elif math.isfinite(too_high):  # only "too few" seen: go lower
                    nxt = too_high / 2 if too_high > 0 else -1.0
                else:  # only "too many" seen: go higher
                    nxt = too_low * 2 if too_low > 0 else float(sample.max())
            t = nxt
        return exact_topk_kept(x, k)
