"""Tiny Shakespeare: speech parsing, windows, the natural split by speaker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedsync.data import DatasetError, clear_caches, load_dataset, load_partition
from fedsync.data.shakespeare import load_shakespeare, parse_speeches

PLAY = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?
Is't a verdict:
aye.

all:
Resolved.  resolved.
"""


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    clear_caches()


def test_parse_speeches() -> None:
    speeches = parse_speeches(PLAY)
    assert [s.speaker for s in speeches] == ["FIRST CITIZEN", "ALL", "FIRST CITIZEN", "ALL"]
    # A verse line ending in ':' inside a speech does not start a new one.
    assert (
        speeches[2].text
        == "You are all resolved rather to die than to famish? Is't a verdict: aye."
    )


def test_small_play_windows(tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_text(PLAY * 20)
    splits = load_shakespeare({"text": path}, seq_len=10, stride=3, max_windows=50, min_speeches=1)
    assert splits.group_names == ("ALL", "FIRST CITIZEN")
    assert splits.groups is not None
    assert splits.input_shape == (10,)
    assert splits.train.x.dtype == np.uint8
    vocab = splits.class_names
    assert vocab is not None and list(vocab) == sorted(vocab) and "\n" not in vocab
    assert np.bincount(splits.groups).max() <= 50  # the per-speaker cap
    # Each target is the character right after its window in the speaker's text.
    text = " ".join(s.text for s in parse_speeches(PLAY * 20) if s.speaker == "ALL")
    window = "".join(vocab[i] for i in splits.train.x[0])
    assert text.startswith(window + vocab[splits.train.y[0]])


def test_min_speeches_filters_speakers(tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_text(PLAY * 3)
    with pytest.raises(DatasetError, match="min_speeches"):
        load_shakespeare({"text": path}, seq_len=10, min_speeches=100)


def test_real_shakespeare_natural_split(shared_data_dir: Path) -> None:
    splits = load_dataset("shakespeare", shared_data_dir)
    assert splits.groups is not None and splits.group_names is not None
    # README: 145 speakers have at least 10 speeches.
    assert splits.num_groups == len(splits.group_names) == 145
    assert splits.num_classes == len(splits.class_names or ()) == 64
    assert splits.input_shape == (80,)
    counts = np.bincount(splits.groups)
    assert counts.min() >= 1 and counts.max() <= 1000
    assert len(splits.train) == counts.sum()
    assert 0.05 < len(splits.test) / len(splits.train) < 0.15
    assert "ROMEO" in splits.group_names and "GLOUCESTER" in splits.group_names

    train, val = load_partition("shakespeare", 0, 145, "natural", data_dir=str(shared_data_dir))
    assert len(train) + len(val) == counts[0]


def test_min_speeches_option(shared_data_dir: Path) -> None:
    more = load_dataset("shakespeare", shared_data_dir, min_speeches=1)
    assert more.num_groups > 145
    assert more.num_classes == 64  # the vocabulary does not depend on the filter
