"""The norm check on arriving updates: absolute cap, median-relative cap, settings."""

from __future__ import annotations

import math

import pytest
import torch

from fedsync.aggregation.guard import UpdateNormGuard, update_norm
from fedsync.config import GuardSection, SettingsError
from fedsync.updates import SparseTensor, TensorSpec


def test_update_norm_over_sparse_tensors() -> None:
    spec = TensorSpec("w", (10,))
    update = {
        "w": SparseTensor(spec, torch.tensor([1, 4]), torch.tensor([3.0, 4.0])),
        "b": SparseTensor(TensorSpec("b", (2,)), torch.tensor([0]), torch.tensor([12.0])),
    }
    assert update_norm(update) == pytest.approx(13.0)
    assert update_norm({}) == 0.0


def test_absolute_cap() -> None:
    guard = UpdateNormGuard(max_norm=10.0, outlier_factor=0.0)
    assert guard.check(9.9) == ""
    assert "max-update-norm" in guard.check(10.5)
    assert "nan" in guard.check(math.nan)
    assert guard.rejected == 2


def test_relative_cap_waits_for_history_and_follows_the_median() -> None:
    guard = UpdateNormGuard(outlier_factor=10.0, min_history=3, window=4)
    assert guard.check(1e9) == ""  # no history yet: only the absolute cap (off) judges
    for norm in (1.0, 2.0, 3.0):
        assert guard.check(norm) == ""
        guard.accept(norm)
    assert guard.check(19.0) == ""
    assert "median 2" in guard.check(21.0)
    for norm in (0.1, 0.1, 0.1, 0.1):  # norms shrink as training converges
        guard.accept(norm)
    assert guard.check(2.0) != ""  # the window forgot the early, larger norms
    summary = guard.summary()
    assert summary["rejected"] == 2 and summary["largest_accepted_norm"] == 3.0


def test_settings() -> None:
    guard = UpdateNormGuard.from_section(
        GuardSection.from_run_config({"max-update-norm": 5, "norm-outlier-factor": 0})
    )
    assert (guard.max_norm, guard.outlier_factor) == (5.0, 0.0)
    assert UpdateNormGuard.from_section(GuardSection()).outlier_factor == 100.0
    with pytest.raises(SettingsError, match="max-update-norm"):
        GuardSection(max_update_norm=-1.0)
    with pytest.raises(SettingsError, match="norm-outlier-factor"):
        GuardSection(norm_outlier_factor=0.5)
    with pytest.raises(ValueError, match="max-update-norm"):
        UpdateNormGuard(max_norm=-1.0)
    with pytest.raises(SettingsError, match="must be float"):
        GuardSection.from_run_config({"max-update-norm": "big"})
