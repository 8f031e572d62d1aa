"""Model registry, output shapes, deterministic init, and the train/evaluate loops."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from fedsync.data import ArrayDataset, clear_caches, load_dataset
from fedsync.models import build_model, default_model_for, evaluate, model_names, train


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    clear_caches()


SMALL_LSTM: dict[str, Any] = {"hidden_size": 16, "num_layers": 2}


@pytest.mark.parametrize(
    ("name", "input_shape", "num_classes", "x", "kwargs"),
    [
        ("mlp", (64,), 10, torch.rand(5, 64), {}),
        ("mlp", (1, 28, 28), 10, torch.rand(5, 1, 28, 28), {"hidden": (32, 16)}),
        ("mlp-wide", (64,), 10, torch.rand(5, 64), {}),
        ("cnn", (1, 28, 28), 10, torch.rand(5, 1, 28, 28), {}),
        ("cnn", (3, 32, 32), 7, torch.rand(5, 3, 32, 32), {}),
        ("char-lstm", (80,), 64, torch.randint(0, 64, (5, 80)), SMALL_LSTM),
        ("logreg", (60,), 10, torch.randn(5, 60), {}),
    ],
)
def test_output_shapes(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    x: torch.Tensor,
    kwargs: dict[str, Any],
) -> None:
    model = build_model(name, num_classes, input_shape, **kwargs)
    assert model(x).shape == (5, num_classes)


def test_char_lstm_accepts_uint8_ids() -> None:
    model = build_model("char_lstm", 64, (10,), **SMALL_LSTM)  # "_" reads as "-"
    ids = torch.randint(0, 64, (3, 10), dtype=torch.uint8)
    assert model(ids).shape == (3, 64)


def test_default_models() -> None:
    assert model_names() == (
        "char-gpt",
        "char-gpt-5m",
        "char-lstm",
        "char-lstm-small",
        "cnn",
        "logreg",
        "mlp",
        "mlp-wide",
    )
    assert default_model_for("digits") == "mlp"
    assert default_model_for("mnist") == default_model_for("fashion-mnist") == "cnn"
    assert default_model_for("shakespeare") == "char-lstm-small"
    assert default_model_for("synthetic-0.5-0.5") == "logreg"
    model = build_model("auto", 10, (1, 28, 28), dataset="fashion-mnist")
    assert type(model).__name__ == "LeNet5"


def test_wide_mlp_weighs_over_a_megabyte_dense() -> None:
    model = build_model("mlp-wide", 10, (64,))
    # 64x512 + 512x512 + 512x10 weights and their biases: 1.2 MB as float32.
    assert sum(p.numel() for p in model.parameters()) == 301_066 >= 262_144


def test_bad_names() -> None:
    with pytest.raises(
        ValueError,
        match="valid: char-gpt, char-gpt-5m, char-lstm, char-lstm-small, cnn, logreg, mlp, "
        "mlp-wide",
    ):
        build_model("resnet-9000", 10, (64,))
    with pytest.raises(ValueError, match="needs the dataset"):
        build_model("auto", 10, (64,))
    with pytest.raises(ValueError, match="12x12"):
        build_model("cnn", 10, (1, 8, 8))


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_init_is_deterministic() -> None:
    torch.manual_seed(0)
    a = _weights(build_model("cnn", 10, (1, 28, 28)))
    torch.manual_seed(0)
    b = _weights(build_model("cnn", 10, (1, 28, 28)))
    c = _weights(build_model("cnn", 10, (1, 28, 28)))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_seed_argument_leaves_global_rng_alone() -> None:
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    a = _weights(build_model("mlp", 10, (64,), seed=7))
    assert torch.equal(torch.rand(3), expected)
    b = _weights(build_model("mlp", 10, (64,), seed=7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# --- training -------------------------------------------------------------------------


def _toy(n: int = 256) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return ArrayDataset(x, y)


def test_train_reduces_loss_and_reports() -> None:
    data = _toy()
    model = build_model("logreg", 2, (8,), seed=0)
    before = evaluate(model, data)
    result = train(model, data, epochs=3, batch_size=32, lr=0.1, momentum=0.9)
    after = evaluate(model, data)
    assert result["num_examples"] == 256 and result["steps"] == 24
    assert after["loss"] < before["loss"] and after["accuracy"] > 0.9
    assert set(after) == {"loss", "accuracy", "num_examples"}


def test_train_is_deterministic_per_seed() -> None:
    data = _toy()
    runs = []
    for seed in (3, 3, 4):
        model = build_model("mlp", 2, (8,), seed=0)
        train(model, data, epochs=1, batch_size=16, lr=0.1, seed=seed)
        runs.append(_weights(model))
    assert all(torch.equal(x, y) for x, y in zip(runs[0], runs[1], strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(runs[0], runs[2], strict=True))


def test_max_steps() -> None:
    model = build_model("logreg", 2, (8,), seed=0)
    assert train(model, _toy(), epochs=10, batch_size=8, max_steps=5)["steps"] == 5
    assert train(model, _toy(), epochs=10, batch_size=8, max_steps=0)["steps"] == 0


def test_proximal_term_keeps_weights_near_global() -> None:
    data = _toy()
    start = build_model("mlp", 2, (8,), seed=0)
    anchor = {name: p.detach().clone() for name, p in start.named_parameters()}

    def drift(mu: float) -> float:
        model = build_model("mlp", 2, (8,), seed=0)
        train(model, data, epochs=5, batch_size=16, lr=0.1, proximal_mu=mu, global_params=anchor)
        return sum(
            float((p.detach() - anchor[n]).pow(2).sum()) for n, p in model.named_parameters()
        )

    assert drift(10.0) < 0.5 * drift(0.0)


def test_proximal_default_anchor_is_starting_point() -> None:
    # Without global_params the anchor is the model as passed in: mu large keeps it there.
    model = build_model("logreg", 2, (8,), seed=0)
    before = _weights(model)
    train(model, _toy(), epochs=2, lr=0.01, proximal_mu=50.0)  # lr * mu < 2: stable
    moved = sum(float((a - b).abs().max()) for a, b in zip(before, _weights(model), strict=True))
    assert moved < 0.05


def test_global_params_shape_checked() -> None:
    model = build_model("logreg", 2, (8,), seed=0)
    with pytest.raises(ValueError, match="tensors"):
        train(model, _toy(), proximal_mu=0.1, global_params=[torch.zeros(2)])


def test_empty_datasets() -> None:
    empty = ArrayDataset(np.zeros((0, 8), np.float32), np.zeros(0, np.int64))
    model = build_model("logreg", 2, (8,), seed=0)
    assert train(model, empty) == {"train_loss": 0.0, "num_examples": 0, "steps": 0}
    assert evaluate(model, empty) == {"loss": 0.0, "accuracy": 0.0, "num_examples": 0}


def test_evaluate_restores_mode() -> None:
    model = build_model("mlp", 2, (8,), seed=0)
    model.train()
    evaluate(model, _toy())
    assert model.training


def test_train_on_shakespeare_ids() -> None:
    ids = np.random.default_rng(0).integers(0, 20, size=(64, 12)).astype(np.uint8)
    data = ArrayDataset(ids, ids[:, 0].astype(np.int64))
    model = build_model("char-lstm", 20, (12,), **SMALL_LSTM, seed=0)
    result = train(model, data, epochs=1, batch_size=16, lr=0.5, max_grad_norm=1.0)
    assert result["steps"] == 4 and np.isfinite(result["train_loss"])


@pytest.mark.timeout(60)
def test_centralized_mlp_on_digits_reaches_95_percent() -> None:
    # The app's sanity target: a few seconds of CPU training, >= 95 % test accuracy.
    splits = load_dataset("digits", seed=0)
    model = build_model("auto", splits.num_classes, splits.input_shape, dataset="digits", seed=0)
    start = time.perf_counter()
    train(model, splits.train, epochs=20, batch_size=32, lr=0.05, momentum=0.9, seed=0)
    elapsed = time.perf_counter() - start
    result = evaluate(model, splits.test)
    assert result["accuracy"] >= 0.95, result
    assert result["num_examples"] == 360
    assert elapsed < 30  # typically well under a second; generous for loaded CI machines


def test_char_lstm_small_is_one_layer_of_128() -> None:
    model = build_model("char-lstm-small", 64, (80,), seed=0)
    assert sum(p.numel() for p in model.parameters()) == 79_424
    assert model(torch.randint(0, 64, (3, 80))).shape == (3, 64)
