"""fedsync's strategies as objects in a user's ServerApp (fedsync.serverapp), and an
installed fedsync next to a user's own ``server.py``, ``clients/``, ``kernels.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

import fedsync.serverapp
from fedsync.aggregation.server_optimizer import ServerSGD
from fedsync.aggregation.staleness import parse_staleness
from fedsync.config import RunConfig, SettingsError
from fedsync.reports import RunFailedError
from fedsync.serverapp import STRATEGIES, TEASQ, FedAsync, FedAsyncMix, FedBuff, Result, Strategy
from tests.unit.test_async_run import (
    NODES,
    FakeClients,
    FakeGrid,
    initial_state,
    make_evaluate,
    task_identity,  # noqa: F401  (autouse fixture: Flower's task identity for Message())
)


def flower_evaluate(calls: list[int]):  # type: ignore[no-untyped-def]
    inner = make_evaluate(NODES)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        calls.append(server_round)
        return MetricRecord(inner(server_round, arrays.to_torch_state_dict()))

    return evaluate


def start(strategy: Strategy, **kwargs: object) -> tuple[Result, FakeClients]:
    clients = FakeClients(real=True)
    grid = FakeGrid(NODES, clients, seed=1)
    result = strategy.start(
        grid=grid,  # type: ignore[arg-type]
        initial_arrays=ArrayRecord(initial_state()),
        **kwargs,  # type: ignore[arg-type]
    )
    return result, clients


def test_teasq_object_trains_and_returns_flowers_result(tmp_path: Path) -> None:
    calls: list[int] = []
    strategy = TEASQ(concurrency=4, buffer_size=2, poll_interval=0.001)
    result, clients = start(
        strategy,
        evaluate_fn=flower_evaluate(calls),
        train_config=ConfigRecord({"lr": 0.05, "note": "mine"}),
        max_aggregations=9,
        eval_every=3,
    )
    assert result.summary["aggregations"] == 9
    assert result.folder is None  # no results_dir: nothing kept
    # Flower's Result fields: the final model (with its pass-through buffer) and the
    # central metrics by model version.
    final = result.arrays.to_torch_state_dict()
    assert set(final) == set(initial_state()) and int(final["bn.num_batches_tracked"]) == 7
    assert sorted(result.evaluate_metrics_serverapp) == sorted(set(calls)) and 9 in calls
    first, last = calls[0], calls[-1]
    loss = {v: float(result.evaluate_metrics_serverapp[v]["loss"]) for v in (first, last)}
    assert loss[last] < 0.5 * loss[first]
    # The user's train_config reaches every task, next to fedsync's keys.
    assert clients.configs and all(c["lr"] == 0.05 and c["note"] == "mine" for c in clients.configs)


def test_results_dir_keeps_the_reports(tmp_path: Path) -> None:
    result, _ = start(
        FedBuff(concurrency=3, buffer_size=2, poll_interval=0.001),
        max_aggregations=3,
        results_dir=tmp_path,
        run_name="mine",
    )
    assert result.folder == tmp_path.resolve() / "mine"
    assert (result.folder / "summary.json").is_file()
    assert (result.folder / "events.jsonl").is_file()


def test_objects_stand_in_for_strings() -> None:
    seen: list[int] = []

    def half_life(staleness: int) -> float:
        seen.append(staleness)
        return 0.5**staleness

    optimizer = ServerSGD(learning_rate=1.0)
    strategy = FedAsync(alpha=0.5, staleness=half_life, server_optimizer=optimizer)
    assert strategy.config.asynchronous.fedasync_alpha == 0.5
    result, _ = start(strategy, max_aggregations=4)
    assert seen, "the staleness callable weighs every update"
    assert result.run_summary is not None
    assert result.summary["policy"]["staleness"] == "custom:half_life"
    # A StalenessFunction object is taken as is.
    function = parse_staleness("hinge:10:4")
    assert TEASQ(staleness=function).staleness is function


def test_settings_are_checked_and_named() -> None:
    """Errors name the Python argument, in snake_case, when the object is made."""
    with pytest.raises(
        SettingsError, match="unknown argument 'buffer_sise'; did you mean 'buffer_size'"
    ):
        TEASQ(buffer_sise=2)  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"TEASQ\(concurrency=\.\.\.\) must be >= 1"):
        TEASQ(concurrency=0)
    with pytest.raises(SettingsError, match=r"FedBuff\(max_update_norm=\.\.\.\)"):
        FedBuff(max_update_norm=-1.0)
    with pytest.raises(SettingsError, match=r"unknown stage 'unifrom'.*did you mean 'uniform'"):
        TEASQ(uplink_codec="topk:{density}+unifrom:{bits}+ef")
    with pytest.raises(SettingsError, match=r"downlink_codec=.*did you mean 'fp16'"):
        TEASQ(downlink_codec="none+fp61")
    with pytest.raises(SettingsError, match="pick another class"):
        TEASQ(strategy="fedbuff")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="fedsync's own"):
        start(TEASQ(), train_config={"uplink-codec": "none+fp32"}, max_aggregations=1)


def test_from_run_config_picks_the_class() -> None:
    config = RunConfig.of(strategy="fedbuff", buffer_size=4)
    strategy = Strategy.from_run_config(config)
    assert isinstance(strategy, FedBuff) and strategy.config is config
    assert strategy.buffer_size == 4 and strategy.mean == "count"
    assert TEASQ().config.clock.clock == "wall"  # a library run is real time
    with pytest.raises(ValueError, match="not 'teasq'"):
        TEASQ.from_run_config(config)


def test_a_strategy_checks_what_only_it_knows() -> None:
    """FedAsync's own rule lives in its class (check_config), called by the reader for
    the strategy the config names, and from the class's keyword arguments alike."""
    for name in ("fedasync", "fedasync-mix"):
        with pytest.raises(SettingsError, match=r"'buffer-mean' .* would cancel"):
            RunConfig.of(strategy=name, buffer_mean="weight")
    with pytest.raises(SettingsError, match="would cancel"):
        FedAsyncMix(buffer_mean="weight")
    assert RunConfig.of(strategy="fedbuff", buffer_mean="weight").asynchronous.buffer_mean == (
        "weight"
    )


def test_one_class_per_strategy_registered_by_subclassing() -> None:
    """Every strategy is one public class; a subclass with a name registers itself."""
    assert {name: cls.__name__ for name, cls in STRATEGIES.items()} == {
        "teasq": "TEASQ",
        "fedbuff": "FedBuff",
        "fedasync": "FedAsync",
        "fedasync-mix": "FedAsyncMix",
        "diloco": "DiLoCo",
    }
    for cls in STRATEGIES.values():
        assert cls.__module__ == f"fedsync.strategies.{cls.name.replace('-', '_')}"
        assert getattr(fedsync.serverapp, cls.__name__) is cls
    with pytest.raises(TypeError, match="use TEASQ"):
        Strategy()
    with pytest.raises(TypeError, match="already"):
        type("Again", (TEASQ,), {"name": "teasq"})
    mix = FedAsyncMix(alpha=0.25)
    assert mix.needs_start_model and mix.alpha == 0.25 and mix.buffer_size == 1


def test_results_dir_in_the_constructor_is_used(tmp_path: Path) -> None:
    """``TEASQ(results_dir=...)`` writes there, as ``start(results_dir=...)`` does; the
    summary lists only what the run used and names its clock."""
    strategy = TEASQ(results_dir=tmp_path / "reports")
    result, _ = start(strategy, max_aggregations=2, run_name="mine")
    assert result.folder == (tmp_path / "reports" / "mine").resolve()
    summary = json.loads((result.folder / "summary.json").read_text())
    assert summary["clock"]["clock"] == "wall"
    assert not {"dataset", "model", "partitioning", "num-rounds"} & set(summary["config"])
    assert summary["config"]["buffer-size"] == 3
    events = [json.loads(line) for line in (result.folder / "events.jsonl").open()]
    assert events and all("event" in event and "wall_time" in event for event in events)


def test_a_users_own_top_level_modules_do_not_break_fedsync(tmp_path: Path) -> None:
    """fedsync claims only the import name ``fedsync``: a user's ``server.py``,
    ``clients/``, ``kernels.py`` and ``simulations.py`` first on the path change nothing."""
    (tmp_path / "server.py").write_text("USER = 'server'\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "__init__.py").write_text("USER = 'clients'\n")
    (tmp_path / "kernels.py").write_text("USER = 'kernels'\n")
    (tmp_path / "simulations.py").write_text("USER = 'simulations'\n")
    code = textwrap.dedent(
        """
        import server, clients, kernels, simulations
        assert {m.USER for m in (server, clients, kernels, simulations)} == {
            "server", "clients", "kernels", "simulations"}
        import fedsync.server.app, fedsync.clients.app, fedsync.simulations.cli
        from fedsync.kernels import dispatch
        from fedsync.serverapp import TEASQ
        from fedsync.clientapp import receive
        from fedsync.codecs import Codec
        import torch
        state = {"w": torch.randn(64)}
        codec = Codec("topk:0.25+uniform:8+ef", like=state)
        out = codec.decompress(codec.compress(state))
        assert out["w"].shape == (64,)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_run_whose_devices_all_fail_raises_after_writing_its_reports(tmp_path: Path) -> None:
    clients = FakeClients(dict.fromkeys(NODES, "error"))
    grid = FakeGrid(NODES, clients, seed=1)
    strategy = TEASQ(concurrency=3, buffer_size=2, poll_interval=0.001, max_retries=1)
    with pytest.raises(RunFailedError, match="given up"):
        strategy.start(
            grid=grid,  # type: ignore[arg-type]
            initial_arrays=ArrayRecord(initial_state()),
            max_aggregations=3,
            results_dir=tmp_path,
            run_name="failed",
        )
    assert (tmp_path / "failed" / "summary.json").is_file()
