"""SIDCo (Abdelmoniem et al., MLSys 2021): thresholds from fitted sparsity-inducing
distributions, in stages.

Instead of sorting or sampling, SIDCo models the magnitudes ``|x|`` with a
distribution whose parameters follow from two moments, and reads the threshold off its
tail: for a target ratio ``delta``,

* exponential: ``beta = mean``; ``eta = beta * ln(1 / delta)``;
* generalized Pareto (method of moments, location 0): with ``r = mean**2 / var``,
  ``xi = (1 - r) / 2``, ``alpha = mean * (1 + r) / 2``;
  ``eta = alpha / xi * (delta**-xi - 1)`` (the exponential's limit at ``xi = 0``);
* gamma: ``a = mean**2 / var``, ``b = var / mean``; ``eta = b * Q^-1(a, delta)``
  (``scipy.special.gammainccinv``).

A single fit is poor far in the tail, so SIDCo works in ``M`` stages of ratio
``delta**(1/M)`` each: stage 1 fits all magnitudes and keeps those above ``eta_1``;
stage ``m`` fits the exceedances ``|x| - eta_{m-1}`` of the survivors (peaks over
threshold, where the generalized Pareto is the natural model) and raises the
threshold. ``dist`` picks the models: ``exp`` (every stage exponential), ``gpd``
(every stage GPD) or ``gamma-gpd`` (gamma first, GPD after).

Stage 1's moments come from a sample (``sample``, default 1 %): the same stratified
cache-line sample DGC draws (:func:`fedsync.kernels.select.sample_positions`, seeded per call),
gathered as float32 magnitudes on the host and summed there in the fixed lane order
of :mod:`fedsync.kernels.ordered_sums` (1024 lanes). Every backend gathers the same values
and the host sums them the same way, so the threshold is bit-identical on every
device, and the cost is a gather of ``sample * numel`` values plus the one selection
pass, instead of a full fixed-order float64 pass over the tensor (at 10M values that
pass cost more than the selection itself). ``sample=1`` restores the full pass. Moments converge
fast (a 1 % sample of 10M is 100k values), and the count check below and the stage
adaptation absorb what error is left.

Adaptive stages (SIDCo's rule as we read the paper): after each call the achieved
count is compared with ``k``. More than ``(1 + tol) k`` means the fitted tail is too
light for the data (gradients are heavier-tailed than one fit assumes), so the next
call uses one more stage (up to ``max_stages``); fewer than ``(1 - tol) k`` means the
opposite and drops a stage (down to 1). The count per tensor is kept in
``Sparsifier.state`` (exported with the codec state).

Guards that are ours, not the paper's: with a sample, stage 1's threshold is first
checked on it, and a fit that the sample says keeps under a quarter or over four
times its target is replaced by the sample's own quantile (DGC's estimate, at no
extra pass), so a badly chosen family (e.g. ``exp`` on Gaussian data, whose tail it
overestimates) does not send almost nothing; a degenerate fit (zero variance,
non-finite threshold) or a count outside ``[k / 4, 4 k]`` falls back to exact top-k
for that call, which bounds the payload (the decoder accepts at most ``4 k`` values).
Tensors below 4096 entries also take exact top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from scipy.special import gammainccinv

from fedsync.compression.base import Kept, Sparsifier, target_count
from fedsync.compression.config import BuildContext, SparsifierConfig, check_density, check_range
from fedsync.compression.errors import NonFiniteInputError, SpecError
from fedsync.compression.registry import register
from fedsync.compression.sparsifiers.topk import exact_topk_kept
from fedsync.kernels.dispatch import KernelBackend, backend_for
from fedsync.kernels.ordered_sums import LANES2, ordered_abs_moments
from fedsync.updates import TensorSpec

__all__ = ["SIDCo", "SIDCoConfig", "fit_threshold"]

DISTRIBUTIONS = ("exp", "gpd", "gamma-gpd")
_EXACT_BELOW = 1 << 12
_OVERSHOOT = 4
_MIN_SAMPLE = 1 << 13
"""Fewest magnitudes stage 1 fits; a tensor under twice this is read in full."""


@register()
@dataclass(frozen=True)
class SIDCoConfig(SparsifierConfig):
    """``sidco:<density>[,dist=..][,stages=..][,max_stages=..][,tol=..][,sample=..]``.

    Parameters
    ----------
    density : float
        Target kept fraction, in (0, 1].
    dist : str
        Distribution family per stage (see module docstring).
    stages : int
        Stages a tensor starts with, 1 to ``max_stages``.
    max_stages : int
        Most stages the adaptation may reach, 1 to 8.
    tol : float
        Relative count error that adds (too many) or drops (too few) a stage, in (0, 1).
    sample : float
        Fraction of entries stage 1 fits its moments to, in (0, 1] (at least 8192
        entries; 1 reads every entry).
    """

    name: ClassVar[str] = "sidco"
    primary: ClassVar[str | None] = "density"
    density: float = 0.01
    dist: str = "exp"
    stages: int = 1
    max_stages: int = 4
    tol: float = 0.2
    sample: float = 0.01

    def __post_init__(self) -> None:
        check_density("sidco", self.density)
        check_range("sidco", "sample", self.sample, 0.0, 1.0, lo_open=True)
        if self.dist not in DISTRIBUTIONS:
            raise SpecError(
                f"sidco: dist must be one of {', '.join(DISTRIBUTIONS)}, got {self.dist!r}"
            )
        if not isinstance(self.max_stages, int) or not 1 <= self.max_stages <= 8:
            raise SpecError(f"sidco: max_stages must be an int in [1, 8], got {self.max_stages!r}")
        if not isinstance(self.stages, int) or not 1 <= self.stages <= self.max_stages:
            raise SpecError(
                f"sidco: stages must be an int in [1, max_stages={self.max_stages}], "
                f"got {self.stages!r}"
            )
        check_range("sidco", "tol", self.tol, 0.0, 1.0, lo_open=True, hi_open=True)

    def build(self, context: BuildContext) -> SIDCo:
        return SIDCo(self)


def fit_threshold(family: str, mean: float, var: float, delta: float) -> float | None:
    """Threshold with tail mass ``delta`` under ``family`` fitted to (mean, var).

    Returns ``None`` when the fit is degenerate (no spread, non-finite result).
    """
    if not (mean > 0 and math.isfinite(mean)) or not 0 < delta < 1:
        return None
    if family == "exp":
        eta = mean * math.log(1.0 / delta)
    else:
        if not (var > 0 and math.isfinite(var)):
            return None
        r = mean * mean / var
        if family == "gamma":
            eta = (var / mean) * float(gammainccinv(r, delta))
        else:  # generalized Pareto, method of moments
            xi = 0.5 * (1.0 - r)
            alpha = 0.5 * mean * (1.0 + r)
            if abs(xi) < 1e-9:
                eta = alpha * math.log(1.0 / delta)
            else:
                eta = alpha / xi * (delta**-xi - 1.0)
    return eta if math.isfinite(eta) and eta >= 0 else None


def _checked_on_sample(eta: float | None, sample: np.ndarray, delta: float) -> float | None:
    """Stage 1's threshold, or the sample's own ``delta`` quantile when the sample
    already shows that the fitted family misses the data by more than the overshoot
    factor (e.g. an exponential fit to Gaussian magnitudes keeps ~2 % of ``k``): the
    sample is at hand, so this costs no pass over the tensor, where finding out from
    the count would cost one, and an exact top-k another."""
    s = sample.shape[0]
    want = delta * s
    if eta is not None:
        hits = int(np.count_nonzero(sample > np.float32(eta)))
        if want / _OVERSHOOT <= hits <= _OVERSHOOT * want:
            return eta
    rank = max(1, min(s, round(want)))
    return float(np.partition(sample, s - rank)[s - rank])


class SIDCo(Sparsifier):
    """Multi-stage fitted thresholds with an adaptive number of stages."""

    config: SIDCoConfig

    def max_count(self, spec: TensorSpec) -> int:
        return _OVERSHOOT * target_count(spec.numel, self.config.density)

    def stages_for(self, name: str) -> int:
        """The current number of stages of tensor ``name``."""
        stored = self.state.get(f"stages/{name}")
        if stored is None:
            return self.config.stages
        return int(min(max(int(stored[0]), 1), self.config.max_stages))

    def _stage_one_moments(
        self, backend: KernelBackend, x: torch.Tensor, seed: int
    ) -> tuple[tuple[float, float], int, np.ndarray | None]:
        """``(sum |v|, sum v**2)`` over stage 1's magnitudes, their number, and the
        sample: a seeded sample of ``x`` summed on the host, or all of ``x`` (then no
        sample; see the module docstring)."""
        n = x.numel()
        s = min(n, max(math.ceil(self.config.sample * n), _MIN_SAMPLE))
        if self.config.sample >= 1.0 or 2 * s > n:
            return backend.abs_moments(x), n, None
        sample = backend.sample_abs(x, s, seed)
        return ordered_abs_moments(sample, lanes=LANES2), int(sample.shape[0]), sample

    def _family(self, stage: int) -> str:
        if self.config.dist == "gamma-gpd":
            return "gamma" if stage == 0 else "gpd"
        return self.config.dist

    def _adapt(self, name: str, stages: int, count: int, k: int) -> None:
        if count > (1 + self.config.tol) * k:
            stages = min(stages + 1, self.config.max_stages)
        elif count < (1 - self.config.tol) * k:
            stages = max(stages - 1, 1)
        self.state[f"stages/{name}"] = np.array([stages], dtype=np.int64)

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        n = x.numel()
        k = target_count(n, self.config.density)
        if n < _EXACT_BELOW or k == n:
            return exact_topk_kept(x, k)
        backend = backend_for(x)
        (sum_abs, sum_sq), m, sample = self._stage_one_moments(backend, x, seed)
        if not (math.isfinite(sum_abs) and math.isfinite(sum_sq)):
            raise NonFiniteInputError(f"tensor {name!r} holds NaN or Inf")
        stages = self.stages_for(name)
        delta = self.config.density ** (1.0 / stages)
        mean = sum_abs / m
        eta = fit_threshold(self._family(0), mean, max(sum_sq / m - mean * mean, 0.0), delta)
        if sample is not None:
            eta = _checked_on_sample(eta, sample, delta)
        if eta is None:
            return exact_topk_kept(x, k)
        # Stage 1 keeps ~delta * n survivors; allow generous slack before giving up.
        limit = _OVERSHOOT * k if stages == 1 else min(n, math.ceil(4 * delta * n) + 1024)
        sel = backend.threshold_select(x, eta, limit)
        count = sel.count
        if sel.indices is not None and sel.values is not None:
            indices, values = sel.indices, sel.values
            for stage in range(1, stages):
                excess = (values.abs() - eta).double()
                m = excess.numel()
                if m < 2:
                    break
                # Fixed-order sums (fedsync.kernels.ordered_sums): the same fit on every device.
                s1, s2 = backend.moments(excess)
                mean = s1 / m
                step = fit_threshold(
                    self._family(stage), mean, max(s2 - s1 * mean, 0.0) / (m - 1), delta
                )
                if step is None:
                    break
                eta += step
                keep = ~(values.abs() <= eta)
                indices, values = indices[keep], values[keep]
            count = indices.numel()
        self._adapt(name, stages, count, k)
        if sel.indices is None or not k / _OVERSHOOT <= count <= _OVERSHOOT * k:
            return exact_topk_kept(x, k)
        return Kept("explicit", indices, values)
