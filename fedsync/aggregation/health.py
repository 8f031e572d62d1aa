"""Whether a run is learning: the divergence and no-learning checks on central evaluations.

A run that trains nothing must not end like one that trained: :class:`TrainingHealth`
reads the central evaluations as they come (every strategy records them in
:class:`~fedsync.aggregation.tally.RunTally`) and says when

* the test loss is not finite (``nan``/``inf``): the model is lost;
* the test loss has risen above both 1.5x its value at the first evaluation (the
  initial model) and the loss of a uniform guess (``ln C`` for ``C`` classes), in the
  last two evaluations: worse than guessing, and not a passing spike;
* the accuracy has stayed at chance for the last three evaluations after the initial
  one: within two standard errors of what always answering the test set's most
  frequent class scores (and at least 0.02 above it).

The reference values come with the evaluations:
:class:`fedsync.serverapp.evaluation.CentralEvaluator`
adds ``chance_accuracy`` (the most frequent class's share of the test set) and
``chance_loss`` (``ln C``) to its metrics; an evaluation function of the user's that
does not is checked for non-finite loss and for the rise against its first evaluation
only. A run whose health is not ``ok`` at its end makes ``fedsync run`` and ``fedsync
compare`` exit non-zero (``--allow-divergence`` keeps the old behaviour).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DIVERGED_EXIT", "HealthStatus", "HealthVerdict", "TrainingHealth", "health_problem"]

HealthStatus = Literal["ok", "diverged", "stuck"]

LOSS_RISE = 1.5
"""Loss above this multiple of the first evaluation's (and above ``ln C``): diverging."""
RISE_EVALUATIONS = 2
"""Consecutive evaluations the loss must stay that high."""
STUCK_EVALUATIONS = 3
"""Evaluations after the initial one that must all sit at chance."""
CHANCE_MARGIN = 0.02
"""Least accuracy above chance that counts as learning."""
DIVERGED_EXIT = 3
"""The exit status of ``fedsync run`` / ``fedsync compare`` for a run that did not learn
(1: a run failed; 2: bad usage)."""


def health_problem(summary: Mapping[str, Any]) -> str | None:
    """The final health verdict of a ``summary.json`` document when it is not ``ok``
    (``"diverged: test loss rose ..."``), else ``None`` (also for a summary without one)."""
    health = summary.get("health")
    if not isinstance(health, Mapping) or health.get("status") in (None, "ok"):
        return None
    return f"{health['status']}: {health.get('message') or ''}".strip()


@dataclass(frozen=True)
class HealthVerdict:
    """What is wrong with a run, as of one evaluation."""

    status: HealthStatus
    message: str
    version: int

    def as_dict(self) -> dict[str, Any]:
        """The verdict as ``summary.json`` fields."""
        return {"status": self.status, "message": self.message, "version": self.version}


@dataclass
class TrainingHealth:
    """Reads a run's central evaluations and keeps the first warning of each kind.

    Attributes
    ----------
    warnings : list of HealthVerdict
        Every distinct problem seen during the run, in order (a run can recover from
        a stretch at chance; the final verdict is :meth:`check` of the whole history).
    """

    warnings: list[HealthVerdict] = field(default_factory=list)

    def observe(self, evaluations: Sequence[Mapping[str, Any]]) -> HealthVerdict | None:
        """Check the history after a new evaluation; return the verdict when it is a
        problem not warned about yet (the caller logs it), else ``None``."""
        verdict = self.check(evaluations)
        if verdict is None or any(w.status == verdict.status for w in self.warnings):
            return None
        self.warnings.append(verdict)
        return verdict

    @staticmethod
    def check(evaluations: Sequence[Mapping[str, Any]]) -> HealthVerdict | None:
        """The problem the evaluations show as of the last one, or ``None``."""
        if not evaluations:
            return None
        first, last = evaluations[0], evaluations[-1]
        version = int(last.get("version", 0))
        loss = float(last.get("loss", math.nan))
        accuracy = float(last.get("accuracy", math.nan))
        unmeasured = set(last.get("unmeasured", ()))
        measured = [v for k, v in (("loss", loss), ("accuracy", accuracy)) if k not in unmeasured]
        if not all(math.isfinite(value) for value in measured):
            return HealthVerdict(
                "diverged",
                f"test loss is {loss} at v{version} (it was {_number(first.get('loss'))} at "
                f"v{int(first.get('version', 0))}): the model is lost; try a lower "
                "learning-rate",
                version,
            )
        rising = _rising(evaluations)
        if rising is not None:
            return HealthVerdict("diverged", rising, version)
        stuck = _stuck(evaluations)
        if stuck is not None:
            return HealthVerdict("stuck", stuck, version)
        return None

    def summary(self, evaluations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``health`` field of ``summary.json``: the final verdict and the warnings."""
        verdict = self.check(evaluations)
        return {
            "status": verdict.status if verdict is not None else "ok",
            "message": verdict.message if verdict is not None else None,
            "version": verdict.version if verdict is not None else None,
            "warnings": [w.as_dict() for w in self.warnings],
        }


def _rising(evaluations: Sequence[Mapping[str, Any]]) -> str | None:
    if len(evaluations) < 1 + RISE_EVALUATIONS:
        return None
    first = evaluations[0]
    start = float(first.get("loss", math.nan))
    if not math.isfinite(start):
        return None
    chance_loss = float(evaluations[-1].get("chance_loss", 0.0))
    limit = max(LOSS_RISE * start, chance_loss)
    recent = evaluations[-RISE_EVALUATIONS:]
    if not all(float(e["loss"]) > limit for e in recent):
        return None
    last = evaluations[-1]
    span = int(last.get("version", 0)) - int(first.get("version", 0))
    return (
        f"test loss rose from {start:.3g} to {float(last['loss']):.3g} over {span} "
        f"aggregations (above {limit:.3g}, worse than the initial model"
        + (" and than a uniform guess" if chance_loss >= LOSS_RISE * start else "")
        + "); try a lower learning-rate"
    )


def _stuck(evaluations: Sequence[Mapping[str, Any]]) -> str | None:
    trained = evaluations[1:]
    if len(trained) < STUCK_EVALUATIONS:
        return None
    recent = trained[-STUCK_EVALUATIONS:]
    chance = recent[-1].get("chance_accuracy")
    if chance is None:
        return None
    chance = float(chance)
    examples = float(recent[-1].get("num_examples", 0.0))
    noise = 2.0 * math.sqrt(chance * (1.0 - chance) / examples) if examples > 0 else 0.0
    limit = chance + max(CHANCE_MARGIN, noise)
    if not all(float(e["accuracy"]) <= limit for e in recent):
        return None
    accuracies = ", ".join(f"{float(e['accuracy']):.3f}" for e in recent)
    return (
        f"test accuracy stuck at chance ({accuracies} over the last {len(recent)} "
        f"evaluations, up to v{int(recent[-1].get('version', 0))}; always answering the most "
        f"frequent class scores {chance:.3f}); try a lower learning-rate or more local epochs"
    )


def _number(value: object) -> str:
    try:
        return f"{float(value):.3g}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"
