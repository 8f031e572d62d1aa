"""Scenarios: one experiment, several strategies, one target -- read from TOML.

A scenario file (``simulations/scenarios/<name>.toml``) holds what every strategy of a
comparison shares and what each one changes::

    name = "digits-stragglers"
    description = "..."
    timeout = 300                 # real seconds one strategy's run may take
    baseline = "fedavg"           # the label ratios are computed against

    [run-config]                  # run-config keys shared by every strategy
    dataset = "digits"
    fleet = "digits-stragglers"

    [federation]                  # Flower's --federation-config of the simulation
    num-supernodes = 10
    client-resources-num-cpus = 1

    [target]                      # exactly one of:
    fraction-of-best = 0.85       #   a fraction of the best final accuracy of any run
    # accuracy = 0.9              #   an absolute accuracy

    [strategies.teasq]            # one table per strategy: its label and overrides
    strategy = "teasq"
    concurrency = 5

    [strategies.one-site.federation]   # optional: this strategy's own federation keys
    num-supernodes = 1                 # (over [federation]; a single-site reference)

Every run-config key must be one of ``[tool.flwr.app.config]`` in ``pyproject.toml``,
with a value of the same type as its default there (an int is accepted for a float);
the strategy's merged settings are then checked by the readers the apps use
(:class:`fedsync.config.RunConfig`),
so a bad value fails here, before a SuperLink starts, with a message naming the
scenario, the table and the key. ``data-dir`` is resolved relative to the project root
(the Flower app's processes do not run in it); ``results-dir`` and ``run-name`` belong
to the runner, which gives each strategy its own results folder.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from fedsync.clock import load_fleet
from fedsync.config import ConfigValue, RunConfig, declared_keys
from fedsync.strategies import STRATEGIES

__all__ = [
    "PROJECT_ROOT",
    "SCENARIO_DIR",
    "Scenario",
    "ScenarioError",
    "StrategySpec",
    "TargetKind",
    "TargetRule",
    "app_run_config_defaults",
    "load_scenario",
    "parse_scenario",
]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The Flower app folder (``pyproject.toml``), which ``flwr run`` packs and submits."""

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
"""Where scenarios are found by name."""

RESERVED_KEYS = frozenset({"results-dir", "run-name"})
LENGTH_KEYS: Mapping[str, tuple[str, ...]] = {
    "fedavg": ("num-rounds",),
    **dict.fromkeys(STRATEGIES, ("max-aggregations", "max-tasks")),
}
"""Per strategy, the run-config keys that say how long a run is (:meth:`Scenario.scaled`)."""
"""Run-config keys the runner sets per strategy (each run gets its own folder)."""

FEDERATION_KEYS: Mapping[str, type] = {
    "num-supernodes": int,
    "client-resources-num-cpus": float,
    "client-resources-num-gpus": float,
    "init-args-num-cpus": int,
    "init-args-num-gpus": int,
}
"""Flower 1.39 simulation settings a scenario may set (``--federation-config``)."""

_TOP_LEVEL = frozenset(
    {"name", "description", "timeout", "baseline", "run-config", "federation", "target"}
    | {"strategies"}
)
_LABEL = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_DEFAULT_TIMEOUT_S = 900.0


class ScenarioError(ValueError):
    """A scenario file is missing, malformed, or names a bad key or value."""


TargetKind = Literal["accuracy", "fraction-of-best", "loss-of-baseline"]
"""How a comparison's target is fixed (:class:`TargetRule`)."""


@dataclass(frozen=True)
class TargetRule:
    """How the target of a comparison is fixed.

    Parameters
    ----------
    kind : {"accuracy", "fraction-of-best", "loss-of-baseline"}
        ``"accuracy"``: ``value`` is the target accuracy itself; ``"fraction-of-best"``:
        the target accuracy is ``value`` times the best final accuracy any strategy
        reached; ``"loss-of-baseline"``: the target is a test *loss*, ``value`` times the
        baseline's final test loss (``1.02``: within 2 % of it), reached by the first
        evaluation at or below it. The relative ones are known only once every run is done.
    value : float
        In ``(0, 1]`` for the accuracy kinds, in ``[1, 10]`` for ``loss-of-baseline``.
    """

    kind: TargetKind
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("accuracy", "fraction-of-best", "loss-of-baseline"):
            raise ScenarioError(
                "target kind must be 'accuracy', 'fraction-of-best' or 'loss-of-baseline', "
                f"got {self.kind!r}"
            )
        if self.is_loss:
            if not (math.isfinite(self.value) and 1.0 <= self.value <= 10.0):
                raise ScenarioError(f"[target] {self.kind} must be in [1, 10], got {self.value!r}")
        elif not (math.isfinite(self.value) and 0.0 < self.value <= 1.0):
            raise ScenarioError(f"[target] {self.kind} must be in (0, 1], got {self.value!r}")

    @property
    def is_loss(self) -> bool:
        """Whether the target is a test loss (lower is better) rather than an accuracy."""
        return self.kind == "loss-of-baseline"

    @property
    def metric(self) -> Literal["accuracy", "loss"]:
        """The evaluation metric the target is on."""
        return "loss" if self.is_loss else "accuracy"

    def resolve(self, final_accuracies: Iterable[float | None]) -> float | None:
        """The target accuracy, given every run's final accuracy (``None``: no result).

        Returns ``None`` when the rule is relative and no run produced an accuracy.
        Loss targets are fixed by :meth:`resolve_loss`.
        """
        if self.kind == "accuracy":
            return self.value
        if self.is_loss:
            raise ScenarioError("a loss target is fixed by resolve_loss, not resolve")
        finals = [a for a in final_accuracies if a is not None and math.isfinite(a)]
        return self.value * max(finals) if finals else None

    def resolve_loss(self, baseline_final_loss: float | None) -> float | None:
        """The target test loss from the baseline's final loss (``None``: no baseline)."""
        if not self.is_loss:
            raise ScenarioError(f"a {self.kind} target is an accuracy, not a loss")
        if baseline_final_loss is None or not math.isfinite(baseline_final_loss):
            return None
        return self.value * baseline_final_loss

    def describe(self) -> str:
        """One line for reports."""
        if self.kind == "accuracy":
            return f"accuracy {self.value:g}"
        if self.is_loss:
            return f"test loss <= {self.value:g} x the baseline's final test loss"
        return f"{self.value:g} x the best final accuracy of any strategy"


@dataclass(frozen=True)
class StrategySpec:
    """One strategy of a scenario: its label and its complete run config.

    Parameters
    ----------
    label : str
        The name in reports and the run's results folder name.
    run_config : mapping
        The scenario's shared run config with this strategy's overrides applied.
    federation : mapping
        Its own ``[strategies.<label>.federation]`` keys over the scenario's
        ``[federation]`` (empty: the scenario's, see :meth:`Scenario.federation_of`).
    """

    label: str
    run_config: Mapping[str, ConfigValue]
    federation: Mapping[str, ConfigValue] = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        """The ``strategy`` run-config value (``fedavg``, ``teasq`` ...)."""
        return RunConfig.from_run_config(self.run_config).strategy


@dataclass(frozen=True)
class Scenario:
    """A comparison: shared settings, a federation, a target rule and strategies.

    Build it with :func:`load_scenario` (or :func:`parse_scenario`), which validates.

    Attributes
    ----------
    name, description : str
        For reports.
    run_config : mapping
        The shared run-config keys (before per-strategy overrides).
    federation : mapping
        Flower's simulation settings (``num-supernodes`` ...).
    target : TargetRule
        How the target accuracy is fixed.
    strategies : tuple of StrategySpec
        In file order.
    baseline : str
        Label of the strategy ratios are computed against ("" when it is not run).
    timeout : float
        Real seconds one strategy's run may take.
    scale : float
        How the runs' lengths were scaled from the file (:meth:`scaled`); 1: as written.
    path : pathlib.Path or None
        The file it came from.
    """

    name: str
    description: str
    run_config: Mapping[str, ConfigValue]
    federation: Mapping[str, ConfigValue]
    target: TargetRule
    strategies: tuple[StrategySpec, ...]
    baseline: str = "fedavg"
    timeout: float = _DEFAULT_TIMEOUT_S
    scale: float = 1.0
    path: Path | None = field(default=None, compare=False)

    @property
    def labels(self) -> list[str]:
        """Strategy labels in file order."""
        return [spec.label for spec in self.strategies]

    def federation_of(self, label: str) -> dict[str, ConfigValue]:
        """The federation strategy ``label`` runs on: the scenario's, with its own keys
        over it."""
        return {**self.federation, **self.strategy(label).federation}

    def strategy(self, label: str) -> StrategySpec:
        """The strategy with this label.

        Raises
        ------
        KeyError
            Naming the labels there are.
        """
        for spec in self.strategies:
            if spec.label == label:
                return spec
        raise KeyError(f"scenario {self.name!r} has no strategy {label!r}; has {self.labels}")

    def scaled(self, factor: float, *, project_root: Path = PROJECT_ROOT) -> Scenario:
        """The same scenario with every run's length multiplied by ``factor``.

        FedAvg's ``num-rounds``, the asynchronous strategies' ``max-aggregations`` and a
        non-zero ``max-tasks`` are scaled (rounded, at least 1), from the strategy's value
        or the app's default: a cheaper
        (``factor < 1``) or longer version of the same experiment. Evaluation intervals
        and compression schedules (per model version) are left as they are.

        Raises
        ------
        ScenarioError
            If ``factor`` is not a finite number > 0.
        """
        if not (math.isfinite(factor) and factor > 0.0):
            raise ScenarioError(f"scale must be a finite number > 0, got {factor!r}")
        if factor == 1.0:
            return self
        defaults = app_run_config_defaults()
        strategies = []
        for spec in self.strategies:
            config = dict(spec.run_config)
            for key in LENGTH_KEYS.get(spec.strategy, ()):
                value = config.get(key, defaults.get(key, 0))
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    config[key] = max(1, round(value * factor))
            strategies.append(replace(spec, run_config=config))
        return replace(self, strategies=tuple(strategies), scale=self.scale * factor)

    @property
    def seed(self) -> int | None:
        """The run-config ``seed`` every strategy runs with (the app's default where the
        file sets none); ``None`` when the strategies set different ones."""
        default = app_run_config_defaults()["seed"]
        seeds = {spec.run_config.get("seed", default) for spec in self.strategies}
        seed = seeds.pop() if len(seeds) == 1 else None
        return seed if isinstance(seed, int) else None

    def seeded(self, seed: int) -> Scenario:
        """The same scenario with every strategy's run-config ``seed`` set to ``seed``:
        another draw of the data split, the fleet assignment and the initial model.

        Raises
        ------
        ScenarioError
            If ``seed`` is not an integer >= 0.
        """
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ScenarioError(f"seed must be an integer >= 0, got {seed!r}")
        strategies = tuple(
            replace(spec, run_config={**spec.run_config, "seed": seed}) for spec in self.strategies
        )
        return replace(self, run_config={**self.run_config, "seed": seed}, strategies=strategies)

    def only(self, labels: Iterable[str]) -> Scenario:
        """The same scenario with just these strategies (file order kept).

        Raises
        ------
        ScenarioError
            If a label is not in the scenario.
        """
        wanted = [label.strip() for label in labels if label.strip()]
        unknown = sorted(set(wanted) - set(self.labels))
        if unknown:
            raise ScenarioError(
                f"scenario {self.name!r} has no strategies {unknown}; it has {self.labels}"
            )
        kept = tuple(spec for spec in self.strategies if spec.label in wanted)
        return replace(self, strategies=kept)


def app_run_config_defaults() -> dict[str, ConfigValue]:
    """Every run-config key with its default (:func:`fedsync.config.declared_keys`, which
    ``tests/unit/test_config.py`` keeps equal to ``[tool.flwr.app.config]``)."""
    return {name: info.default for name, info in declared_keys().items()}


def load_scenario(name_or_path: str | Path, *, project_root: Path = PROJECT_ROOT) -> Scenario:
    """Load and validate a scenario by name (``"digits-stragglers"``) or ``.toml`` path.

    Raises
    ------
    ScenarioError
        If no file matches, it is not valid TOML, or anything in it is invalid.
    """
    path = _find(name_or_path)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"scenario {path}: not valid TOML: {err}") from err
    scenario = parse_scenario(data, name=path.stem, project_root=project_root)
    return replace(scenario, path=path)


def parse_scenario(
    data: Mapping[str, Any], *, name: str = "scenario", project_root: Path = PROJECT_ROOT
) -> Scenario:
    """Validate parsed scenario TOML (see the module docstring) into a :class:`Scenario`.

    Raises
    ------
    ScenarioError
        Naming the scenario, the table and the key that is wrong.
    """
    label = str(data.get("name", name))
    where = f"scenario {label!r}"
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown top-level keys {unknown}; known: {sorted(_TOP_LEVEL)}"
        )
    defaults = app_run_config_defaults()
    shared = _run_config(_table(data, "run-config", where), defaults, f"{where} [run-config]")
    shared = _resolve_paths(shared, project_root)
    federation = _federation(_table(data, "federation", where), f"{where} [federation]")
    target = _target(data.get("target"), where)
    strategies_table = _table(data, "strategies", where)
    if not strategies_table:
        raise ScenarioError(f"{where}: needs at least one [strategies.<label>] table")
    strategies = []
    for strategy_label, overrides in strategies_table.items():
        table_name = f"{where} [strategies.{strategy_label}]"
        if not _LABEL.match(strategy_label):
            raise ScenarioError(
                f"{table_name}: a label must match [a-z0-9][a-z0-9_-]* (it names a folder)"
            )
        if not isinstance(overrides, Mapping):
            raise ScenarioError(f"{table_name}: must be a table of run-config keys")
        overrides = dict(overrides)
        own_federation = _federation(
            _table(overrides, "federation", table_name), f"{table_name} [federation]"
        )
        overrides.pop("federation", None)
        own = _resolve_paths(_run_config(overrides, defaults, table_name), project_root)
        if "strategy" not in own:
            raise ScenarioError(
                f"{table_name}: must set 'strategy' (fedavg, {', '.join(STRATEGIES)})"
            )
        merged = {**shared, **own}
        _check_with_app_readers({**defaults, **merged}, table_name)
        strategies.append(StrategySpec(strategy_label, merged, own_federation))
    baseline = data.get("baseline", "fedavg")
    if not isinstance(baseline, str) or baseline not in strategies_table:
        raise ScenarioError(
            f"{where}: 'baseline' must be one of the strategy labels "
            f"{sorted(strategies_table)}, got {baseline!r}"
        )
    timeout = data.get("timeout", _DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ScenarioError(f"{where}: 'timeout' must be a number of seconds > 0, got {timeout!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"{where}: 'description' must be a string, got {description!r}")
    return Scenario(
        name=label,
        description=description,
        run_config=shared,
        federation=federation,
        target=target,
        strategies=tuple(strategies),
        baseline=baseline,
        timeout=float(timeout),
    )


# --- pieces -------------------------------------------------------------------------------------
def _find(name_or_path: str | Path) -> Path:
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix == ".toml":
        if candidate.is_file():
            return candidate
        raise ScenarioError(f"scenario file {candidate} not found")
    path = SCENARIO_DIR / f"{name_or_path}.toml"
    if path.is_file():
        return path
    known = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    raise ScenarioError(
        f"scenario {str(name_or_path)!r} not found in {SCENARIO_DIR}; known: {known}"
    )


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: [{key}] must be a table, got {value!r}")
    return value


def _run_config(
    table: Mapping[str, Any], defaults: Mapping[str, ConfigValue], where: str
) -> dict[str, ConfigValue]:
    config: dict[str, ConfigValue] = {}
    for key, value in table.items():
        if key in RESERVED_KEYS:
            raise ScenarioError(
                f"{where}: '{key}' is set by the runner (each strategy gets its own results folder)"
            )
        if key not in defaults:
            raise ScenarioError(
                f"{where}: '{key}' is not a run-config key of the app "
                "([tool.flwr.app.config] in pyproject.toml)"
            )
        config[key] = _typed(key, value, type(defaults[key]), where)
    return config


def _typed(key: str, value: Any, kind: type, where: str) -> ConfigValue:
    # TOML tells 1 from 1.0, and so does Flower's run config: an int where the app's
    # default is a float is harmless, the other way round is not.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return cast(ConfigValue, value)
    raise ScenarioError(
        f"{where}: '{key}' must be {kind.__name__} (the type of its default in "
        f"pyproject.toml), got {value!r}"
    )


def _resolve_paths(config: dict[str, ConfigValue], project_root: Path) -> dict[str, ConfigValue]:
    # The app's processes run wherever the SuperLink put them: a relative data-dir is
    # meant relative to the project, so hand them an absolute one.
    data_dir = config.get("data-dir")
    if isinstance(data_dir, str) and data_dir and not Path(data_dir).expanduser().is_absolute():
        config["data-dir"] = str((project_root / data_dir).resolve())
    return config


def _federation(table: Mapping[str, Any], where: str) -> dict[str, ConfigValue]:
    federation: dict[str, ConfigValue] = {}
    for key, value in table.items():
        kind = FEDERATION_KEYS.get(key)
        if kind is None:
            raise ScenarioError(f"{where}: unknown key '{key}'; known: {sorted(FEDERATION_KEYS)}")
        # Kept as written (1 stays 1): Flower passes these on to Ray as they come.
        typed = (
            value if kind is float and isinstance(value, int) else _typed(key, value, kind, where)
        )
        if not (isinstance(typed, int | float) and typed >= 0):
            raise ScenarioError(f"{where}: '{key}' must be >= 0, got {value!r}")
        federation[key] = typed
    if int(federation.get("num-supernodes", 1)) < 1:
        raise ScenarioError(f"{where}: 'num-supernodes' must be >= 1")
    if float(federation.get("client-resources-num-cpus", 1.0)) <= 0.0:
        raise ScenarioError(f"{where}: 'client-resources-num-cpus' must be > 0")
    return federation


def _target(table: Any, where: str) -> TargetRule:
    if not isinstance(table, Mapping):
        raise ScenarioError(
            f"{where}: needs a [target] table with 'accuracy', 'fraction-of-best' or "
            "'loss-of-baseline'"
        )
    keys = sorted(table)
    if keys not in (["accuracy"], ["fraction-of-best"], ["loss-of-baseline"]):
        raise ScenarioError(
            f"{where} [target]: set exactly one of 'accuracy', 'fraction-of-best', "
            f"'loss-of-baseline'; got {keys}"
        )
    kind = cast(TargetKind, keys[0])
    value = table[kind]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where} [target]: '{kind}' must be a number, got {value!r}")
    try:
        return TargetRule(kind, float(value))
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None


def _check_with_app_readers(config: Mapping[str, ConfigValue], where: str) -> None:
    """Let the apps' own readers judge the settings now, not mid-comparison.

    ``config`` is what the apps will see: the pyproject defaults with the scenario's
    keys on top.
    """
    try:
        RunConfig.from_run_config(config)
        load_fleet(str(config.get("fleet", "")))
    except (ValueError, FileNotFoundError) as err:
        raise ScenarioError(f"{where}: {err}") from err
