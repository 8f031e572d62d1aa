"""TEASQ-Fed's decaying compression schedule and the async config that builds it."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedsync.aggregation import CompressionSchedule
from fedsync.config import RunConfig, SettingsError, check_keys, declared_keys
from fedsync.engine import AggregationEngine
from fedsync.strategies import STRATEGIES, Arrival, Strategy


def test_exponential_decay_values() -> None:
    s = CompressionSchedule(
        density_start=0.1,
        density_floor=0.01,
        density_decay=0.1,
        bits_start=8,
        bits_floor=2,
        bits_decay=0.05,
    )
    assert s.density(0) == pytest.approx(0.1)
    assert s.density(10) == pytest.approx(0.01 + 0.09 * math.exp(-1.0))
    assert s.density(10_000) == pytest.approx(0.01)
    assert s.bits(0) == 8
    assert s.bits(20) == round(2 + 6 * math.exp(-1.0))  # 4.2 -> 4
    assert s.bits(10_000) == 2


def test_linear_and_step_decay() -> None:
    linear = CompressionSchedule(
        kind="linear", density_start=0.5, density_floor=0.1, density_decay=0.1
    )
    assert [linear.density(v) for v in (0, 1, 3, 4, 10)] == pytest.approx([0.5, 0.4, 0.2, 0.1, 0.1])
    step = CompressionSchedule(
        kind="step",
        density_start=0.4,
        density_floor=0.05,
        density_decay=0.1,
        bits_start=16,
        bits_floor=4,
        bits_decay=0.1,
    )
    assert [step.density(v) for v in (0, 9, 10, 20, 30, 40)] == pytest.approx(
        [0.4, 0.4, 0.2, 0.1, 0.05, 0.05]
    )
    assert [step.bits(v) for v in (0, 10, 20, 30)] == [16, 8, 4, 4]


def test_spec_fills_the_template() -> None:
    s = CompressionSchedule(density_start=0.05, density_floor=0.01, bits_start=8, bits_floor=4)
    assert s.spec(0) == "topk:0.05+uniform:8+ef"
    assert s.spec(99) == "topk:0.05+uniform:8+ef"  # no decay: constant
    fixed = CompressionSchedule(template="randk:0.2+fp16")
    assert fixed.spec(7) == "randk:0.2+fp16"
    assert s.extreme_specs() == ("topk:0.05+uniform:8+ef", "topk:0.01+uniform:4+ef")


def test_frozen_schedule_keeps_start_values() -> None:
    s = CompressionSchedule(density_decay=1.0, bits_decay=1.0, frozen=True)
    assert s.spec(50) == s.spec(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"density_start": 0.01, "density_floor": 0.1}, "density-floor <= density-start"),
        ({"density_start": 1.5}, "<= 1"),
        ({"density_floor": 0.0}, "0 < density-floor"),
        ({"bits_start": 40}, "<= 32"),
        ({"bits_floor": 9}, "bits-floor <= bits-start"),
        ({"density_decay": -1.0}, "density-decay"),
        ({"kind": "cosine"}, "decay kind"),
        ({"template": " "}, "empty"),
    ],
)
def test_schedule_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CompressionSchedule(**kwargs)


@given(
    start=st.floats(0.001, 1.0),
    floor_fraction=st.floats(0.001, 1.0),
    decay=st.floats(0.0, 5.0),
    kind=st.sampled_from(["exponential", "linear", "step"]),
    version=st.integers(0, 10_000),
)
def test_density_stays_between_floor_and_start_and_never_grows(
    start: float, floor_fraction: float, decay: float, kind: str, version: int
) -> None:
    s = CompressionSchedule(
        density_start=start,
        density_floor=start * floor_fraction,
        density_decay=decay,
        kind=kind,  # type: ignore[arg-type]
        bits_start=12,
        bits_floor=3,
        bits_decay=decay,
    )
    d, d_next = s.density(version), s.density(version + 1)
    assert s.density_floor - 1e-12 <= d <= start + 1e-12
    assert d_next <= d + 1e-12
    assert 3 <= s.bits(version + 1) <= s.bits(version) <= 12


# --- the run config that feeds the schedule and the strategies ------------------------------
def test_config_reads_kebab_case_keys_and_builds_objects() -> None:
    config = RunConfig.from_run_config(
        {
            "strategy": "teasq",
            "concurrency": 8,
            "buffer-size": 4,
            "staleness": "hinge:10:2",
            "max-staleness": 6,
            "density-decay": 0.05,
            "server-optimizer": "adam",
            "server-learning-rate": 0.01,
            "max-sim-time": 100,  # int for a float key: accepted
            "dataset": "digits",
        }
    )
    engine = AggregationEngine(config, {"w": torch.zeros(4, 3)}, codec_factory=_Codec)
    strategy = engine.strategy
    assert (strategy.concurrency, strategy.buffer_size, strategy.max_staleness) == (8, 4, 6)
    assert strategy.staleness.spec() == "hinge:10:2"
    assert engine.schedule.density(100) < engine.schedule.density(0)
    assert type(engine.optimizer).__name__ == "ServerAdam"
    assert config.stop.max_sim_time == 100.0
    # FedBuff does not decay compression even with a decay rate set
    fedbuff = AggregationEngine(
        RunConfig.of(strategy="fedbuff", density_decay=0.5),
        {"w": torch.zeros(4, 3)},
        codec_factory=_Codec,
    )
    assert fedbuff.schedule.spec(100) == fedbuff.schedule.spec(0)
    assert set(config.as_run_config()) == set(declared_keys())


class _Codec:
    """A codec that only needs to exist (the engine builds its codecs up front)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"strategy": "fedavgg"}, "'strategy'"),
        ({"concurrency": 0}, "concurrency"),
        ({"buffer-size": "3"}, "'buffer-size' must be int"),
        ({"staleness": "linear:1"}, "unknown staleness"),
        ({"max-staleness": -2}, "max-staleness"),
        ({"density-start": 0.001, "density-floor": 0.01}, "density"),
        ({"server-optimizer": "sgdw"}, "unknown server optimizer"),
        ({"fedasync-alpha": 1.5, "strategy": "fedasync"}, "fedasync-alpha"),
        ({"clock": "ntp"}, "'clock'"),
        ({"task-ttl": 0}, "task-ttl"),
    ],
)
def test_config_errors_name_the_key(values: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        RunConfig.from_run_config(values)


def test_unknown_keys_are_named_with_the_closest_one() -> None:
    with pytest.raises(SettingsError, match=r"'concurency'.*did you mean 'concurrency'"):
        check_keys(["strategy", "concurency"])
    with pytest.raises(SettingsError, match="unknown run-config key 'buffer-sizes'"):
        RunConfig.of(buffer_sizes=3)


def _strategy(name: str, **values: Any) -> Strategy:
    return Strategy.from_run_config(RunConfig.of(strategy=name, **values))


def test_strategies() -> None:
    teasq = _strategy("teasq", concurrency=4, buffer_size=2)
    assert teasq.normalization == "weight" and teasq.decaying_compression
    assert teasq.weight(Arrival(3, 100, 0)) == pytest.approx(100 * 0.5)
    assert teasq.check(Arrival(0, 0, 0)) != ""  # no examples: no weight
    fedasync = _strategy("fedasync", buffer_size=9, fedasync_alpha=0.5)
    assert fedasync.buffer_size == 1
    assert fedasync.weight(Arrival(0, 10, 0)) == pytest.approx(0.5)
    assert fedasync.weight(Arrival(3, 10, 0)) == pytest.approx(0.25)
    capped = _strategy("fedbuff", max_staleness=2)
    assert capped.accepts(Arrival(2, 1, 0)) and not capped.accepts(Arrival(3, 1, 0))
    assert _strategy("fedbuff").accepts(Arrival(10**6, 1, 0))
    assert "fedavg" not in STRATEGIES  # Flower's own strategy, not an engine one
