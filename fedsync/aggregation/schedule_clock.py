"""Where the run stands, in one device's steps: the position a task's schedule follows.

A device's learning-rate schedule (warm-up, cosine decay: run-config
``client-warmup-steps`` / ``client-decay-steps``) was written for a synchronous site,
whose own step count is the run's progress: after ``r`` rounds of ``H`` local steps
every site has taken ``r H`` steps. In an asynchronous fleet a device's own count is
not: a fast site of the cross-site scenario took 50 of 120 tasks and spent its last 40 %
of them at the schedule's floor, while the slowest took 12 and never decayed.

With ``client-schedule-clock = "run"`` every task carries the run's position instead
(:data:`fedsync.protocol.SCHEDULE_STEP`), and the device's schedule runs from there::

    position = floor(S / C)

where ``S`` sums the step budgets (``local-steps``) of the tasks planned before it and
``C`` is the concurrency: the steps each of ``C`` sites would have taken had the same
work been dealt evenly. A synchronous strategy counts only the tasks of earlier rounds,
so where every site completes its task, every task of round ``r`` carries ``r H``, a
synchronous site's own count (a failed task planned again counts its budget twice). A
run without a step budget (``local-steps = 0``, epochs decide) sums the steps its
replies report instead, as they arrive.
"""

from __future__ import annotations

__all__ = ["ScheduleClock"]


class ScheduleClock:
    """Counts the run's steps and tells each planned task its schedule position.

    Parameters
    ----------
    sites : int
        ``C``, the concurrency: how many devices the steps are spread over.
    synchronous : bool
        Rounds (every task of a model version carries the same position).
    steps_before : int
        Steps the run had taken before this process (a resumed run), ``>= 0``.
    """

    def __init__(self, sites: int, *, synchronous: bool, steps_before: int = 0) -> None:
        if sites < 1:
            raise ValueError(f"the schedule clock needs >= 1 site, got {sites}")
        if steps_before < 0:
            raise ValueError(f"steps before the run must be >= 0, got {steps_before}")
        self.sites = sites
        self.synchronous = synchronous
        self.steps = steps_before
        """``S``: the step budgets of the tasks planned so far (or the steps reported)."""
        self._round: tuple[int, int] | None = None
        """A synchronous run's (version, ``S`` when its first task was planned)."""

    def plan(self, version: int, budget: int) -> int:
        """The position of a task planned now from ``version`` with ``budget`` steps
        (``0``: no budget, the reply reports them); counts the budget in."""
        if budget < 0:
            raise ValueError(f"a task's step budget must be >= 0, got {budget}")
        if self.synchronous:
            if self._round is None or self._round[0] != version:
                self._round = (version, self.steps)
            counted = self._round[1]
        else:
            counted = self.steps
        self.steps += budget
        return counted // self.sites

    def reported(self, steps: int) -> None:
        """A reply of a task without a step budget took ``steps`` steps."""
        if steps > 0:
            self.steps += steps

    def describe(self) -> dict[str, int]:
        """The clock's numbers, for ``summary.json``."""
        return {"sites": self.sites, "steps": self.steps, "position": self.steps // self.sites}
