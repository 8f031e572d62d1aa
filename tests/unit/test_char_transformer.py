"""The character transformer and Tiny Shakespeare as language modelling (every position)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsync.config import RunConfig
from fedsync.data import load_dataset
from fedsync.models import build_model, default_model_for, evaluate, train
from fedsync.models.char_transformer import CharTransformer
from fedsync.recipe import client_data

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_sizes_of_the_two_registered_transformers() -> None:
    small = build_model("char-gpt", 65, (128,))
    large = build_model("char-gpt-5m", 65, (128,))
    assert sum(p.numel() for p in small.parameters()) == 818_048  # about 0.8M
    assert sum(p.numel() for p in large.parameters()) == 4_788_480  # about 4.8M
    assert default_model_for("shakespeare-lm") == "char-gpt"


def test_logits_at_a_position_see_only_the_tokens_before_it() -> None:
    model = CharTransformer((16,), 20, width=32, layers=2, heads=4).eval()
    ids = torch.randint(0, 20, (2, 16))
    changed = ids.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 20
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert before.shape == (2, 16, 20)
    torch.testing.assert_close(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_bad_sizes_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        CharTransformer((16,), 20, width=30, heads=4)
    with pytest.raises(ValueError, match="context"):
        CharTransformer((8,), 20, width=32)(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="dropout"):
        CharTransformer((8,), 20, dropout=1.0)


def test_the_same_seed_gives_the_same_weights() -> None:
    one = build_model("char-gpt", 65, (32,), seed=3).state_dict()
    two = build_model("char-gpt", 65, (32,), seed=3).state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_every_position_has_the_next_character_as_its_target() -> None:
    splits = load_dataset("shakespeare-lm", DATA)
    x, y = splits.train.x, splits.train.y
    assert x.shape[1:] == (128,) and y.shape == x.shape
    assert np.array_equal(y[:, :-1], x[:, 1:])  # the window shifted by one
    # Windows do not overlap: a speaker's next window starts where this one's last
    # target is, so each character is a target once.
    assert splits.groups is not None
    same = splits.groups[1:] == splits.groups[:-1]
    assert same.sum() > 6000 and np.array_equal(y[:-1][same, -1], x[1:][same, 0])
    assert splits.num_groups == 145 and len(splits.test) > 0
    assert splits.class_names == load_dataset("shakespeare", DATA).class_names


def test_sites_split_by_speaker_or_iid_but_not_by_label_skew() -> None:
    base = {"dataset": "shakespeare-lm", "data-dir": str(DATA), "model": "char-gpt"}
    natural = RunConfig.from_run_config(base).training
    assert natural.partitioning == "natural"
    parts = [client_data(natural, p, 4) for p in range(4)]
    assert sum(len(t) + len(v) for t, v in parts) == len(load_dataset("shakespeare-lm", DATA).train)
    iid = RunConfig.from_run_config({**base, "partitioning": "iid"}).training
    assert len(client_data(iid, 0, 4)[0]) > 0
    skewed = RunConfig.from_run_config({**base, "partitioning": "dirichlet"}).training
    with pytest.raises(ValueError, match="target per position"):
        client_data(skewed, 0, 4)


def test_training_lowers_the_per_token_loss_and_evaluation_counts_tokens() -> None:
    splits = load_dataset("shakespeare-lm", DATA)
    model = CharTransformer((128,), splits.num_classes, width=32, layers=1, heads=2, dropout=0.0)
    train_set = splits.train.subset(np.arange(64))
    before = evaluate(model, train_set)
    assert before["num_examples"] == 64
    assert before["loss"] == pytest.approx(np.log(splits.num_classes), rel=0.05)
    train(model, train_set, epochs=6, batch_size=16, lr=0.01, optimizer="adamw", seed=0)
    after = evaluate(model, train_set)
    assert after["loss"] < before["loss"] - 0.5
    # Accuracy is over the 64 x 128 targets: counted by hand.
    model.eval()
    with torch.no_grad():
        guesses = model(torch.from_numpy(train_set.x.astype(np.int64))).argmax(dim=-1)
    hits = int((guesses == torch.from_numpy(train_set.y)).sum())
    assert after["accuracy"] == pytest.approx(hits / (64 * 128))


def test_dropout_repeats_with_the_tasks_seed_whatever_ran_before() -> None:
    """Dropout draws from torch's global generator: training seeds it per call (and puts
    it back), so a task gives the same model in any process history."""
    splits = load_dataset("shakespeare-lm", DATA)
    data = splits.train.subset(np.arange(32))
    models = []
    for noise in (1, 50):
        torch.randn(noise)  # a different history of the global generator
        model = CharTransformer((128,), splits.num_classes, width=32, layers=1, heads=2)
        model.load_state_dict(_seeded_state(splits.num_classes))
        before = torch.random.get_rng_state()
        train(model, data, epochs=2, batch_size=16, lr=0.01, optimizer="adamw", seed=4)
        assert torch.equal(torch.random.get_rng_state(), before)  # put back
        models.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert torch.equal(models[0], models[1])
    other = CharTransformer((128,), splits.num_classes, width=32, layers=1, heads=2)
    other.load_state_dict(_seeded_state(splits.num_classes))
    train(other, data, epochs=2, batch_size=16, lr=0.01, optimizer="adamw", seed=5)
    assert not torch.equal(
        models[0], torch.cat([p.detach().reshape(-1) for p in other.parameters()])
    )


def _seeded_state(vocab: int) -> dict[str, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return CharTransformer((128,), vocab, width=32, layers=1, heads=2).state_dict()
