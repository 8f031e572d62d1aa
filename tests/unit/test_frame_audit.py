"""The frame audit records an encode and its replay finds any byte that differs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsync.clientapp import frame_audit
from fedsync.codecs import UpdateCodec, tensor_specs


def _record(folder: Path, frame_edit: int | None = None) -> Path:
    gen = torch.Generator().manual_seed(4)
    update = {"w": torch.randn(300, 20, generator=gen), "b": torch.randn(20, generator=gen)}
    codec = UpdateCodec("dgc:0.05+uniform:8+ef", seed=11, specs=tensor_specs(update))
    codec.encode(update)  # a residual to start from
    before = codec.to_state()
    frame = codec.encode(update)
    if frame_edit is not None:
        edited = bytearray(frame)
        edited[frame_edit] ^= 1
        frame = bytes(edited)
    return frame_audit.record(
        folder,
        name="task",
        spec="dgc:0.05+uniform:8+ef",
        seed=codec.seed,
        update=update,
        before=before,
        after=codec.to_state(),
        frame=frame,
        state_device="cpu",
    )


def test_a_replayed_encode_gives_the_recorded_frame_and_state(tmp_path: Path) -> None:
    result = frame_audit.replay(_record(tmp_path))
    assert result.ok and result.frame_bytes > 0, result


def test_a_changed_byte_of_the_frame_is_found(tmp_path: Path) -> None:
    result = frame_audit.replay(_record(tmp_path, frame_edit=-3))
    assert not result.frame_equal and result.state_equal
    assert "frame differs from byte" in result.detail


def test_a_changed_residual_is_found(tmp_path: Path) -> None:
    path = _record(tmp_path)
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    key = next(k for k in arrays if k.startswith("after/residual"))
    arrays[key] = arrays[key] + np.float32(1e-6)
    np.savez(path, **arrays)  # type: ignore[arg-type]
    result = frame_audit.replay(path)
    assert result.frame_equal and not result.state_equal
    assert key.removeprefix("after/") in result.detail


def test_the_command_fails_on_an_empty_folder_and_on_a_mismatch(tmp_path: Path) -> None:
    assert frame_audit.main([str(tmp_path)]) == 2
    _record(tmp_path, frame_edit=-1)
    assert frame_audit.main([str(tmp_path), "--json", str(tmp_path / "r.json")]) == 1


def test_nothing_is_recorded_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(frame_audit.ENV, raising=False)
    assert frame_audit.audit_folder() is None


def test_a_broken_record_fails_alone_and_a_half_written_one_is_not_read(tmp_path: Path) -> None:
    _record(tmp_path)
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    (tmp_path / "half.part").write_bytes(b"PK")
    results = frame_audit.replay_folder(tmp_path)
    assert [r.record for r in results] == ["broken.npz", "task.npz"]
    assert not results[0].ok and results[0].detail and results[1].ok


def test_a_job_name_becomes_a_safe_file_name() -> None:
    assert frame_audit.safe_name("my job/1:x") == "my_job_1_x"
    assert frame_audit.safe_name("") == "_"
