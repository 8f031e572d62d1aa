"""The fidelity experiment's setup and calibration: pure functions of files and timings.

:class:`FidelitySetup` is the experiment as a scenario describes it (one strategy's
run config, the federation, the absolute target, the fleet whose links the deployment
shapes); :class:`Calibration` fits compute speed and per-task overhead from a deployed
run's measured task timings and writes them as a fleet file for the simulator.
:mod:`fedsync.simulations.fidelity` runs the experiment with them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedsync.clock import FleetSpec, load_fleet
from fedsync.config import RunConfig
from fedsync.deploy.netns import LinkShape
from fedsync.deploy.timing import TaskTiming
from fedsync.simulations.scenario import Scenario, ScenarioError

__all__ = ["Calibration", "FidelitySetup", "modelled_transfer_s"]

_MBIT = 1e6


def modelled_transfer_s(timing: TaskTiming, shapes: Sequence[LinkShape | None]) -> float:
    """The virtual clock's transfer seconds for a task's payloads: ``bytes * 8 / rate``
    both ways on its node's link (``shapes[node_index]``; missing or ``None``: 0)."""
    shape = shapes[timing.node_index] if timing.node_index < len(shapes) else None
    if shape is None:
        return 0.0
    return (
        (timing.bytes_down / shape.downlink_mbit + timing.bytes_up / shape.uplink_mbit) * 8 / _MBIT
    )


@dataclass(frozen=True)
class FidelitySetup:
    """The experiment: one strategy of a scenario (by default its ``teasq``).

    Attributes
    ----------
    name : str
        Scenario name.
    run_config : dict
        Shared run config with the strategy's keys merged in.
    federation : dict
        The simulation's ``--federation-config``.
    target : float
        Target accuracy.
    timeout : float
        Seconds per run.
    fleet : FleetSpec
        The fleet named by the run config: one device (and link) per node.
    epochs : int
        Local epochs per task (samples processed = examples x epochs): the run
        config's ``local-epochs``, else the app's default.
    """

    name: str
    run_config: dict[str, Any]
    federation: dict[str, Any]
    target: float
    timeout: float
    fleet: FleetSpec
    epochs: int

    @classmethod
    def from_scenario(cls, scenario: Scenario, strategy: str = "teasq") -> FidelitySetup:
        """The setup of one strategy of a loaded (validated) scenario.

        Raises
        ------
        ScenarioError
            When the scenario has no such strategy, its target is not an absolute
            accuracy, or the fleet has not one device per node.
        """
        where = f"scenario {scenario.name!r}"
        try:
            spec = scenario.strategy(strategy)
        except KeyError as err:
            raise ScenarioError(str(err.args[0])) from None
        if scenario.target.kind != "accuracy":
            raise ScenarioError(
                f"{where}: the fidelity run needs an absolute [target] accuracy, "
                f"got {scenario.target.describe()}"
            )
        run_config = dict(spec.run_config)
        typed = RunConfig.from_run_config(run_config)
        federation = dict(scenario.federation)
        fleet = load_fleet(typed.clock.fleet)
        nodes = int(federation.get("num-supernodes", len(fleet)))
        if nodes != len(fleet):
            raise ScenarioError(
                f"{where}: {nodes} supernodes but fleet {fleet.name} has {len(fleet)}"
            )
        epochs = typed.training.local_epochs
        return cls(
            name=scenario.name,
            run_config=run_config,
            federation=federation,
            target=scenario.target.value,
            timeout=scenario.timeout,
            fleet=fleet,
            epochs=int(epochs),
        )

    @property
    def shapes(self) -> list[LinkShape]:
        """The fleet's link rates, device by device (partition ``i`` -> link ``i``)."""
        return [
            LinkShape(uplink_mbit=p.uplink_bps / _MBIT, downlink_mbit=p.downlink_bps / _MBIT)
            for p in self.fleet.profiles
        ]


@dataclass(frozen=True)
class Calibration:
    """Compute speed and per-task overhead measured on unshaped links.

    ``compute_s = cold_start_s + seconds_per_sample * samples`` is fitted by least
    squares over the tasks; ``overhead_s`` is the mean of ``round trip - compute``
    (links unshaped: transfers take milliseconds).

    Attributes
    ----------
    seconds_per_sample_flat : float
        ``sum(compute) / sum(samples)``: the whole measured compute as a speed (the
        "naive" fleet).
    seconds_per_sample : float
        The fit's slope.
    cold_start_s : float
        The fit's intercept: a fresh process's first training step (torch warm-up).
    overhead_s : float
        Mean per-task time outside training: polling, process start, imports, data.
    tasks : int
        Tasks measured.
    """

    seconds_per_sample_flat: float
    seconds_per_sample: float
    cold_start_s: float
    overhead_s: float
    tasks: int

    @classmethod
    def from_timings(
        cls,
        timings: Sequence[TaskTiming],
        epochs: int,
        shapes: Sequence[LinkShape | None] = (),
    ) -> Calibration:
        """Fit from measured tasks.

        Parameters
        ----------
        timings : sequence of TaskTiming
            Completed tasks of a deployed run.
        epochs : int
            Local epochs per task (samples = examples x epochs, as the virtual clock has it).
        shapes : sequence of LinkShape or None
            The links of the run, by node index: their transfer times as the simulator
            models them (``bytes * 8 / rate``) are taken out of the overhead, since the
            simulator adds them itself. Missing or ``None``: unshaped (no transfer time).

        Raises
        ------
        ValueError
            When there is no task with a positive number of examples.
        """

        rows = [
            (t.examples * epochs, t.compute_s, t.round_trip_s - modelled_transfer_s(t, shapes))
            for t in timings
            if t.examples
        ]
        if not rows:
            raise ValueError("no measured task reports its examples: nothing to calibrate")
        samples = [float(r[0]) for r in rows]
        compute = [r[1] for r in rows]
        flat = sum(compute) / sum(samples)
        slope, intercept = flat, 0.0
        if len(set(samples)) > 1:
            fit = statistics.linear_regression(samples, compute)
            slope, intercept = fit.slope, fit.intercept
        if slope < 0.0 or intercept < 0.0:
            # Noise can tilt a fit on few points; fall back to a pure per-sample speed.
            slope, intercept = flat, 0.0
        overhead = statistics.fmean(r[2] - r[1] for r in rows)
        return cls(flat, slope, intercept, max(overhead, 0.0), len(rows))

    def fleet_toml(
        self, name: str, shapes: Sequence[LinkShape], *, overhead: bool, source: str
    ) -> str:
        """A fleet file: the shapes' rates with this compute speed (and overhead)."""
        per_sample = self.seconds_per_sample if overhead else self.seconds_per_sample_flat
        latency_ms = (self.cold_start_s + self.overhead_s) * 1e3 if overhead else 0.0
        kind = "links + compute + measured per-task overhead" if overhead else "links + compute"
        lines = [
            f"# Written by python -m fedsync.simulations.fidelity, calibrated on {source}.",
            f'name = "{name}"',
            f'description = "{kind}"',
        ]
        for index, shape in enumerate(shapes):
            lines += [
                "",
                "[[group]]",
                f'name = "link-{index}"',
                "count = 1",
                f"seconds-per-sample = {per_sample:.6g}",
                f"uplink-mbit = {shape.uplink_mbit:g}",
                f"downlink-mbit = {shape.downlink_mbit:g}",
                f"latency-ms = {latency_ms:.1f}",
            ]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        """For the report."""
        return {
            "tasks": self.tasks,
            "seconds_per_sample_flat": round(self.seconds_per_sample_flat, 6),
            "seconds_per_sample_fit": round(self.seconds_per_sample, 6),
            "compute_cold_start_s": round(self.cold_start_s, 3),
            "overhead_s": round(self.overhead_s, 3),
        }
