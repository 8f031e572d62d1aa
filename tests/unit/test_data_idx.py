"""The IDX reader on the real MNIST / Fashion-MNIST files and on broken ones."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from fedsync.data import DatasetError, DatasetFormatError, read_idx
from fedsync.data.idx import IDX_DTYPES

# md5 of the files as /work/shared/data/README.md lists them: Fashion-MNIST's of the
# .gz files, MNIST's of the uncompressed content.
FASHION_GZ_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
MNIST_RAW_MD5 = {
    "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}
FIRST_LABELS = {
    ("mnist", "train"): [5, 0, 4, 1, 9, 2, 1, 3, 1, 4],
    ("mnist", "t10k"): [7, 2, 1, 0, 4, 1, 4, 9, 5, 9],
    ("fashion-mnist", "train"): [9, 0, 0, 3, 0, 2, 7, 2, 5, 5],
    ("fashion-mnist", "t10k"): [9, 2, 1, 1, 6, 1, 4, 6, 5, 7],
}


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """A well-formed IDX encoding of ``array`` with dtype ``code``."""
    dtype = IDX_DTYPES[code]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(dtype).tobytes()


# --- the real files ------------------------------------------------------------------


def test_fashion_files_match_published_md5(shared_data_dir: Path) -> None:
    for name, md5 in FASHION_GZ_MD5.items():
        digest = hashlib.md5((shared_data_dir / "fashion-mnist" / name).read_bytes())
        assert digest.hexdigest() == md5, name


def test_mnist_labels_match_published_md5_of_uncompressed(shared_data_dir: Path) -> None:
    for name, md5 in MNIST_RAW_MD5.items():
        content = gzip.decompress((shared_data_dir / "mnist" / name).read_bytes())
        assert hashlib.md5(content).hexdigest() == md5, name


@pytest.mark.parametrize(("dataset", "split"), sorted(FIRST_LABELS))
def test_real_labels(shared_data_dir: Path, dataset: str, split: str) -> None:
    labels = read_idx(shared_data_dir / dataset / f"{split}-labels-idx1-ubyte.gz")
    assert labels.dtype == np.uint8
    assert labels.shape == ((60_000,) if split == "train" else (10_000,))
    assert labels.min() == 0 and labels.max() == 9
    assert labels[:10].tolist() == FIRST_LABELS[(dataset, split)]
    assert np.bincount(labels).min() > 800  # every class is present in quantity


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist"])
def test_real_test_images(shared_data_dir: Path, dataset: str) -> None:
    images = read_idx(shared_data_dir / dataset / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (10_000, 28, 28)
    assert images.dtype == np.uint8
    assert images.max() == 255 and images.min() == 0


# --- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(IDX_DTYPES))
@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_every_dtype(tmp_path: Path, code: int, compress: bool) -> None:
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4) - 5
    if code == 0x08:
        array = array + 5
    data = idx_bytes(array, code)
    path = tmp_path / "a.idx"
    path.write_bytes(gzip.compress(data) if compress else data)
    out = read_idx(path)
    assert out.shape == (2, 3, 4)
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, array.astype(out.dtype))


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "labels.raw"  # no .gz suffix
    path.write_bytes(gzip.compress(idx_bytes(np.array([3, 1, 4], dtype=np.uint8))))
    assert read_idx(path).tolist() == [3, 1, 4]


# --- broken files ----------------------------------------------------------------------


GOOD = idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4))


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        (b"", "truncated header"),
        (b"\x00\x00", "truncated header"),
        (b"\x12\x34\x08\x01" + GOOD[4:], "bad magic"),
        (b"\x00\x00\x07\x02" + GOOD[4:], "unknown dtype code 0x07"),
        (b"\x00\x00\x08\x00" + GOOD[4:], "number of dimensions 0"),
        (b"\x00\x00\x08\x63" + GOOD[4:], "number of dimensions 99"),
        (GOOD[:10], "truncated header"),
        (GOOD[:-1], "truncated"),
        (GOOD + b"\x00", "trailing bytes"),
        (b"\x00\x00\x08\x02" + struct.pack(">2I", 0xFFFFFFFF, 0xFFFFFFFF), "over the"),
    ],
)
@pytest.mark.parametrize("compress", [False, True])
def test_bad_files_raise_typed_error(
    tmp_path: Path, content: bytes, fault: str, compress: bool
) -> None:
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(gzip.compress(content) if compress else content)
    with pytest.raises(DatasetFormatError, match=fault) as info:
        read_idx(path)
    assert isinstance(info.value, ValueError) and isinstance(info.value, DatasetError)
    assert info.value.path == path
    assert str(path) in str(info.value)


def test_truncated_gzip_stream(tmp_path: Path) -> None:
    packed = gzip.compress(GOOD + bytes(4000))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DatasetFormatError, match="gzip"):
        read_idx(path)


def test_corrupt_gzip_stream(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(GOOD))
    packed[-6] ^= 0xFF  # the CRC / length trailer no longer matches
    path = tmp_path / "crc.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(DatasetFormatError, match="gzip"):
        read_idx(path)


def test_huge_declared_size_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(idx_bytes(np.zeros((10, 10), dtype=np.uint8)))
    with pytest.raises(DatasetFormatError, match="limit"):
        read_idx(path, max_bytes=50)


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope")
