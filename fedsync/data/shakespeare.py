"""Tiny Shakespeare as next-character prediction, one natural client per speaking role.

A small stand-in for LEAF's Shakespeare benchmark. The text is a sequence of speeches,
each a block that starts with a ``NAME:`` line after a blank line (verse lines may end
in a colon too, so only a block's first line can name a speaker). Names are compared
case- and space-insensitively (``Nurse`` and ``NURSE`` are one role).

Each speaker's speeches are joined with single spaces (newlines folded, so the
vocabulary is the printable characters only) and cut into windows of ``seq_len``
characters, the target being the character that follows. To keep memory small, windows
start every ``stride`` characters and at most ``max_windows`` are kept per speaker,
spread evenly over the speaker's text. The first 90 % of each speaker's text gives
train windows and the rest test windows; splitting the text rather than the windows
keeps overlapping windows from leaking between train and test.

With ``targets="sequence"`` (the ``shakespeare-lm`` dataset) a sample's target is the
window shifted by one character, so a language model is trained and scored at every
position (``y`` has shape ``(N, seq_len)``); its windows do not overlap by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsync.data.download import RemoteFile
from fedsync.data.types import ArrayDataset, DatasetError, DatasetFormatError, DatasetSplits

FILE_NAMES = ("tinyshakespeare.txt", "input.txt")
REMOTE_FILES = (
    RemoteFile(
        "tinyshakespeare.txt",
        (
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        ),
        "6fb458f1232090904fb40fe944165e91",
    ),
)
TEST_FRACTION = 0.1
TARGETS = ("next", "sequence")
"""What a window predicts: the character after it, or every position's next character."""


@dataclass(frozen=True)
class Speech:
    """One speech: the (normalized) speaker and the text, lines joined by spaces."""

    speaker: str
    text: str


def parse_speeches(text: str) -> list[Speech]:
    """Split a play text into speeches.

    A block (lines between blank lines) whose first line ends with ``:`` starts a new
    speech by that speaker; any other block continues the current speech. Text before
    the first speaker is dropped.
    """
    speeches: list[Speech] = []
    speaker: str | None = None
    body: list[str] = []

    def close() -> None:
        if speaker is not None and body:
            speeches.append(Speech(speaker, " ".join(body)))

    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if lines[0].endswith(":") and len(lines[0]) > 1:
            close()
            speaker, body = _normalize_name(lines[0][:-1]), lines[1:]
        else:
            body.extend(lines)
    close()
    return speeches


def _normalize_name(name: str) -> str:
    return " ".join(name.split()).upper()


def load_shakespeare(
    files: Mapping[str, Path],
    *,
    seq_len: int = 80,
    stride: int = 10,
    max_windows: int = 1000,
    min_speeches: int = 10,
    targets: str = "next",
) -> DatasetSplits:
    """Build next-character samples grouped by speaker.

    Parameters
    ----------
    files : mapping of str to Path
        ``{"text": path}`` of ``tinyshakespeare.txt`` (or char-rnn's ``input.txt``).
    seq_len : int
        Characters of context per sample.
    stride : int
        Characters between the starts of consecutive windows.
    max_windows : int
        Cap on train windows per speaker (test windows are capped in proportion).
    min_speeches : int
        Keep only speakers with at least this many speeches (10 keeps the ~145 roles
        that have enough text to train on).
    targets : {"next", "sequence"}
        ``"next"``: ``y`` is the id of the character after the window, ``(N,)``;
        ``"sequence"``: the window shifted by one, ``(N, seq_len)``.

    Returns
    -------
    DatasetSplits
        ``x``: character ids ``(N, seq_len)`` (uint8 while the vocabulary fits);
        ``y``: the target ids (see ``targets``); ``groups``: speaker id per train sample, with
        ``group_names`` the speakers, sorted; ``class_names``: the vocabulary.
    """
    for arg, value in (("seq_len", seq_len), ("stride", stride), ("max_windows", max_windows)):
        if value < 1:
            raise DatasetError(f"shakespeare: {arg} must be >= 1, got {value}")
    if targets not in TARGETS:
        raise DatasetError(f"shakespeare: targets must be one of {TARGETS}, got {targets!r}")
    sequence = targets == "sequence"
    path = files["text"]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DatasetFormatError(path, f"not UTF-8 text ({err})") from err
    speeches = parse_speeches(text)
    if not speeches:
        raise DatasetFormatError(path, "no speeches found (expected blocks starting 'NAME:')")

    # The vocabulary comes from every speech, not just the kept speakers, so it (and the
    # model's output size) does not change with min_speeches.
    vocab = sorted({ch for s in speeches for ch in s.text})
    lookup = np.zeros(max(map(ord, vocab)) + 1, dtype=np.int64)
    lookup[[ord(ch) for ch in vocab]] = np.arange(len(vocab))
    id_dtype = np.uint8 if len(vocab) <= 256 else np.int32

    by_speaker: dict[str, list[str]] = {}
    for speech in speeches:
        by_speaker.setdefault(speech.speaker, []).append(speech.text)
    test_cap = max(1, math.ceil(max_windows * TEST_FRACTION / (1 - TEST_FRACTION)))

    train_parts: list[tuple[np.ndarray, np.ndarray]] = []
    test_parts: list[tuple[np.ndarray, np.ndarray]] = []
    names: list[str] = []
    for name in sorted(by_speaker):
        texts = by_speaker[name]
        if len(texts) < min_speeches:
            continue
        ids = lookup[np.frombuffer(" ".join(texts).encode("utf-32-le"), dtype=np.uint32)]
        cut = int(len(ids) * (1 - TEST_FRACTION))
        train = _windows(ids[:cut], seq_len, stride, max_windows, sequence)
        if len(train[1]) == 0:
            continue  # too little text for one window: no client can be made of it
        names.append(name)
        train_parts.append(train)
        test_parts.append(_windows(ids[cut:], seq_len, stride, test_cap, sequence))
    if not names:
        raise DatasetError(
            f"shakespeare: no speaker has {min_speeches}+ speeches and {seq_len + 1}+ "
            "characters; lower min_speeches or seq_len"
        )

    groups = np.concatenate(
        [np.full(len(y), g, dtype=np.int64) for g, (_, y) in enumerate(train_parts)]
    )
    return DatasetSplits(
        train=_stack(train_parts, seq_len, id_dtype),
        test=_stack(test_parts, seq_len, id_dtype),
        num_classes=len(vocab),
        input_shape=(seq_len,),
        groups=groups,
        name="shakespeare",
        group_names=tuple(names),
        class_names=tuple(vocab),
    )


def _windows(
    ids: np.ndarray, seq_len: int, stride: int, cap: int, sequence: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of ``seq_len`` ids and the id after each (or, with ``sequence``, the
    window shifted by one), at most ``cap`` of them."""
    starts = np.arange(0, len(ids) - seq_len, stride)
    if len(starts) > cap:
        # Spread the kept windows over the whole text rather than keeping its start.
        starts = starts[np.unique(np.linspace(0, len(starts) - 1, cap).round().astype(np.int64))]
    x = ids[starts[:, None] + np.arange(seq_len)]
    if sequence:
        return x, ids[starts[:, None] + np.arange(1, seq_len + 1)]
    return x, ids[starts + seq_len]


def _stack(
    parts: list[tuple[np.ndarray, np.ndarray]], seq_len: int, id_dtype: type[np.integer]
) -> ArrayDataset:
    if not parts:
        return ArrayDataset(np.zeros((0, seq_len), dtype=id_dtype), np.zeros(0, dtype=np.int64))
    x = np.concatenate([p[0] for p in parts]).astype(id_dtype)
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return ArrayDataset(x.reshape(-1, seq_len), y)
