"""A pruned run in Flower's simulation engine: ``prune-at-version`` from the run config.

The server cuts the global model at version 1; each node gets the masks once with its
next task, and from then on every update (and downlink) is values at the kept
positions. Checked from what the run left behind: the events (real frame lengths) and
the final checkpoint (the pruned weights are still exactly zero). The nodes keep their
per-node arrays on disk (``node-state = "disk"``): masks, decoded models and residuals
go through files, and the run has no error.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from fedsync.codecs import UpdateCodec
from fedsync.compression.pruning import mask_digest, prunable
from fedsync.reports import read_events
from fedsync.serverapp.checkpoint import load_checkpoint
from fedsync.updates import tensor_specs
from tests.integration.conftest import run_simulation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PRUNE_AT = 1


def test_a_pruned_run_sends_kept_values_only_and_keeps_pruned_weights_zero(
    tmp_path: Path, project_root: Path
) -> None:
    folder = run_simulation(
        tmp_path,
        project_root,
        {
            "strategy": "fedbuff",
            "concurrency": 3,
            "buffer-size": 2,
            "max-aggregations": 4,
            "eval-every": 3,
            "local-epochs": 1,
            "local-steps": 5,
            "uplink-codec": "topk:{density}+uniform:{bits}+ef",
            "prune-at-version": PRUNE_AT,
            "prune-sparsity": 0.8,
            "plots": False,
            "node-state": "disk",
            "state-dir": str(tmp_path / "node-state"),
        },
        name="pruned",
    )
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["errors"] == {} and summary["drops"] == {}
    (prune,) = read_events(folder / "events.jsonl", "prune")
    assert prune["version"] == PRUNE_AT

    # --- the final global model: the pruned weights are exactly zero ---
    (checkpoint_path,) = sorted((folder / "checkpoints").glob("ckpt-v*.pt"))[-1:]
    checkpoint = load_checkpoint(checkpoint_path)
    assert checkpoint.version == 4
    state = {k: v for k, v in checkpoint.global_state.items() if v.is_floating_point()}
    masks = {name: t != 0 for name, t in state.items() if prunable(t)}
    assert masks and mask_digest(masks) == prune["digest"]  # zeros exactly where it cut
    assert sum(int(m.sum()) for m in masks.values()) == prune["kept"]
    assert prune["kept"] == pytest.approx(0.2 * prune["pruned_numel"], abs=len(masks))

    # --- every update after the cut: kept values only (real frame lengths) ---
    dispatches = {e["task"]: e for e in read_events(folder / "events.jsonl", "dispatch")}
    arrivals = list(read_events(folder / "events.jsonl", "arrival"))
    specs = tensor_specs(state)
    masked = [a for a in arrivals if dispatches[a["task"]]["uplink_codec"].startswith("mask:")]
    assert len(masked) >= 4
    for arrival in masked:
        spec = dispatches[arrival["task"]]["uplink_codec"]
        assert spec.startswith(f"mask:digest={prune['digest']}+uniform:")
        # the length of a frame of the kept values (and the dense biases), no positions
        zero = {name: torch.zeros(s.shape) for name, s in specs.items()}
        expected = len(UpdateCodec(spec, masks=masks, specs=specs).encode(zero))
        assert arrival["bytes_up"] == expected
    # the masks went once to each node (no task failed)
    mask_sends = Counter(e["node"] for e in dispatches.values() if e["mask_bytes"] > 0)
    assert set(mask_sends.values()) == {1} and len(mask_sends) == 3
    assert prune["mask_bytes"] in {e["mask_bytes"] for e in dispatches.values()}

    # --- every node's arrays went through state-dir: the downlink's in one job folder,
    # the codec memory in its crash-safe file, one per partition ---
    folder = tmp_path / "node-state"
    (job,) = (path for path in folder.iterdir() if path.is_dir())
    for kind in ("fedsync-pruning-mask", "fedsync-downlink-base"):
        assert len(list(job.glob(f"n*-{kind}.npz"))) == 3, kind
    assert len(list(folder.glob(f"codec-{job.name}-p*.npz"))) == 3
