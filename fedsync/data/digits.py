"""scikit-learn's bundled 8x8 digits: the quick-start and CI dataset (no download)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits as _sk_load_digits
from sklearn.model_selection import train_test_split

from fedsync.data.types import ArrayDataset, DatasetSplits

TEST_FRACTION = 0.2
_MAX_PIXEL = 16.0  # the digits are 4-bit grey levels, 0..16


def load_digits(files: Mapping[str, Path], *, seed: int = 0) -> DatasetSplits:
    """1,797 real 8x8 digit images, flattened to 64 features in [0, 1].

    Parameters
    ----------
    files : mapping
        Unused (the data ships inside scikit-learn); present for the registry's
        uniform loader signature.
    seed : int
        Seed of the stratified 80/20 train/test split.
    """
    del files
    x, y = _sk_load_digits(return_X_y=True)
    x = (x / _MAX_PIXEL).astype(np.float32)
    y = y.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=seed
    )
    return DatasetSplits(
        train=ArrayDataset(x_train, y_train),
        test=ArrayDataset(x_test, y_test),
        num_classes=10,
        input_shape=(64,),
        groups=None,
        name="digits",
        class_names=tuple(str(d) for d in range(10)),
    )
