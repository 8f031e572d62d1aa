"""PowerSGD through the real asynchronous server loop (fake clients, real codec): the
run config's uplink codec string is all it takes, and the server aggregates the
decoded low-rank updates."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_async_run import run, task_identity

__all__ = ["task_identity"]  # the autouse fixture Flower's Message() needs


@pytest.mark.parametrize("spec", ["powersgd:2+fp16+ef", "powersgd:1,min_rate=1.0+uniform:8+ef"])
def test_fedbuff_with_a_powersgd_uplink(tmp_path: Path, spec: str) -> None:
    result, _, _, _ = run(
        tmp_path,
        "powersgd",
        real_codec=True,
        strategy="fedbuff",
        uplink_codec=spec,
        downlink_codec="none+fp16",
        max_aggregations=12,
    )
    assert result.summary["drops"] == {} and result.summary["errors"] == {}
    assert result.version == 12
    # 'layer.weight' (32 x 16) is factored, the bias travels fp16: the model moves
    # towards the clients' common optimum (more slowly at rank 1 and 8 bits).
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"] + 0.1
