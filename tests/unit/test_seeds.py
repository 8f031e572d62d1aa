"""Several seeds of one comparison: per-seed values, spread and errors (fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsync.simulations.results import EvalPoint, RunResult, build_comparison, load_comparison
from fedsync.simulations.scenario import Scenario, parse_scenario
from fedsync.simulations.seeds import SeedsError, main, read_inputs, summarize

ROOT = Path(__file__).resolve().parents[2]


def _toy(seed: int) -> Scenario:
    """FedAvg (the baseline) and TEASQ-Fed; target: half the best final accuracy."""
    scenario = parse_scenario(
        {
            "name": "toy",
            "run-config": {"dataset": "digits", "fleet": "digits-stragglers"},
            "federation": {"num-supernodes": 4},
            "target": {"fraction-of-best": 0.5},
            "strategies": {
                "fedavg": {"strategy": "fedavg", "num-rounds": 3},
                "teasq": {"strategy": "teasq", "concurrency": 2},
            },
        }
    )
    return scenario.seeded(seed)


def _run(label: str, *points: tuple[float, int, float]) -> RunResult:
    """A completed run; every evaluation has sent twice its uplink bytes down."""
    series = [EvalPoint(t, up, 2 * up, acc) for t, up, acc in points]
    summary = {"final_accuracy": series[-1].accuracy}
    return RunResult(label, label, "finished:completed", 1.0, summary=summary, series=series)


# Per seed: fedavg's and teasq's curves (sim time, bytes up, accuracy). Targets: 0.5 x
# the best final accuracy, 1.0, 0.9 and 0.8: 0.5, 0.45 and 0.4.
CURVES = {
    0: (
        [(0, 0, 0.1), (10, 100, 0.6), (20, 200, 0.7), (30, 300, 0.8)],
        [(0, 0, 0.1), (1, 10, 0.9), (2, 20, 0.9), (3, 30, 1.0)],
    ),
    1: (
        [(0, 0, 0.1), (10, 200, 0.3), (20, 400, 0.5), (30, 600, 0.9)],
        [(0, 0, 0.1), (1, 10, 0.2), (2, 20, 0.3)],  # never reaches 0.45
    ),
    2: (
        [(0, 0, 0.1), (10, 50, 0.6), (20, 100, 0.6)],
        [(0, 0, 0.1), (2, 5, 0.8), (4, 10, 0.8)],
    ),
}


def _write(folder: Path, document: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "comparison.json").write_text(json.dumps(document), encoding="utf-8")
    return folder


def _seed_dirs(tmp_path: Path, seeds: tuple[int, ...] = (2, 0, 1)) -> list[Path]:
    """One comparison folder per seed (in the order given), with its runner's commit."""
    folders = []
    for seed in seeds:
        fedavg, teasq = CURVES[seed]
        comparison = build_comparison(_toy(seed), [_run("fedavg", *fedavg), _run("teasq", *teasq)])
        document = {**comparison.as_dict(), "provenance": {"commit": f"c{seed}"}}
        folders.append(_write(tmp_path / f"seed{seed}", document))
    return folders


def test_every_metric_per_seed_with_mean_min_max_over_the_seeds_that_reached(
    tmp_path: Path,
) -> None:
    document = summarize(read_inputs(_seed_dirs(tmp_path)))
    assert document["scenario"] == "toy" and document["baseline"] == "fedavg"
    assert document["smoothing_window"] == 3 and document["target_metric"] == "accuracy"
    inputs = document["inputs"]
    assert [(i["seed"], i["commit"], i["dir"]) for i in inputs] == [
        (s, f"c{s}", str(tmp_path / f"seed{s}")) for s in (0, 1, 2)
    ]
    assert [i["target"] for i in inputs] == pytest.approx([0.5, 0.45, 0.4])

    fedavg, teasq = document["strategies"]
    assert (fedavg["label"], teasq["label"], teasq["strategy"]) == ("fedavg", "teasq", "teasq")
    base = fedavg["metrics"]
    assert base["sim_time_to_target"] == {
        "values": [10, 20, 10],
        "n": 3,
        "mean": 40 / 3,
        "min": 10,
        "max": 20,
    }
    # The trailing means of three evaluations reach the targets at 30, 30 and 20 s.
    assert base["sim_time_to_target_smoothed"]["values"] == [30, 30, 20]
    assert base["bytes_total_to_target"]["values"] == [300, 1200, 150]
    assert base["bytes_total_to_target"]["mean"] == 550
    assert base["bytes_total_to_target_smoothed"]["values"] == [900, 1800, 300]
    assert base["bytes_up_to_target"]["values"] == [100, 400, 50]
    assert base["bytes_down_to_target"]["values"] == [200, 800, 100]
    assert base["time_ratio"]["values"] == base["total_bytes_ratio"]["values"] == [1, 1, 1]
    assert base["final_accuracy"]["values"] == [0.8, 0.9, 0.6]
    assert base["final_accuracy"]["mean"] == pytest.approx(2.3 / 3)
    assert fedavg["x_fewer_total_bytes"] == 1.0

    fast = teasq["metrics"]
    assert fast["sim_time_to_target"] == {
        "values": [1, None, 2],
        "n": 2,
        "mean": 1.5,
        "min": 1,
        "max": 2,
    }
    assert fast["sim_time_to_target_smoothed"]["values"] == [2, None, 4]
    assert fast["bytes_total_to_target"] == {
        "values": [30, None, 15],
        "n": 2,
        "mean": 22.5,
        "min": 15,
        "max": 30,
    }
    assert fast["total_bytes_ratio"]["values"] == [0.1, None, 0.1]
    assert fast["time_ratio"] == {
        "values": [0.1, None, 0.2],
        "n": 2,
        "mean": (0.1 + 0.2) / 2,  # in floating point
        "min": 0.1,
        "max": 0.2,
    }
    assert fast["final_accuracy"]["n"] == 3  # it ran in every seed
    assert teasq["x_fewer_total_bytes"] == 550 / 22.5  # the baseline's mean over its own


def test_the_command_writes_json_with_provenance_and_markdown(tmp_path: Path) -> None:
    folders = _seed_dirs(tmp_path)
    out = tmp_path / "out"
    assert main([str(out), *map(str, folders)]) == 0
    document = json.loads((out / "seeds.json").read_text(encoding="utf-8"))
    origin = document.pop("provenance")
    assert origin["command"].startswith("python -m fedsync.simulations.seeds ")
    assert {"command", "commit", "date", "machine"} <= origin.keys()
    assert document == json.loads(json.dumps(summarize(read_inputs(folders))))
    table = (out / "seeds.md").read_text(encoding="utf-8")
    assert "| metric | seed 0 | seed 1 | seed 2 | mean | min | max | n |" in table
    assert "| sim s to target | 1.0 | not reached | 2.0 | 1.5 | 1.0 | 2.0 | 2 of 3 |" in table
    assert "| teasq | 2 of 3 | 0.000 | 24.44 |" in table  # 22.5 bytes: 0.000 MB
    assert "| 1 | `" in table and "| c1 | 0.4500 |" in table


def test_a_committed_comparison_under_three_seeds(tmp_path: Path) -> None:
    """The same runs under three seeds: every mean is the one value, min = max."""
    path = ROOT / "simulations/results/fmnist-iot-downlink/comparison.json"
    committed = json.loads(path.read_text(encoding="utf-8"))
    rebuilt = load_comparison(committed).as_dict()  # today's fields (seed, smoothed)
    folders = [_write(tmp_path / str(seed), {**rebuilt, "seed": seed}) for seed in (0, 1, 2)]
    document = summarize(read_inputs(folders))
    rows = {row["label"]: row for row in committed["strategies"]}
    for strategy in document["strategies"]:
        total = strategy["metrics"]["bytes_total_to_target"]
        value = rows[strategy["label"]]["target"]["bytes_total"]
        assert total == {"values": [value] * 3, "n": 3, "mean": value, "min": value, "max": value}
        expected = rows["fedavg"]["target"]["bytes_total"] / value
        assert strategy["x_fewer_total_bytes"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scenario": "other"}, "scenario 'other'"),
        ({"scale": 0.5}, "scale 0.5"),
        ({"baseline": "teasq"}, "baseline 'teasq'"),
        ({"seed": 0}, "seed 0 given twice"),
        ({"seed": None}, "records no seed"),
        ({"strategies": None}, "not a comparison document"),
    ],
)
def test_inputs_must_be_one_comparison_under_distinct_seeds(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    folders = _seed_dirs(tmp_path, (0, 1))
    document = json.loads((folders[1] / "comparison.json").read_text(encoding="utf-8"))
    _write(folders[1], {**document, **change})
    with pytest.raises(SeedsError, match=message):
        read_inputs(folders)


def test_missing_inputs_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (folder,) = _seed_dirs(tmp_path, (0,))
    with pytest.raises(SeedsError, match="at least two"):
        read_inputs([folder])
    assert main([str(tmp_path / "out"), str(folder), str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
