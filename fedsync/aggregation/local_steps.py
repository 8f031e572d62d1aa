"""Dynamic local steps (Liu et al. 2024's DyLU): a device's step budget scaled to its speed.

With a fixed budget ``H`` per task a slow device's update takes longer and arrives
staler, and a fast one's data is seen more often. With ``local-steps-policy = "speed"``
the server measures each device's compute time per step as its replies come in (the
virtual clock's simulated compute in a simulation, the ``compute-seconds`` a deployed
device reports on the wall clock, over the steps the reply reports) and plans its next
task with::

    budget = clamp(round(H * fastest / own), local-steps-min, H)

where ``own`` is the device's last measured seconds per step and ``fastest`` the
smallest of any device's: the fastest device keeps ``H``, one twice as slow per step
gets ``H / 2``, so a task computes about as long on every device. A device not
measured yet gets ``H``. Compute alone, not the links: a link's latency does not shrink
with the budget, and counting it would cut a far device's budget task by task. The
run's token budget is held by the loop: with this policy a run stops planning tasks
once the budgets planned reach ``max-tasks x H``, not after ``max-tasks`` tasks.
"""

from __future__ import annotations

import math

__all__ = ["DynamicLocalSteps"]


class DynamicLocalSteps:
    """Step budgets by measured speed (see the module docstring).

    Parameters
    ----------
    steps : int
        ``H``, the budget of the fastest device, ``>= 1``.
    minimum : int
        The least budget a task gets, in ``[1, H]``.
    """

    def __init__(self, steps: int, *, minimum: int = 1) -> None:
        if steps < 1:
            raise ValueError(f"dynamic local steps need a budget H >= 1, got {steps}")
        if not 1 <= minimum <= steps:
            raise ValueError(f"the least budget must be in [1, {steps}], got {minimum}")
        self.steps = steps
        self.minimum = minimum
        self._seconds_per_step: dict[int, float] = {}

    def observe(self, node_id: int, seconds: float, steps: int) -> None:
        """A task of ``node_id`` computed ``seconds`` for ``steps`` steps (ignored unless
        both are positive and finite)."""
        if steps > 0 and math.isfinite(seconds) and seconds > 0.0:
            self._seconds_per_step[node_id] = seconds / steps

    def budget(self, node_id: int) -> int:
        """The step budget of ``node_id``'s next task."""
        own = self._seconds_per_step.get(node_id)
        if own is None:
            return self.steps
        fastest = min(self._seconds_per_step.values())
        return max(self.minimum, min(self.steps, round(self.steps * fastest / own)))

    def describe(self) -> dict[str, object]:
        """The policy and every device's current budget, for ``summary.json``."""
        return {
            "steps": self.steps,
            "minimum": self.minimum,
            "budgets": {str(node): self.budget(node) for node in sorted(self._seconds_per_step)},
        }
