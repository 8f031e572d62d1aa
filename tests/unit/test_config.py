"""One run-config reader: pyproject, the tables of docs/ and the reader agree.

``[tool.flwr.app.config]`` in ``pyproject.toml`` is what Flower hands the apps, the
the ``| key | default | meaning |`` tables of docs/ are what users read, and
:func:`fedsync.config.declared_keys` is what the code reads: a key or a default that
differs in one of them fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fedsync.config import ConfigValue, RunConfig, SettingsError, declared_keys
from fedsync.data.registry import ADAMW_LEARNING_RATE, dataset_info, dataset_names

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| `([^`]*)` \| (.+) \|$")


def toml_literal(value: ConfigValue) -> str:
    """A default as the docs write it: a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def documented_rows() -> dict[str, tuple[str, str]]:
    """Every ``| key | default | meaning |`` row of the guides in ``docs/``."""
    rows: dict[str, tuple[str, str]] = {}
    for path in sorted((ROOT / "docs").glob("*.md")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = ROW.match(line)
            if match:
                key, default, meaning = match.groups()
                assert key not in rows, f"docs/ document '{key}' twice"
                rows[key] = (default, meaning)
    return rows


def test_pyproject_declares_every_key_with_the_readers_default() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        app = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    declared = declared_keys()
    assert sorted(app) == sorted(declared)
    for key, info in declared.items():
        assert app[key] == info.default and type(app[key]) is type(info.default), key


def test_the_docs_tables_document_every_key_with_its_default_and_help() -> None:
    rows = documented_rows()
    declared = declared_keys()
    assert sorted(rows) == sorted(declared)
    for key, info in declared.items():
        default, meaning = rows[key]
        assert default == toml_literal(info.default), key
        assert meaning == info.help, key


def test_the_defaults_read_back_as_the_default_config() -> None:
    defaults = {key: info.default for key, info in declared_keys().items()}
    assert RunConfig.from_run_config(defaults) == RunConfig()
    # The "auto" training keys read back as what they stood for (digits' values).
    resolved = {**defaults, "learning-rate": 0.1, "local-epochs": 3, "partitioning": "dirichlet"}
    assert RunConfig().as_run_config() == resolved
    assert RunConfig.from_run_config(resolved) == RunConfig()


@pytest.mark.parametrize("dataset", dataset_names())
def test_auto_training_keys_take_the_datasets_defaults(dataset: str) -> None:
    training = RunConfig.from_run_config({"dataset": dataset}).training
    auto = dataset_info(dataset).training
    assert training.learning_rate == auto.learning_rate
    assert training.local_epochs == auto.local_epochs
    assert training.partitioning == auto.partitioning


def test_a_value_the_user_sets_wins_over_the_datasets_default() -> None:
    values = {"dataset": "mnist", "learning-rate": 0.3, "local-epochs": 2, "partitioning": "iid"}
    training = RunConfig.from_run_config(values).training
    assert (training.learning_rate, training.local_epochs, training.partitioning) == (
        0.3,
        2,
        "iid",
    )
    adamw = RunConfig.from_run_config({"dataset": "mnist", "client-optimizer": "adamw"})
    assert adamw.training.learning_rate == ADAMW_LEARNING_RATE


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"dataset": "mnsit"}, "unknown dataset 'mnsit'; valid names: digits, fashion-mnist"),
        ({"model": "resnet"}, "'model' must be one of char-gpt, .* or 'auto', got 'resnet'"),
        ({"partitioning": "random"}, "'partitioning' must be one of dirichlet, iid"),
        ({"learning-rate": -0.1}, "'learning-rate' must be finite and > 0"),
    ],
)
def test_names_and_values_are_checked_when_the_config_is_read(
    values: dict[str, ConfigValue], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        RunConfig.from_run_config(values)


def test_a_value_of_the_wrong_type_names_its_key() -> None:
    with pytest.raises(SettingsError, match="'local-epochs' must be int"):
        RunConfig.from_run_config({"local-epochs": "three"})


def test_an_unknown_server_update_transform_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="unknown server update transform 'median'"):
        RunConfig.from_run_config({"server-update-transform": "median"})


def test_the_docs_table_of_dataset_defaults_is_generated_from_the_registry_and_results() -> None:
    # One place per fact: the registry holds the values, the committed JSON what they
    # measured; docs/configuration.md shows `python -m benchmarks.dataset_defaults --table`.
    from benchmarks.dataset_defaults import table
    from fedsync.reports import RunSummary

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = text.split("<!-- dataset-defaults:start -->\n", 1)[1]
    block = block.split("<!-- dataset-defaults:end -->", 1)[0]
    document = RunSummary.read(ROOT / "benchmarks" / "results" / "dataset_defaults.json")
    assert block.strip() == table(document)
    for row in block.strip().splitlines()[2:]:  # every dataset's defaults were measured
        assert "not measured" not in row.split("|")[7], row
