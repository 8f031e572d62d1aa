"""Several seeds of one comparison: per-seed values, spread, errors and the results page
(fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsync.simulations.pages import PagesError, render_pages
from fedsync.simulations.results import EvalPoint, RunResult, build_comparison, load_comparison
from fedsync.simulations.scenario import Scenario, parse_scenario
from fedsync.simulations.seeds import SeedsError, main, read_inputs, summarize
from tests.unit.test_docs import one_result_page

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


def _run(label: str, *points: tuple[float, int, float], unit: int = 1) -> RunResult:
    """A completed run; every evaluation has sent twice its uplink bytes (in ``unit``) down."""
    series = [EvalPoint(t, up * unit, 2 * up * unit, acc) for t, up, acc in points]
    last = series[-1]
    summary = {
        "final_accuracy": last.accuracy,
        "total_bytes_up": last.bytes_up,
        "total_bytes_down": last.bytes_down,
    }
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


Curves = dict[int, tuple[list[tuple[float, int, float]], list[tuple[float, int, float]]]]


def _seed_dirs(
    tmp_path: Path, seeds: tuple[int, ...] = (2, 0, 1), curves: Curves = CURVES, unit: int = 1
) -> list[Path]:
    """One comparison folder per seed (in the order given), with its runner's provenance."""
    folders = []
    for seed in seeds:
        fedavg, teasq = curves[seed]
        runs = [_run("fedavg", *fedavg, unit=unit), _run("teasq", *teasq, unit=unit)]
        document = {
            **build_comparison(_toy(seed), runs).as_dict(),
            "provenance": {
                "command": f"python -m fedsync.simulations.compare toy --seed {seed}",
                "commit": f"c{seed}",
                "date": f"2026-01-0{seed + 1}",
                "machine": {"cpus": 4, "platform": "Linux"},
            },
        }
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
    assert inputs[1]["command"] == "python -m fedsync.simulations.compare toy --seed 1"
    assert (inputs[1]["date"], inputs[1]["machine"]["cpus"]) == ("2026-01-02", 4)

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
    # the ratio of means over the seeds where both reached the target (0 and 2)
    assert teasq["x_fewer_total_bytes"] == ((300 + 150) / 2) / 22.5


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
    assert "| teasq | 2 of 3 | 0.000 | 10.00 |" in table  # 22.5 bytes: 0.000 MB
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


# --- the results page of a seeds.json (fedsync.simulations.pages) ---------------------------------
# Targets 0.4, 0.42 and 0.45; bytes up in units of 10 kB. teasq reaches the target under
# seeds 0 and 1 (8x and 5x sooner, 20x and 10x fewer bytes), not under seed 2.
PAGE_CURVES: Curves = {
    0: (
        [(0, 0, 0.1), (40, 400, 0.6), (80, 800, 0.8)],
        [(0, 0, 0.1), (5, 20, 0.7), (10, 40, 0.78)],
    ),
    1: (
        [(0, 0, 0.1), (50, 500, 0.5), (100, 1000, 0.84)],
        [(0, 0, 0.1), (10, 50, 0.5), (20, 100, 0.82)],
    ),
    2: (
        [(0, 0, 0.1), (30, 300, 0.6), (60, 600, 0.9)],
        [(0, 0, 0.1), (5, 10, 0.2), (10, 20, 0.3)],
    ),
}
MANIFEST = (
    one_result_page("out/seeds.json", "seeds")
    + """
labels.teasq = "TEASQ mode"
goals = [
    { kind = "fewer-bytes", row = "teasq", than = "fedavg", factor = 10, which = "total" },
    { kind = "fewer-bytes", row = "teasq", than = "fedavg", factor = 15, which = "up" },
    { kind = "sooner", row = "teasq", than = "fedavg", factor = 5 },
    { kind = "accuracy-within", row = "teasq", than = "fedavg", points = 1 },
    { kind = "time-at-most", row = "teasq", seconds = 7.5 },
    { kind = "time-at-most", row = "fedavg", seconds = 40 },
]
headlines = [{ row = "teasq", than = "fedavg" }]
"""
)


def _summarized(tmp_path: Path, seeds: tuple[int, ...]) -> None:
    """``out/seeds.json`` of the seeds' comparisons, as the command writes it."""
    folders = _seed_dirs(tmp_path, seeds, PAGE_CURVES, unit=10_000)
    assert main([str(tmp_path / "out"), *map(str, folders)]) == 0


def _pages(tmp_path: Path, manifest: str = MANIFEST) -> dict[str, str]:
    (tmp_path / "sources.toml").write_text(manifest, encoding="utf-8")
    return render_pages(tmp_path, tmp_path / "sources.toml")


def _goal_lines(page: str) -> list[str]:
    return page.split("| goal | measured | met |\n| --- | --- | --- |\n")[1].splitlines()[:6]


def test_the_page_of_seeds_shows_their_spread_every_run_goals_and_headline(
    tmp_path: Path,
) -> None:
    _summarized(tmp_path, (1, 0))
    pages = _pages(tmp_path)
    page = pages["p.md"]
    # Provenance: the summary's own, from the JSON, with seeds.md beside it.
    assert "- **Data**: [`out/seeds.json`](../../out/seeds.json); every metric by seed: " in page
    assert "[`seeds.md`](../../out/seeds.md)" in page
    assert "  python -m fedsync.simulations.seeds " in page
    assert "**0.4000** under seed 0, **0.4200** under seed 1." in page
    assert "trailing mean of the last 3 evaluations" in page
    head = (
        "| strategy | reached | final acc | sim s to target | smoothed sim s to target "
        "| MB total to target | MB up to target | MB down to target | MB total (run) "
        "| fewer bytes than `fedavg` (ratio of means) | by seed "
        "| sooner than `fedavg` (mean ratio) | by seed |"
    )
    assert head in page
    assert (
        "| `fedavg` | 2 of 2 | 0.820 (0.800-0.840) | 45.0 (40.0-50.0) | 90.0 (80.0-100.0) "
        "| 13.50 (12.00-15.00) | 4.50 | 9.00 | 27.00 | 1.00x | 1.00-1.00x | 1.00x | 1.00-1.00x |"
    ) in page
    # 13.5 / 1.05 MB; 1 / the mean of the time ratios 1/8 and 1/5. The whole run: the
    # mean of (0.4 + 0.8) and (1 + 2) MB.
    assert (
        "| `teasq` | 2 of 2 | 0.800 (0.780-0.820) | 7.5 (5.0-10.0) | 15.0 (10.0-20.0) "
        "| 1.05 (0.60-1.50) | 0.35 | 0.70 | 2.10 | 12.9x | 10.0-20.0x | 6.15x | 5.00-8.00x |"
    ) in page
    assert "\n- `teasq`: TEASQ mode\n" in page
    assert "| `teasq` | 1 | 0.820 | 10.0 | 20.0 | 1.50 |" in page
    assert (
        f"- seed 1: `{tmp_path / 'seed1'}`, commit `c1`, run on 2026-01-02; machine: 4 CPUs, "
        "Linux; `python -m fedsync.simulations.compare toy --seed 1`"
    ) in page
    assert _goal_lines(page) == [
        "| `teasq`: >= 10x fewer bytes up and down to the target than `fedavg` (ratio of means) "
        "| 12.9x (1.05 MB against 13.50 MB, means over 2 seeds); worst seed 10.0x (seed 1) "
        "| yes |",
        "| `teasq`: >= 15x fewer uplink bytes to the target than `fedavg` (ratio of means) "
        "| 12.9x (0.35 MB against 4.50 MB, means over 2 seeds); worst seed 10.0x (seed 1) | no |",
        "| `teasq`: >= 5x sooner to the target than `fedavg` (mean ratio) "
        "| 6.15x (over 2 seeds); worst seed 5.00x (seed 1) | yes |",
        "| `teasq`: final accuracy within 1 point of `fedavg` (means) "
        "| -2.0 points (0.800 against 0.820, means); worst seed -2.0 points (seed 0) | no |",
        "| `teasq`: at most 7.5 simulated s to the target (mean) "
        "| 7.5 s (5.0-10.0 s by seed) | yes |",
        "| `fedavg`: at most 40 simulated s to the target (mean) "
        "| 45.0 s (40.0-50.0 s by seed) | no |",
    ]
    assert (
        "- [T](p.md#h): `teasq` against `fedavg` over 2 seeds: 6.15x sooner to the target "
        "accuracy in simulated time (mean ratio; 5.00-8.00x by seed), on 12.9x fewer bytes up "
        "and down (ratio of means; 10.0-20.0x by seed); final accuracy 0.800 against 0.820 "
        "(means)."
    ) in pages["index.md"].splitlines()
    with pytest.raises(PagesError, match=r"commit is in out/seeds\.json already"):
        _pages(tmp_path, MANIFEST + 'commit = "abc1234"\n')


def test_a_row_that_missed_the_target_under_a_seed_misses_its_goals(tmp_path: Path) -> None:
    _summarized(tmp_path, (0, 1, 2))
    pages = _pages(tmp_path)
    page = pages["p.md"]
    # The ratios are over seeds 0 and 1, where both reached the target.
    assert (
        "| `teasq` | 2 of 3 | 0.633 (0.300-0.820) | 7.5 (5.0-10.0) | 15.0 (10.0-20.0) "
        "| 1.05 (0.60-1.50) | 0.35 | 0.70 | 1.60 | 12.9x | 10.0-20.0x | 6.15x | 5.00-8.00x |"
    ) in page  # the whole run over all three seeds: (1.2 + 3 + 0.6) / 3 MB
    assert "| `teasq` | 2 | 0.300 | not reached | not reached | not reached |" in page
    missed = "`teasq` reached the target under 2 of 3 seeds"
    assert [line.split(" | ")[1:] for line in _goal_lines(page)] == [
        [missed, "no |"],
        [missed, "no |"],
        [missed, "no |"],
        ["-21.3 points (0.633 against 0.847, means); worst seed -60.0 points (seed 2)", "no |"],
        [missed, "no |"],
        ["40.0 s (30.0-50.0 s by seed)", "yes |"],
    ]
    assert (
        f"- [T](p.md#h): `teasq` against `fedavg` over 3 seeds ({missed}): 6.15x sooner to the "
        "target accuracy in simulated time (mean ratio; 5.00-8.00x by seed), on 12.9x fewer "
        "bytes up and down (ratio of means; 10.0-20.0x by seed); final accuracy 0.633 against "
        "0.847 (means)."
    ) in pages["index.md"].splitlines()


@pytest.mark.parametrize(
    ("goal", "message"),
    [
        ('{ kind = "faster", row = "teasq", than = "fedavg" }', "goal kind 'faster' is not known"),
        ('{ kind = "time-at-most", row = "teasq" }', "needs 'seconds'"),
        ('{ kind = "sooner", row = "nope", than = "fedavg" }', "has no row 'nope'"),
    ],
)
def test_a_malformed_seeds_goal_is_an_error(tmp_path: Path, goal: str, message: str) -> None:
    manifest = MANIFEST.replace(
        '{ kind = "sooner", row = "teasq", than = "fedavg", factor = 5 }', goal
    )
    assert manifest != MANIFEST
    _summarized(tmp_path, (0, 1))
    with pytest.raises(PagesError, match=message):
        _pages(tmp_path, manifest)


def test_only_keeps_the_strategies_named_in_their_order_and_reads_the_final_loss(
    tmp_path: Path,
) -> None:
    folders = _seed_dirs(tmp_path)
    for loss, folder in zip((2.5, 2.0, 3.0), folders, strict=True):  # seeds 2, 0, 1
        document = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
        for row in document["strategies"]:
            row["final_loss"] = loss if row["label"] == "teasq" else None
        _write(folder, document)
    document = summarize(read_inputs(folders), only=["teasq"])
    assert [s["label"] for s in document["strategies"]] == ["teasq"]
    assert document["strategies"][0]["metrics"]["final_loss"] == {
        "values": [2.0, 3.0, 2.5],  # in seed order
        "n": 3,
        "mean": 2.5,
        "min": 2.0,
        "max": 3.0,
    }
    with pytest.raises(SeedsError, match="no input has strategy 'fedbuff'"):
        summarize(read_inputs(folders), only=["teasq", "fedbuff"])
    assert main([str(tmp_path / "out"), *map(str, folders), "--only", "fedbuff"]) == 2
