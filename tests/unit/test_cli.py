"""The ``fedsync`` command's argument handling: run-config keys are checked before Flower
starts, and the help lists what ships. (What runs Flower is tested for real in
``tests/integration/test_main_command.py``.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedsync.config import SettingsError
from fedsync.simulations.cli import app, parse_run_config, shipped

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_the_help_lists_every_shipped_scenario_and_fleet() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    scenarios = sorted(p.stem for p in (ROOT / "simulations" / "scenarios").glob("*.toml"))
    fleets = sorted(p.stem for p in (ROOT / "fedsync" / "clock" / "fleets").glob("*.toml"))
    assert "quickstart" in scenarios and "digits-stragglers" in fleets
    assert sorted(shipped("scenarios")) == scenarios
    assert sorted(shipped("fleets")) == fleets
    for name in scenarios + fleets:
        assert f"  {name}: " in result.output, name
    for command in ("run", "compare", "deploy", "analyze"):
        assert command in result.output


def test_an_unknown_key_is_named_with_the_closest_valid_one() -> None:
    result = runner.invoke(app, ["run", "--run-config", "concurency=3"])
    assert result.exit_code == 2
    assert "unknown run-config key 'concurency'; did you mean 'concurrency'?" in result.output


def test_deploy_checks_its_run_config_keys_too() -> None:
    result = runner.invoke(app, ["deploy", "--nodes", "2", "--run-config", "num-round=3"])
    assert result.exit_code == 2
    assert "did you mean 'num-rounds'?" in result.output
    result = runner.invoke(app, ["deploy", "--nodes", "2", "--run-config", "dataset='cifar'"])
    assert result.exit_code == 2 and "unknown dataset 'cifar'" in result.output


def test_a_bad_value_and_a_malformed_string_fail_before_flower() -> None:
    result = runner.invoke(app, ["run", "-c", "local-epochs='three'"])
    assert result.exit_code == 2
    assert "'local-epochs' must be int" in result.output
    with pytest.raises(SettingsError, match="expected key=value"):
        parse_run_config(["num-rounds"])
    with pytest.raises(SettingsError, match="run config"):
        parse_run_config(["strategy=fedavg"])  # a TOML string needs quotes


def test_unknown_dataset_and_model_names_fail_before_flower() -> None:
    # Checked with the other keys: exit 2 at once, no SuperLink started.
    result = runner.invoke(app, ["run", "-c", "dataset='mnsit'"])
    assert result.exit_code == 2
    assert "unknown dataset 'mnsit'; valid names: digits, fashion-mnist, mnist" in result.output
    result = runner.invoke(app, ["run", "-c", "model='resnet'"])
    assert result.exit_code == 2 and "'model' must be one of char-gpt" in result.output


@pytest.mark.parametrize("command", ["run", "compare"])
def test_the_help_shows_defaults_without_markup_escapes(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "\\[" not in result.output  # typer escapes its own [default: ...] brackets
    assert "--allow-divergence" in result.output and "3 " in result.output
    if command == "compare":
        assert "--seed" in result.output


def test_valid_overrides_parse_as_toml_literals() -> None:
    values = parse_run_config(["strategy='fedavg' num-rounds=5", "stop-at-target=true"])
    assert values == {"strategy": "fedavg", "num-rounds": 5, "stop-at-target": True}


def test_simulations_start_their_own_ray_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "placeholder")  # so that the delete is undone
    monkeypatch.delenv("RAY_ADDRESS")
    runner.invoke(app, ["run", "-c", "concurency=3"])
    assert os.environ["RAY_ADDRESS"] == "local"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    runner.invoke(app, ["run", "-c", "concurency=3"])
    assert os.environ["RAY_ADDRESS"] == "10.0.0.1:6379"
