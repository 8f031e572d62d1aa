"""The dataset registry, the file search order, caching and the image datasets."""

from __future__ import annotations

import gzip
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedsync.data import (
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    UnknownDatasetError,
    clear_caches,
    dataset_info,
    dataset_names,
    load_dataset,
)
from fedsync.data.locate import ENV_VAR, candidate_dirs
from fedsync.data.mnist import IDX_STEMS


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No FEDSYNC_DATA, an empty cache dir, and no network: any download attempt fails."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test tried to download")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    yield
    clear_caches()


def write_fake_mnist(folder: Path, label: int, n: int = 6, gz: bool = True) -> Path:
    """Four tiny valid IDX files whose labels are all ``label``."""
    folder.mkdir(parents=True, exist_ok=True)
    images = np.full((n, 28, 28), 255, dtype=np.uint8)
    labels = np.full(n, label, dtype=np.uint8)
    for key, stem in IDX_STEMS.items():
        array = images if key.endswith("images") else labels
        data = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
        data += array.tobytes()
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)
    return folder


# --- registry ----------------------------------------------------------------------


def test_registry_names() -> None:
    names = dataset_names()
    for expected in ("digits", "mnist", "fashion-mnist", "shakespeare", "synthetic"):
        assert expected in names


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(UnknownDatasetError, match=r"valid names: .*digits.*mnist") as info:
        load_dataset("cifar-1000")
    assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError)


def test_name_spelling_is_normalized() -> None:
    assert dataset_info("Fashion_MNIST").name == "fashion-mnist"


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(DatasetError, match="no option"):
        load_dataset("digits", color="blue")


def test_variant_settings_are_not_options() -> None:
    with pytest.raises(DatasetError, match="alpha"):
        load_dataset("synthetic-0-0", alpha=3.0)


# --- digits ------------------------------------------------------------------------


def test_digits() -> None:
    splits = load_dataset("digits")
    assert len(splits.train) + len(splits.test) == 1797
    assert len(splits.test) == 360
    assert splits.train.x.dtype == np.float32 and splits.input_shape == (64,)
    assert splits.train.x.min() >= 0.0 and splits.train.x.max() <= 1.0
    assert splits.train.y.dtype == np.int64 and splits.num_classes == 10
    # Stratified: every class keeps its share in the test split.
    assert np.bincount(splits.test.y).min() >= 35
    assert splits.groups is None


def test_digits_split_is_seeded() -> None:
    a, b, c = (load_dataset("digits", seed=s) for s in (0, 0, 1))
    assert a is b  # cached
    assert not np.array_equal(a.test.y, c.test.y)


def test_cached_arrays_are_read_only() -> None:
    splits = load_dataset("digits")
    with pytest.raises(ValueError, match="read-only"):
        splits.train.x[0, 0] = 1.0


# --- search order --------------------------------------------------------------------


def test_data_dir_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fake_mnist(tmp_path / "explicit" / "mnist", label=3)
    write_fake_mnist(tmp_path / "env" / "mnist", label=7)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert set(load_dataset("mnist", tmp_path / "explicit").train.y) == {3}
    assert set(load_dataset("mnist").train.y) == {7}
    assert set(load_dataset("mnist", "").train.y) == {7}  # "" = data-dir not set


def test_data_dir_may_be_the_dataset_folder_itself(tmp_path: Path) -> None:
    folder = write_fake_mnist(tmp_path / "my-mnist", label=2, gz=False)
    splits = load_dataset("mnist", folder)
    assert splits.train.x.shape == (6, 1, 28, 28)
    assert splits.train.x.max() == 1.0


def test_cache_dir_is_searched_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fake_mnist(tmp_path / "cache" / "fedsync" / "mnist", label=5)
    assert set(load_dataset("mnist").train.y) == {5}
    write_fake_mnist(tmp_path / "env" / "mnist", label=6)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    # The cache is keyed by the files found, so a new location is not answered stale.
    assert set(load_dataset("mnist").train.y) == {6}


def test_search_order_for_fashion_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    dirs = candidate_dirs("fashion-mnist", tmp_path / "dd", ("/usr/share/datasets/fashion-mnist",))
    assert dirs == [
        tmp_path / "dd" / "fashion-mnist",
        tmp_path / "dd",
        tmp_path / "env" / "fashion-mnist",
        Path("/usr/share/datasets/fashion-mnist"),
        tmp_path / "cache" / "fedsync" / "fashion-mnist",
    ]
    assert dataset_info("fashion-mnist").system_dirs == ("/usr/share/datasets/fashion-mnist",)


def test_missing_files_say_where_and_never_download(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="download=True") as info:
        load_dataset("mnist", tmp_path / "empty")
    assert str(tmp_path / "empty" / "mnist") in str(info.value)
    assert isinstance(info.value, DatasetError)


def test_a_folder_missing_one_file_is_skipped(tmp_path: Path) -> None:
    folder = write_fake_mnist(tmp_path / "mnist", label=1)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetNotFoundError):
        load_dataset("mnist", tmp_path)


def test_label_out_of_range_is_a_format_error(tmp_path: Path) -> None:
    write_fake_mnist(tmp_path / "mnist", label=12)
    with pytest.raises(DatasetFormatError, match="out of range"):
        load_dataset("mnist", tmp_path)


def test_mismatched_counts_are_a_format_error(tmp_path: Path) -> None:
    folder = write_fake_mnist(tmp_path / "mnist", label=1)
    labels = np.ones(5, dtype=np.uint8)
    data = bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + labels.tobytes()
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(data))
    with pytest.raises(DatasetFormatError, match="5 labels for 6 images"):
        load_dataset("mnist", tmp_path)


# --- the real image datasets -----------------------------------------------------------


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_image_dataset(shared_data_dir: Path, name: str) -> None:
    splits = load_dataset(name, shared_data_dir)
    assert splits.train.x.shape == (60_000, 1, 28, 28)
    assert splits.test.x.shape == (10_000, 1, 28, 28)
    assert splits.train.x.dtype == np.float32
    assert splits.input_shape == (1, 28, 28) and splits.num_classes == 10
    assert float(splits.train.x.min()) == 0.0 and float(splits.train.x.max()) == 1.0
    assert np.array_equal(np.unique(splits.test.y), np.arange(10))
    assert load_dataset(name, shared_data_dir) is splits
