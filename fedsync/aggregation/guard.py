"""The server's last check on an update: is its size absurd?

A frame can decode cleanly, fit the model and hold only finite numbers, and still be
hostile or broken: a node that scales its update by 10^5 (poisoning, a diverged local
run, a unit bug) would move the global model wherever it likes. Decoding cannot catch
that; a size check can. :class:`UpdateNormGuard` rejects an update whose L2 norm

* exceeds ``max-update-norm`` (an absolute cap; 0: off), or
* exceeds ``norm-outlier-factor`` times the median norm of the last accepted updates
  (a robust, self-calibrating cap: the median ignores a few outliers, and the window
  follows norms as they shrink during training; 0: off). It waits for a few accepted
  updates before it judges, so the first replies are checked by the absolute cap only.

Only accepted updates enter the history, so rejected ones cannot drag the median up.
The history is not checkpointed: after a resume it refills within a few updates.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from fedsync.updates import LowRankTensor, SparseTensor

if TYPE_CHECKING:
    from fedsync.config import GuardSection

__all__ = ["MAX_UPDATE_NORM", "NORM_OUTLIER_FACTOR", "UpdateNormGuard", "update_norm"]

MAX_UPDATE_NORM: Final = "max-update-norm"
"""Run-config key: absolute L2 cap on an update (0: off)."""
NORM_OUTLIER_FACTOR: Final = "norm-outlier-factor"
"""Run-config key: reject above this multiple of the median accepted norm (0: off)."""
DEFAULT_OUTLIER_FACTOR: Final = 100.0
"""Far above honest spread (partitions of very different sizes, stale starts) and far
below what a scaled or diverged update reaches."""


def update_norm(update: Mapping[str, SparseTensor]) -> float:
    """The L2 norm of a sparse update over all its tensors (float64 sum of squares)."""
    total = 0.0
    for tensor in update.values():
        if isinstance(tensor, LowRankTensor):  # ||P Q^T||^2 = sum((P^T P) * (Q^T Q))
            p, q = tensor.p.double(), tensor.q.double()
            total += float(((p.T @ p) * (q.T @ q)).sum())
            continue
        values = tensor.values.double()
        total += float((values * values).sum())
    return math.sqrt(total)


class UpdateNormGuard:
    """Rejects updates whose L2 norm is absurd (see the module docstring).

    Parameters
    ----------
    max_norm : float
        Absolute cap, >= 0 (0: off).
    outlier_factor : float
        Cap as a multiple of the median accepted norm, 0 (off) or > 1.
    window : int
        Accepted norms the median is taken over.
    min_history : int
        Accepted norms needed before the relative cap applies.
    """

    def __init__(
        self,
        *,
        max_norm: float = 0.0,
        outlier_factor: float = DEFAULT_OUTLIER_FACTOR,
        window: int = 64,
        min_history: int = 5,
    ) -> None:
        if not (math.isfinite(max_norm) and max_norm >= 0.0):
            raise ValueError(f"run config '{MAX_UPDATE_NORM}' must be >= 0, got {max_norm}")
        if not (math.isfinite(outlier_factor) and (outlier_factor == 0.0 or outlier_factor > 1.0)):
            raise ValueError(
                f"run config '{NORM_OUTLIER_FACTOR}' must be 0 (off) or > 1, got {outlier_factor}"
            )
        if window < 1 or min_history < 1:
            raise ValueError(f"window and min_history must be >= 1, got {window}, {min_history}")
        self.max_norm = float(max_norm)
        self.outlier_factor = float(outlier_factor)
        self.min_history = min_history
        self._accepted: deque[float] = deque(maxlen=window)
        self.rejected = 0
        self.largest_accepted = 0.0

    @classmethod
    def from_section(cls, section: GuardSection) -> UpdateNormGuard:
        """The guard the run config's ``max-update-norm`` / ``norm-outlier-factor`` ask for."""
        return cls(max_norm=section.max_update_norm, outlier_factor=section.norm_outlier_factor)

    def check(self, norm: float) -> str:
        """``""`` if an update of this norm may be aggregated, else why not."""
        why = ""
        if not math.isfinite(norm):
            why = f"update norm is {norm}"
        elif self.max_norm and norm > self.max_norm:
            why = f"update norm {norm:.4g} > {MAX_UPDATE_NORM} {self.max_norm:.4g}"
        elif self.outlier_factor and len(self._accepted) >= self.min_history:
            median = statistics.median(self._accepted)
            if norm > self.outlier_factor * median:
                why = (
                    f"update norm {norm:.4g} > {self.outlier_factor:g} x median {median:.4g} "
                    f"of the last {len(self._accepted)} accepted"
                )
        if why:
            self.rejected += 1
        return why

    def accept(self, norm: float) -> None:
        """Record the norm of an update that went into the buffer."""
        self._accepted.append(norm)
        self.largest_accepted = max(self.largest_accepted, norm)

    def summary(self) -> dict[str, Any]:
        """Settings and what the guard saw, for ``summary.json``."""
        return {
            "max_update_norm": self.max_norm,
            "norm_outlier_factor": self.outlier_factor,
            "rejected": self.rejected,
            "median_recent_norm": (statistics.median(self._accepted) if self._accepted else None),
            "largest_accepted_norm": self.largest_accepted,
        }
