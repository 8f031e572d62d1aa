"""MNIST and Fashion-MNIST from their four official IDX files.

Both datasets ship as the same four files (train/test images and labels), gzipped or
not, and share one loader; only the search folders, the download URLs and the class
names differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedsync.data.download import RemoteFile
from fedsync.data.idx import read_idx
from fedsync.data.types import ArrayDataset, DatasetFormatError, DatasetSplits

NUM_CLASSES = 10

IDX_STEMS: dict[str, str] = {
    "train-images": "train-images-idx3-ubyte",
    "train-labels": "train-labels-idx1-ubyte",
    "test-images": "t10k-images-idx3-ubyte",
    "test-labels": "t10k-labels-idx1-ubyte",
}
"""Logical file key to the official file name without ``.gz``."""

FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_FASHION_MD5 = {  # of the .gz files, as Zalando publishes them
    "train-images": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels": "25c81989df183df01b3e8a0aad5dffbe",
    "test-images": "bef4ecab320f06d8554ea6380940ec79",
    "test-labels": "bb300cfdad3c16e7a12a480ee83cd310",
}
_MNIST_URLS = (
    "https://yann.lecun.com/exdb/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)
_MNIST_MD5 = {  # of the *uncompressed* files, as LeCun's page publishes them
    "train-images": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels": "a25bea736e30d166cdddb491f175f624",
    "test-images": "2646ac647ad5339dbf082846283269ea",
    "test-labels": "27ae3e4e09519cfbb04c329615203637",
}


def idx_file_names() -> dict[str, tuple[str, ...]]:
    """File names accepted per logical file: gzipped first, then raw, then the
    ``train-images.idx3-ubyte`` spelling some mirrors use."""
    names: dict[str, tuple[str, ...]] = {}
    for key, stem in IDX_STEMS.items():
        dotted = stem.replace("-idx", ".idx")
        names[key] = (f"{stem}.gz", stem, f"{dotted}.gz", dotted)
    return names


def fashion_remote_files() -> tuple[RemoteFile, ...]:
    """The official Fashion-MNIST files (md5 of the ``.gz``)."""
    return tuple(
        RemoteFile(f"{IDX_STEMS[key]}.gz", (f"{_FASHION_URL}{IDX_STEMS[key]}.gz",), md5)
        for key, md5 in _FASHION_MD5.items()
    )


def mnist_remote_files() -> tuple[RemoteFile, ...]:
    """The official MNIST files (md5 of the uncompressed content), with a mirror."""
    return tuple(
        RemoteFile(
            f"{IDX_STEMS[key]}.gz",
            tuple(f"{base}{IDX_STEMS[key]}.gz" for base in _MNIST_URLS),
            md5,
            md5_of_uncompressed=True,
        )
        for key, md5 in _MNIST_MD5.items()
    )


def load_idx_images(
    files: Mapping[str, Path],
    *,
    name: str,
    class_names: tuple[str, ...] | None = None,
) -> DatasetSplits:
    """Load the four IDX files into float32 images in [0, 1], shape ``(N, 1, H, W)``.

    Parameters
    ----------
    files : mapping of str to Path
        The paths of ``train-images``, ``train-labels``, ``test-images``, ``test-labels``.
    name : str
        Registry name recorded in the result.
    class_names : tuple of str, optional
        Readable class names.

    Raises
    ------
    DatasetFormatError
        A malformed file, images that are not uint8 ``(N, H, W)``, labels that are not
        uint8 ``(N,)`` in ``0..9``, or image and label counts that differ.
    """
    train = _load_pair(files["train-images"], files["train-labels"])
    test = _load_pair(files["test-images"], files["test-labels"])
    if train.x.shape[1:] != test.x.shape[1:]:
        raise DatasetFormatError(
            files["test-images"],
            f"test images are {test.x.shape[2:]}, train images {train.x.shape[2:]}",
        )
    return DatasetSplits(
        train=train,
        test=test,
        num_classes=NUM_CLASSES,
        input_shape=tuple(int(d) for d in train.x.shape[1:]),
        groups=None,
        name=name,
        class_names=class_names,
    )


def _load_pair(images_path: Path, labels_path: Path) -> ArrayDataset:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DatasetFormatError(
            images_path, f"expected uint8 images (N, H, W), got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DatasetFormatError(
            labels_path, f"expected uint8 labels (N,), got {labels.dtype} {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DatasetFormatError(
            labels_path, f"{labels.shape[0]} labels for {images.shape[0]} images in {images_path}"
        )
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise DatasetFormatError(
            labels_path, f"label {int(labels.max())} out of range 0..{NUM_CLASSES - 1}"
        )
    n, h, w = images.shape
    x = images.reshape(n, 1, h, w).astype(np.float32)
    x /= np.float32(255.0)  # in place: the float copy is the only big allocation
    return ArrayDataset(x, labels.astype(np.int64))


def load_mnist(files: Mapping[str, Path]) -> DatasetSplits:
    """MNIST handwritten digits (registry builder)."""
    return load_idx_images(files, name="mnist", class_names=tuple(str(d) for d in range(10)))


def load_fashion_mnist(files: Mapping[str, Path]) -> DatasetSplits:
    """Zalando's Fashion-MNIST (registry builder)."""
    return load_idx_images(files, name="fashion-mnist", class_names=FASHION_CLASSES)
