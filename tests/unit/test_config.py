"""One run-config reader: pyproject, the README's tables and the reader agree.

``[tool.flwr.app.config]`` in ``pyproject.toml`` is what Flower hands the apps, the
README's ``| key | default | meaning |`` tables are what users read, and
:func:`fedsync.config.declared_keys` is what the code reads: a key or a default that
differs in one of them fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fedsync.config import ConfigValue, RunConfig, SettingsError, declared_keys

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| `([^`]*)` \| (.+) \|$")


def toml_literal(value: ConfigValue) -> str:
    """A default as the README writes it: a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def readme_rows() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            key, default, meaning = match.groups()
            assert key not in rows, f"README documents '{key}' twice"
            rows[key] = (default, meaning)
    return rows


def test_pyproject_declares_every_key_with_the_readers_default() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        app = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    declared = declared_keys()
    assert sorted(app) == sorted(declared)
    for key, info in declared.items():
        assert app[key] == info.default and type(app[key]) is type(info.default), key


def test_the_readme_tables_document_every_key_with_its_default_and_help() -> None:
    rows = readme_rows()
    declared = declared_keys()
    assert sorted(rows) == sorted(declared)
    for key, info in declared.items():
        default, meaning = rows[key]
        assert default == toml_literal(info.default), key
        assert meaning == info.help, key


def test_the_defaults_read_back_as_the_default_config() -> None:
    defaults = {key: info.default for key, info in declared_keys().items()}
    assert RunConfig.from_run_config(defaults) == RunConfig()
    assert RunConfig().as_run_config() == defaults


def test_a_value_of_the_wrong_type_names_its_key() -> None:
    with pytest.raises(SettingsError, match="'local-epochs' must be int"):
        RunConfig.from_run_config({"local-epochs": "three"})


def test_an_unknown_server_update_transform_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="unknown server update transform 'median'"):
        RunConfig.from_run_config({"server-update-transform": "median"})
