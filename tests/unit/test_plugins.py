"""Plug points by import path: ``model`` and ``dataset`` naming the user's own code.

A real package is written to ``tmp_path`` and put on ``sys.path``, as a user's app
would be installed: a small MLP factory and a loader built on scikit-learn's bundled
wine data (real data, no download).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fedsync.config import RunConfig, SettingsError
from fedsync.data import DatasetError, clear_caches, dataset_info, load_dataset, locate_dataset
from fedsync.data.registry import DEFAULT_TRAINING, download_dataset
from fedsync.models import build_model, default_model_for, evaluate, train
from fedsync.models.registry import model_factory
from fedsync.plugins import (
    PluginAttributeError,
    PluginError,
    PluginImportError,
    PluginNotCallableError,
    PluginPathError,
    PluginSignatureError,
    is_import_path,
    load_object,
)
from fedsync.recipe import client_data, dataset_for, model_for
from fedsync.simulations.cli import app, parse_run_config

PACKAGE = "fedsync_user_app"
MODULE = f"{PACKAGE}.task"
MODEL = f"{MODULE}:make_net"
DATASET = f"{MODULE}:load_wine_splits"

TASK_SOURCE = '''
"""A user's Flower app: its own model and data, for fedsync to train."""

import numpy as np
from sklearn.datasets import load_wine
from torch import nn
from typer.testing import CliRunner

from fedsync.data import ArrayDataset, DatasetSplits

LOADS = []
NOT_CALLABLE = 3


def make_net(input_shape, num_classes):
    features = int(np.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, num_classes)
    )


class Nets:
    @staticmethod
    def linear(input_shape, num_classes):
        return nn.Linear(int(np.prod(input_shape)), num_classes)


def not_a_module(input_shape, num_classes):
    return "a network"


def load_wine_splits(*, seed, data_dir):
    LOADS.append((seed, data_dir))
    data = load_wine()
    x = ((data.data - data.data.mean(0)) / data.data.std(0)).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    train, test = order[:140], order[140:]
    return DatasetSplits(
        train=ArrayDataset(x[train], y[train]),
        test=ArrayDataset(x[test], y[test]),
        num_classes=3,
        input_shape=(13,),
        groups=None,
        name="wine",
    )


def without_data_dir(*, seed):
    raise AssertionError("never called")


def not_splits(*, seed, data_dir):
    return {"x": [1.0]}
'''


def _forget_package() -> None:
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's package on ``sys.path``, imported afresh by every test."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(TASK_SOURCE)
    (package / "broken.py").write_text("import fedsync_no_such_dependency\n")
    _forget_package()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    _forget_package()
    clear_caches()


def user_module() -> Any:
    """The user's module, as imported by the code under test."""
    return sys.modules[MODULE]


# --- fedsync.plugins -------------------------------------------------------------------------
def test_a_colon_marks_an_import_path() -> None:
    assert is_import_path(MODEL)
    assert not is_import_path("mlp") and not is_import_path("fashion-mnist")


def test_load_object_imports_the_module_and_returns_the_callable() -> None:
    factory = load_object(f" {MODEL} ", "model")
    assert factory is user_module().make_net
    nested = load_object(f"{MODULE}:Nets.linear", "model")
    assert isinstance(nested((13,), 3), nn.Linear)


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        (f"{MODULE}:", PluginPathError, "expected 'package.module:name'"),
        (":make_net", PluginPathError, "expected 'package.module:name'"),
        (f"{MODULE}:make_net:x", PluginPathError, "not an import path"),
        ("my-app.task:make_net", PluginPathError, "not an import path"),
        (
            "fedsync_no_such_app.nets:make_net",
            PluginImportError,
            "cannot import module 'fedsync_no_such_app.nets' \\(ModuleNotFoundError: "
            "No module named 'fedsync_no_such_app'\\)",
        ),
        (
            f"{PACKAGE}.broken:make_net",
            PluginImportError,
            f"cannot import module '{PACKAGE}.broken' \\(ModuleNotFoundError: "
            "No module named 'fedsync_no_such_dependency'\\)",
        ),
        (
            f"{MODULE}:make_nett",
            PluginAttributeError,
            f"'{MODULE}' has no attribute 'make_nett'; did you mean 'make_net'\\?",
        ),
        (f"{MODULE}:Nets.conv", PluginAttributeError, f"'{MODULE}:Nets' has no attribute 'conv'"),
        (f"{MODULE}:NOT_CALLABLE", PluginNotCallableError, "is a int, not a function or class"),
    ],
)
def test_load_object_says_why_a_path_does_not_resolve(
    path: str, error: type[PluginError], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        load_object(path, "model")
    assert isinstance(caught.value, ValueError)  # caught like a SettingsError
    assert str(caught.value).startswith(f"model {path!r}")


# --- the registries --------------------------------------------------------------------------
def test_build_model_takes_a_factorys_import_path() -> None:
    model = build_model(MODEL, 3, (13,), seed=7)
    assert model(torch.zeros(4, 13)).shape == (4, 3)
    again = build_model(MODEL, 3, [13], seed=7)  # same seed, same weights
    for left, right in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(left, right)
    assert model_factory(MODEL) is user_module().make_net
    assert isinstance(build_model("mlp", 3, (13,)), nn.Module)  # bundled names still work


def test_a_factory_must_return_a_module_and_take_the_shape_and_classes() -> None:
    with pytest.raises(PluginError, match=re.escape("returned a str, not a torch.nn.Module")):
        build_model(f"{MODULE}:not_a_module", 3, (13,))
    with pytest.raises(PluginSignatureError, match="cannot be called as factory"):
        build_model(f"{MODULE}:without_data_dir", 3, (13,))


def test_load_dataset_calls_the_loader_once_per_seed_and_shares_read_only_splits() -> None:
    splits = load_dataset(DATASET, seed=1)
    assert splits.name == DATASET
    assert (splits.num_classes, splits.input_shape) == (3, (13,))
    assert (len(splits.train), len(splits.test)) == (140, 38)
    assert not splits.train.x.flags.writeable and not splits.test.y.flags.writeable
    assert load_dataset(DATASET, "", seed=1) is splits  # cached: "" is no data-dir
    assert load_dataset(DATASET, seed=2) is not splits
    load_dataset(DATASET, Path("/srv/data"), seed=1)
    loads = user_module().LOADS
    assert loads == [(1, None), (2, None), (1, "/srv/data")]


def test_an_import_path_dataset_has_no_files_and_no_default_model() -> None:
    info = dataset_info(DATASET)
    assert info.external and info.training == DEFAULT_TRAINING and info.default_model == ""
    assert locate_dataset(DATASET) == {}
    with pytest.raises(DatasetError, match="fedsync downloads nothing"):
        download_dataset(DATASET)
    with pytest.raises(ValueError, match="model 'auto' has no default for the import-path"):
        default_model_for(DATASET)
    with pytest.raises(ValueError, match="model 'auto' has no default"):
        build_model("auto", 3, (13,), dataset=DATASET)


def test_a_loader_must_return_splits_and_take_seed_and_data_dir() -> None:
    with pytest.raises(
        DatasetError, match=re.escape("returned a dict, not fedsync.data.DatasetSplits")
    ):
        load_dataset(f"{MODULE}:not_splits")
    with pytest.raises(PluginSignatureError, match="cannot be called as loader"):
        load_dataset(f"{MODULE}:without_data_dir")


# --- the run config --------------------------------------------------------------------------
def test_the_run_config_takes_import_paths_and_the_default_training() -> None:
    config = RunConfig.of(dataset=DATASET, model=MODEL)
    training = config.training
    assert (training.dataset, training.model) == (DATASET, MODEL)
    assert training.partitioning == DEFAULT_TRAINING.partitioning == "dirichlet"
    assert training.learning_rate == DEFAULT_TRAINING.learning_rate == 0.1
    assert training.local_epochs == DEFAULT_TRAINING.local_epochs == 3
    assert RunConfig.from_run_config(config.as_run_config()) == config
    own = RunConfig.of(dataset=DATASET, model="mlp", learning_rate=0.02, partitioning="iid")
    assert (own.training.learning_rate, own.training.partitioning) == (0.02, "iid")


def test_model_auto_with_an_import_path_dataset_asks_for_a_model() -> None:
    with pytest.raises(
        SettingsError,
        match="run config 'model' must be named for the import-path dataset "
        f"'{DATASET}' \\('auto' picks a model for a bundled dataset only\\)",
    ):
        RunConfig.of(dataset=DATASET)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": f"{MODULE}:make_nett"}, "run config 'model': model .* did you mean 'make_net'"),
        (
            {"model": "fedsync_no_such_app:make_net"},
            "run config 'model': .*cannot import module 'fedsync_no_such_app'",
        ),
        ({"model": f"{MODULE}:load_wine_splits"}, "run config 'model': .*cannot be called as"),
        (
            {"dataset": f"{MODULE}:load_splits", "model": "mlp"},
            "run config 'dataset': dataset .* has no attribute 'load_splits'",
        ),
        (
            {"dataset": f"{MODULE}:without_data_dir", "model": "mlp"},
            "run config 'dataset': .*cannot be called as loader",
        ),
        ({"dataset": "wine"}, "run config 'dataset': unknown dataset 'wine'.*package.module"),
        ({"model": "resnet"}, "'model' must be one of .*'package.module:factory'"),
    ],
)
def test_a_path_that_does_not_resolve_fails_when_the_config_is_read(
    values: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        RunConfig.of(**values)


def test_the_command_line_checks_import_paths_before_flower() -> None:
    values = parse_run_config([f"dataset='{DATASET}'", f"model='{MODEL}'"])
    assert (values["dataset"], values["model"]) == (DATASET, MODEL)
    runner = CliRunner()
    result = runner.invoke(app, ["run", "-c", "model='fedsync_no_such_app:make_net'"])
    assert result.exit_code == 2
    assert "run config 'model'" in result.output and "fedsync_no_such_app" in result.output
    result = runner.invoke(app, ["deploy", "--nodes", "2", "--run-config", f"dataset='{DATASET}'"])
    assert result.exit_code == 2 and "must be named for the import-path dataset" in result.output


def test_the_task_builds_the_users_model_and_data() -> None:
    settings = RunConfig.of(dataset=DATASET, model=MODEL, seed=3).training
    splits = dataset_for(settings)
    assert splits is load_dataset(DATASET, seed=3)
    model = model_for(settings)
    again = model_for(settings)
    for left, right in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(left, right)
    shares = [client_data(settings, client, 2) for client in range(2)]  # dirichlet
    assert sum(len(part) + len(held_out) for part, held_out in shares) == len(splits.train)
    before = evaluate(model, splits.test)["loss"]
    train(model, splits.train, epochs=settings.local_epochs, lr=settings.learning_rate, seed=3)
    after = evaluate(model, splits.test)
    assert after["loss"] < before and after["accuracy"] > 0.8  # wine is easy: it learns


def test_another_process_resolves_the_paths_by_import_alone(user_package: Path) -> None:
    # As a Ray worker or a SuperNode would: a fresh interpreter, nothing registered,
    # only the strings of the run config and the package on its path.
    script = textwrap.dedent(
        f"""
        from fedsync.config import RunConfig
        from fedsync.recipe import dataset_for, model_for
        settings = RunConfig.from_run_config({{"dataset": {DATASET!r}, "model": {MODEL!r}}})
        splits = dataset_for(settings.training)
        model = model_for(settings.training)
        print(splits.name, type(model).__name__, splits.num_classes)
        """
    )
    path = os.pathsep.join([str(user_package), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [DATASET, "Sequential", "3"]


def test_loader_arrays_are_real_wine_data() -> None:
    splits = load_dataset(DATASET, seed=0)
    labels = np.concatenate([splits.train.y, splits.test.y])
    assert np.bincount(labels).tolist() == [59, 71, 48]  # scikit-learn's wine classes
