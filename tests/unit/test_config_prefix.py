"""fedsync's keys inside a user's own run config, under a prefix.

Flower flattens nested tables of ``[tool.flwr.app.config]`` with dots, so a user's app
that keeps fedsync's settings in ``[tool.flwr.app.config.fedsync]`` hands its apps keys
such as ``fedsync.buffer-size`` beside its own keys.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
from flwr.common.config import flatten_dict

from fedsync.config import RunConfig, SettingsError, check_keys

PREFIX = "fedsync."


def test_prefixed_keys_are_read_and_typed_and_the_users_keys_ignored() -> None:
    run_config: dict[str, Any] = {
        "fedsync.strategy": "fedbuff",
        "fedsync.buffer-size": 5,
        "fedsync.learning-rate": 1,  # a TOML integer where a float is declared
        "fedsync.plots": "false",  # a command-line override, as typed
        # The user's own keys, some spelled like fedsync's: none of them is read.
        "buffer-size": 99,
        "strategy": "my-own",
        "num-epochs": 7,
        "mylab.fedsync.seed": 4,
    }
    config = RunConfig.from_run_config(run_config, prefix=PREFIX)
    assert config.strategy == "fedbuff"
    assert config.asynchronous.buffer_size == 5
    assert config.training.learning_rate == 1.0 and isinstance(config.training.learning_rate, float)
    assert config.output.plots is False
    assert config.training.seed == 0  # 'mylab.fedsync.seed' is not under the prefix
    assert run_config["buffer-size"] == 99 and len(run_config) == 8  # left as it was


def test_absent_prefixed_keys_keep_their_defaults() -> None:
    assert RunConfig.from_run_config({"epochs": 3, "lr": "x"}, prefix=PREFIX) == RunConfig()
    config = RunConfig.from_run_config({"fedsync.concurrency": 2}, prefix=PREFIX)
    assert config == RunConfig.of(concurrency=2)


def test_a_misspelled_prefixed_key_is_named_in_full_with_the_closest_one() -> None:
    with pytest.raises(
        SettingsError,
        match=re.escape(
            "unknown run-config key 'fedsync.bufer-size'; did you mean 'fedsync.buffer-size'?"
        ),
    ):
        RunConfig.from_run_config({"fedsync.bufer-size": 5, "bufer": 1}, prefix=PREFIX)
    with pytest.raises(SettingsError, match=r"unknown run-config key 'fedsync\.zzz'$"):
        RunConfig.from_run_config({"fedsync.zzz": 1}, prefix=PREFIX)


def test_a_wrong_value_under_the_prefix_names_the_key() -> None:
    with pytest.raises(SettingsError, match="'buffer-size' must be int"):
        RunConfig.from_run_config({"fedsync.buffer-size": "five"}, prefix=PREFIX)


def test_a_flattened_nested_table_reads_as_the_prefixed_keys() -> None:
    # What Flower makes of the user's pyproject.toml (its own flattening).
    app = tomllib.loads(
        """
        learning-rate = 0.5
        epochs = 4

        [fedsync]
        strategy = "fedasync"
        max-aggregations = 12

        [fedsync.not-ours]
        x = 1
        """
    )
    flat = flatten_dict(app)
    assert flat["fedsync.max-aggregations"] == 12
    with pytest.raises(SettingsError, match=re.escape("'fedsync.not-ours.x'")):
        RunConfig.from_run_config(flat, prefix=PREFIX)
    del flat["fedsync.not-ours.x"]
    config = RunConfig.from_run_config(flat, prefix=PREFIX)
    assert (config.strategy, config.stop.max_aggregations) == ("fedasync", 12)
    assert config.training.learning_rate == RunConfig().training.learning_rate  # not 0.5


def test_without_a_prefix_nothing_changes() -> None:
    values = {"buffer-size": 4, "fedsync.buffer-size": 9, "whatever": 1}
    config = RunConfig.from_run_config(values)
    assert config.asynchronous.buffer_size == 4  # undeclared keys ignored here
    with pytest.raises(
        SettingsError, match=re.escape("unknown run-config key 'fedsync.buffer-size'")
    ):
        check_keys(values)
    with pytest.raises(SettingsError, match="did you mean 'buffer-size'"):
        check_keys(["bufer-size"])
    with pytest.raises(
        SettingsError, match=re.escape("'x.bufer-size'; did you mean 'x.buffer-size'")
    ):
        check_keys(["bufer-size"], prefix="x.")
    assert RunConfig.of(buffer_size=4).asynchronous.buffer_size == 4
