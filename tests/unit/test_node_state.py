"""One node store: arrays in files (``node-state = "disk"``) behave as in ``context.state``.

The real ClientApp path (:func:`fedsync.clients.app.train_task`: decode the downlink,
train on digits, error-feedback encode) with hand-built Flower Messages: a full
downlink, then delta downlinks against the model the node kept. The node with its
arrays on disk must send bit for bit what the node with them in its context sends,
while its context holds tokens only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from fedsync.clientapp.compressed import CODEC_STATE, DOWNLINK_BASE, MissingDownlinkBase
from fedsync.clientapp.node_store import DEFAULT_FOLDER, JOURNAL, NodeStore, node_settings
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.config import SettingsError
from tests.unit.test_client_state import (  # the same node, task and reply helpers
    RUN_CONFIG,
    _task_identity,  # noqa: F401 (an autouse fixture: Message() needs Flower's ids)
    global_model,
    uplink,
)
from tests.unit.test_client_state import task as train_message


def model_at(version: int) -> dict[str, torch.Tensor]:
    """The server's model at ``version``: the initial model moved a little per version."""
    generator = torch.Generator().manual_seed(version)
    return {
        name: tensor + 0.01 * version * torch.randn(tensor.shape, generator=generator)
        for name, tensor in global_model().items()
    }


def task(number: int) -> Message:
    """Task 0 brings the whole model; later ones the delta from the previous version."""
    if number == 0:
        return train_message(0, delta_downlinks=True)
    before, after = model_at(number - 1), model_at(number)
    delta = {name: after[name] - before[name] for name in after}
    return train_message(
        number,
        version=number,
        delta_downlinks=True,
        payload=UpdateCodec("none+fp32").encode(delta),
        downlink_kind="delta",
    )


def node(run_config: dict[str, Any] | None = None, **node_config: Any) -> Context:
    return Context(
        run_id=7,
        node_id=3,
        node_config={"partition-id": 1, "num-partitions": 3, **node_config},
        state=RecordDict(),
        run_config={**RUN_CONFIG, **(run_config or {})},
    )


@pytest.fixture(scope="module")
def reference() -> list[bytes]:
    """Three tasks on a node that keeps its arrays in ``context.state``."""
    context = node()
    sent = [uplink(task(number), context) for number in range(3)]
    assert {CODEC_STATE, DOWNLINK_BASE} <= set(context.state.array_records)
    return sent


def test_a_node_with_its_arrays_on_disk_sends_what_a_node_with_them_in_its_context_sends(
    tmp_path: Path, reference: list[bytes]
) -> None:
    context = node({"node-state": "disk", "state-dir": str(tmp_path)})
    sent = [uplink(task(number), context) for number in range(3)]
    assert sent == reference  # the residual and the delta base came back exactly
    assert len(context.state.array_records) == 0  # Flower ships tokens only
    # The downlink's base is scratch; the codec memory has one file, the crash-safe one.
    assert sorted(path.name for path in (tmp_path / "job-1").iterdir()) == [
        "n3-fedsync-downlink-base.npz"
    ]
    assert (tmp_path / "codec-job-1-p1.npz").is_file()


def test_without_a_state_dir_disk_files_are_scratch_in_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: list[bytes]
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    context = node({"node-state": "disk"})
    sent = [uplink(task(number), context) for number in range(3)]
    assert sent == reference
    assert sorted(path.name for path in (tmp_path / DEFAULT_FOLDER / "job-1").iterdir()) == [
        "n3-fedsync-codec-state.npz",
        "n3-fedsync-downlink-base.npz",
    ]


def test_a_restarted_disk_node_reads_its_codec_memory_back(
    tmp_path: Path, reference: list[bytes]
) -> None:
    settings = {"node-state": "disk", "state-dir": str(tmp_path)}
    context = node(settings)
    uplink(task(0), context)
    restarted = node(settings)  # an empty context: no token names any file
    # Its downlink base is gone (a delta is refused: the server resends the model) ...
    with pytest.raises(MissingDownlinkBase, match="holds no base model"):
        train_task(task(1), restarted, ClientRuntime.from_context(restarted))
    # ... its residual is not: a whole-model task then sends what it would have sent.
    restarted = node(settings)
    whole = train_message(
        1, version=1, delta_downlinks=True, payload=UpdateCodec("none+fp32").encode(model_at(1))
    )
    kept = node()
    uplink(task(0), kept)
    sent = uplink(whole, restarted)
    assert sent == uplink(whole, kept)
    assert sent != uplink(whole, node())  # a node with no residual sends another update
    assert len((tmp_path / JOURNAL).read_text().splitlines()) == 1


def test_a_file_the_context_does_not_name_reads_as_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    context = node({"node-state": "disk", "state-dir": str(tmp_path)})
    uplink(task(0), context)
    before = RecordDict()
    for name, record in context.state.config_records.items():
        before.config_records[name] = record.copy()
    uplink(task(1), context)  # rewrites both files under new tokens
    # As after a task that failed once its files were written: Flower keeps the context
    # from before it, whose tokens name the previous files.
    stale = Context(
        run_id=7,
        node_id=3,
        node_config=context.node_config,
        state=before,
        run_config=context.run_config,
    )
    store = NodeStore.of(stale, job="job-1")
    with caplog.at_level(logging.WARNING):
        assert store.get(DOWNLINK_BASE) is None
        assert store.get(CODEC_STATE) is None  # the crash-safe file too: a newer one
    assert "reads as absent" in caplog.text and "token" in caplog.text
    # A delta then needs the whole model again, as on a restarted node.
    with pytest.raises(MissingDownlinkBase, match="holds no base model"):
        train_task(task(2), stale, ClientRuntime.from_context(stale))


def test_the_backends_keep_put_get_and_drop_alike(tmp_path: Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "a": np.arange(5, dtype=np.float32),
        "b": np.ones((2, 3), dtype=np.float64),
    }
    stores = (
        NodeStore(node()),
        NodeStore(node(), backend="disk", folder=tmp_path, job="j/1"),
        NodeStore(node(), backend="context", folder=tmp_path, job="j/1"),
    )
    for store in stores:
        assert store.get("kind") is None
        store.put("kind", arrays)
        held = store.get("kind")
        assert held is not None and held.keys() == arrays.keys()
        for name, value in arrays.items():
            np.testing.assert_array_equal(held[name], value)
            assert held[name].dtype == value.dtype
        store.drop("kind")
        assert store.get("kind") is None
        store.drop("kind")  # dropping nothing is fine
    assert list((tmp_path / "j_1").iterdir()) == []  # the file went with the drop
    assert not any(tmp_path.glob("*.npz"))  # a kind the server resends is never durable
    with pytest.raises(ValueError, match="backend"):
        NodeStore(node(), backend="memory")


def test_node_config_wins_over_the_run_config_and_values_are_checked(tmp_path: Path) -> None:
    assert node_settings(node()).node_state == "context"
    assert NodeStore.of(node()).backend == "context"
    in_run = node({"node-state": "disk"})
    default = NodeStore.of(in_run, job="j")
    assert default.backend == "disk" and default.folder is None
    assert default.scratch.parts[-2:] == (DEFAULT_FOLDER, "j")
    overridden = node({"node-state": "disk"}, **{"node-state": "context"})
    assert NodeStore.of(overridden).backend == "context"
    prefixed = node({"fedsync.node-state": "disk", "fedsync.state-dir": str(tmp_path)})
    named = NodeStore.of(prefixed, job="j")
    assert named.backend == "disk" and named.scratch == tmp_path / "j"
    assert named.path(CODEC_STATE) == tmp_path / "codec-j-p1.npz"
    in_node = NodeStore.of(node(**{"state-dir": str(tmp_path)}), job="j")
    assert in_node.backend == "context" and in_node.folder == tmp_path
    with pytest.raises(SettingsError, match="'node-state' must be one of context, disk"):
        NodeStore.of(node({"node-state": "memory"}))
    with pytest.raises(SettingsError, match="'state-dir' must be str"):
        NodeStore.of(node({"node-state": "disk", "state-dir": 3}))
    with pytest.raises(
        SettingsError, match=r"'fedsync\.node-state-dir' is now 'fedsync\.state-dir'"
    ):
        NodeStore.of(node({"fedsync.node-state-dir": str(tmp_path)}))
