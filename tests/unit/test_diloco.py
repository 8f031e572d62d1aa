"""DiLoCo mode: the local AdamW, the outer Nesterov step, their run-config keys, and
synchronous rounds on the engine (every update has staleness 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsync.aggregation import ServerMomentum, build_server_optimizer
from fedsync.config import RunConfig, SettingsError
from fedsync.data import ArrayDataset
from fedsync.engine import AggregationEngine
from fedsync.models import build_model, train
from tests.unit.test_async_run import of, run
from tests.unit.test_async_run import task_identity as task_identity  # autouse: Message()


# --- the outer optimizer ----------------------------------------------------------------------
def test_nesterov_is_torch_sgd_nesterov_on_the_pseudo_gradient() -> None:
    """``x += eta (delta + beta v)`` with ``delta = -g`` is ``SGD(nesterov=True)`` on ``g``."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=generator)
    deltas = [torch.randn(50, generator=generator) for _ in range(6)]
    ours = {"w": start.clone()}
    optimizer = build_server_optimizer("nesterov", learning_rate=0.7, momentum=0.9)
    reference = torch.nn.Parameter(start.clone())
    torch_sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    for delta in deltas:
        optimizer.step(ours, {"w": delta})
        reference.grad = -delta
        torch_sgd.step()
        torch.testing.assert_close(ours["w"], reference.detach())


def test_nesterov_by_name_differs_from_plain_momentum() -> None:
    nesterov = build_server_optimizer("nesterov", learning_rate=0.7, momentum=0.9)
    momentum = build_server_optimizer("momentum", learning_rate=0.7, momentum=0.9)
    assert isinstance(nesterov, ServerMomentum) and nesterov.nesterov
    assert isinstance(momentum, ServerMomentum) and not momentum.nesterov
    assert "nesterov=True" in repr(nesterov)
    x, y = {"w": torch.zeros(2)}, {"w": torch.zeros(2)}
    nesterov.step(x, {"w": torch.ones(2)})
    momentum.step(y, {"w": torch.ones(2)})
    torch.testing.assert_close(x["w"], torch.full((2,), 0.7 * 1.9))
    torch.testing.assert_close(y["w"], torch.full((2,), 0.7))


# --- the inner optimizer ----------------------------------------------------------------------
def _toy(n: int = 96) -> ArrayDataset:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return ArrayDataset(x, (x[:, 0] + x[:, 1] > 0).astype(np.int64))


def test_adamw_training_is_torch_adamw_over_the_same_batches() -> None:
    data = _toy()
    model = build_model("mlp", 2, (8,), seed=0)
    reference = build_model("mlp", 2, (8,), seed=0)
    result = train(
        model,
        data,
        epochs=2,
        batch_size=16,
        lr=0.01,
        seed=7,
        optimizer="adamw",
        betas=(0.8, 0.95),
        weight_decay=0.1,
        max_steps=9,
    )
    assert result["steps"] == 9
    adamw = torch.optim.AdamW(reference.parameters(), lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    generator = torch.Generator().manual_seed(7)
    steps = 0
    for _ in range(2):
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), 16):
            if steps == 9:
                break
            batch = order[start : start + 16]
            adamw.zero_grad()
            F.cross_entropy(reference(x[batch]), y[batch]).backward()
            adamw.step()
            steps += 1
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_adamw_and_sgd_train_differently_and_an_unknown_optimizer_is_refused() -> None:
    weights = []
    for name in ("sgd", "adamw"):
        model = build_model("logreg", 2, (8,), seed=0)
        train(model, _toy(), epochs=1, batch_size=16, lr=0.05, optimizer=name)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.allclose(weights[0], weights[1])
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train(build_model("logreg", 2, (8,), seed=0), _toy(), optimizer="lion")


# --- the run-config keys ----------------------------------------------------------------------
def test_diloco_keys_read_back() -> None:
    config = RunConfig.from_run_config(
        {
            "strategy": "diloco",
            "client-optimizer": "adamw",
            "client-beta1": 0.8,
            "client-beta2": 0.95,
            "client-weight-decay": 0.1,
            "server-optimizer": "nesterov",
            "server-learning-rate": 0.7,
        }
    )
    training = config.training
    assert (training.client_optimizer, training.client_beta1, training.client_beta2) == (
        "adamw",
        0.8,
        0.95,
    )
    assert training.client_weight_decay == 0.1
    assert config.asynchronous.server_optimizer == "nesterov"


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"client-optimizer": "adam"}, "client-optimizer"),
        ({"client-beta1": 1.0}, "client-beta1"),
        ({"client-beta2": -0.1}, "client-beta2"),
        ({"client-weight-decay": -1.0}, "client-weight-decay"),
        ({"client-weight-decay": float("nan")}, "client-weight-decay"),
        ({"server-optimizer": "nesterov", "server-momentum": 1.0}, "server momentum"),
        ({"server-optimizer": "nesterov", "server-learning-rate": 0.0}, "server learning rate"),
        ({"server-optimizer": "nestrov"}, "unknown server optimizer"),
    ],
)
def test_bad_diloco_settings_name_the_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(SettingsError, match=key):
        RunConfig.from_run_config(values)


# --- synchronous rounds -----------------------------------------------------------------------
def test_diloco_caches_one_update_per_site_whatever_buffer_size_says() -> None:
    config = RunConfig.of(strategy="diloco", concurrency=4, buffer_size=2)
    engine = AggregationEngine(config, {"w": torch.zeros(3)})
    assert engine.strategy.synchronous and engine.strategy.buffer_size == 4
    assert engine.strategy.describe()["synchronous"] is True


def test_diloco_rounds_are_synchronous_every_update_has_staleness_zero(tmp_path: Path) -> None:
    result, events, _, _ = run(
        tmp_path,
        "diloco",
        strategy="diloco",
        concurrency=4,
        server_optimizer="nesterov",
        server_learning_rate=0.7,
    )
    assert result.version == 12
    assert result.summary["staleness_histogram"] == {"0": 48}
    aggregations = 0
    dispatched: dict[int, int] = {}
    for event in events:
        if event["event"] == "aggregation":
            aggregations += 1
            assert event["updates"] == 4
        elif event["event"] == "dispatch":
            # no task starts from a version before its round's step
            assert event["version"] == aggregations
            dispatched[event["version"]] = dispatched.get(event["version"], 0) + 1
        elif event["event"] == "arrival":
            assert event["staleness"] == 0
    assert all(count == 4 for count in dispatched.values())
    accuracy = [e["accuracy"] for e in result.evaluations]
    assert accuracy[-1] > accuracy[0]


def test_without_the_round_gate_the_same_c_and_k_are_asynchronous(tmp_path: Path) -> None:
    """FedBuff with C = K = 4 lets a site start again before the step: staleness > 0."""
    result, _, _, _ = run(tmp_path, "fedbuff", strategy="fedbuff", concurrency=4, buffer_size=4)
    assert set(result.summary["staleness_histogram"]) != {"0"}


def test_a_failing_site_does_not_stall_a_round(tmp_path: Path) -> None:
    result, events, _, _ = run(
        tmp_path, "diloco-errors", strategy="diloco", concurrency=4, behaviour={103: "error"}
    )
    assert result.summary["stop_reason"] == "max-aggregations" and result.version == 12
    assert [e["node"] for e in of(events, "give-up")] == [103]
    assert set(result.summary["staleness_histogram"]) == {"0"}


# --- bytes as a collective moves them ---------------------------------------------------------
@pytest.mark.parametrize(("collective", "factor"), [("allgather", 3.0), ("allreduce", 1.5)])
def test_a_collective_counts_what_it_moves_and_no_model_download(
    tmp_path: Path, collective: str, factor: float
) -> None:
    """Four sites: an all-gather sends each payload to the 3 others, a ring all-reduce
    sends 2 * 3 / 4 of it; every site computes the stepped model itself."""
    plain, plain_events, _, _ = run(tmp_path, "through-server", strategy="diloco", concurrency=4)
    result, events, _, _ = run(
        tmp_path,
        collective,
        strategy="diloco",
        concurrency=4,
        collective=collective,
        downlink_kind="full",
        downlink_codec="none+fp32",
    )
    arrivals = of(events, "arrival")
    assert arrivals and all(e["bytes_down"] == 0 for e in of(events, "dispatch"))
    assert result.summary["total_bytes_down"] == 0
    assert result.summary["total_bytes_up"] == sum(e["bytes_wire"] for e in arrivals)
    assert all(e["bytes_wire"] == round(e["bytes_up"] * factor) for e in arrivals)
    # The virtual clock charges what the collective moves, and no download.
    wire_time = sum(e["sim_duration"] for e in arrivals)
    assert wire_time != sum(e["sim_duration"] for e in of(plain_events, "arrival"))
    assert plain.summary["total_bytes_down"] > 0
    # The same updates (the stand-in codec's payloads do not depend on the bytes' count).
    assert [e["bytes_up"] for e in arrivals] == [e["bytes_up"] for e in of(plain_events, "arrival")]
    assert result.summary["collective"] == collective


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"strategy": "fedbuff"}, "synchronous engine strategy"),
        ({"collective": "broadcast"}, "must be one of"),
        ({"downlink-kind": "delta"}, "exactly"),
        ({"downlink-codec": "none+fp16"}, "exactly"),
        ({"downlink-codec": "none+rht+fp32"}, "exactly"),
        ({"ab-rank": 4, "uplink-codec": "none+uniform:8"}, "per-site payloads"),
        ({"prune-at-version": 2}, "per-site payloads"),
    ],
)
def test_a_collective_needs_synchronous_sites_that_hold_the_same_model(
    values: dict[str, object], message: str
) -> None:
    base: dict[str, object] = {
        "strategy": "diloco",
        "collective": "allgather",
        "downlink-kind": "full",
        "downlink-codec": "none+fp32",
    }
    RunConfig.from_run_config(base)
    with pytest.raises(SettingsError, match=message):
        RunConfig.from_run_config({**base, **values})


def test_fedasync_keeps_its_own_mixing_weight() -> None:
    for strategy in ("fedasync", "fedasync-mix"):
        with pytest.raises(SettingsError, match="buffer-mean"):
            RunConfig.from_run_config({"strategy": strategy, "buffer-mean": "selected"})
