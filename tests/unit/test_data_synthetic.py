"""FedProx's Synthetic(alpha, beta) generator."""

from __future__ import annotations

import numpy as np

from fedsync.data import load_dataset
from fedsync.data.synthetic import generate_synthetic


def test_shapes_and_groups() -> None:
    splits = generate_synthetic(1.0, 1.0, seed=0)
    assert splits.input_shape == (60,) and splits.num_classes == 10
    assert splits.train.x.dtype == np.float32 and splits.train.y.dtype == np.int64
    assert splits.groups is not None and splits.num_groups == 30
    # Every client has at least 50 samples, 90 % of them in train.
    assert np.bincount(splits.groups).min() >= 45
    assert 0.08 < len(splits.test) / (len(splits.train) + len(splits.test)) < 0.12


def test_deterministic_per_seed() -> None:
    a, b, c = generate_synthetic(seed=3), generate_synthetic(seed=3), generate_synthetic(seed=4)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    np.testing.assert_array_equal(a.groups, b.groups)
    assert len(a.train) != len(c.train) or not np.array_equal(a.train.x, c.train.x)


def _label_divergence(alpha: float, beta: float, iid: bool = False) -> float:
    """Mean total-variation distance of each client's labels from the pooled ones."""
    splits = generate_synthetic(alpha, beta, iid=iid, num_clients=40, seed=1)
    assert splits.groups is not None
    pooled = np.bincount(splits.train.y, minlength=10) / len(splits.train)
    distances = []
    for k in range(40):
        local = np.bincount(splits.train.y[splits.groups == k], minlength=10)
        distances.append(0.5 * np.abs(local / local.sum() - pooled).sum())
    return float(np.mean(distances))


def test_heterogeneity_grows_with_alpha_beta() -> None:
    # IID shares one labelling rule (small divergence); every non-IID client draws its
    # own, and wider alpha/beta spreads them further.
    iid = _label_divergence(0.0, 0.0, iid=True)
    assert iid < 0.2
    assert iid < _label_divergence(0.0, 0.0) < _label_divergence(1.0, 1.0)


def test_registry_variants() -> None:
    fixed = load_dataset("synthetic-0.5-0.5", seed=2)
    free = load_dataset("synthetic", seed=2, alpha=0.5, beta=0.5)
    assert fixed.name == "synthetic-0.5-0.5"
    np.testing.assert_array_equal(fixed.train.x, free.train.x)
    assert load_dataset("synthetic-iid").name == "synthetic-iid"
    assert load_dataset("synthetic", num_clients=5).num_groups == 5
