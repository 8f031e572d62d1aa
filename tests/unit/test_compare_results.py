"""Evaluation series, the comparison's target and ratios, and its reports (fast)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsync.simulations.pages import PagesError, render_pages
from fedsync.simulations.report import main, write_reports
from fedsync.simulations.results import (
    SMOOTHING_WINDOW,
    EvalPoint,
    RunResult,
    build_comparison,
    first_reaching,
    load_comparison,
    ratio,
    read_series,
    smoothed_reaching,
    staleness_bins,
)
from fedsync.simulations.scenario import Scenario, ScenarioError, load_scenario, parse_scenario


def _series(*points: tuple[float, int, float]) -> list[EvalPoint]:
    return [EvalPoint(t, up, 2 * up, acc) for t, up, acc in points]


def test_first_reaching_takes_the_first_crossing_not_the_last() -> None:
    series = _series((0.0, 0, 0.1), (5.0, 10, 0.82), (6.0, 12, 0.7), (9.0, 20, 0.9))
    hit = first_reaching(series, 0.8)
    assert hit == EvalPoint(5.0, 10, 20, 0.82)
    assert first_reaching(series, 0.95) is None
    assert first_reaching(series, None) is None


def test_the_smoothed_crossing_waits_for_the_trailing_mean() -> None:
    series = _series((0, 0, 0.1), (1, 10, 0.5), (2, 20, 0.9), (3, 30, 0.6), (4, 40, 0.95))
    assert SMOOTHING_WINDOW == 3
    assert first_reaching(series, 0.8) == series[2]
    # Trailing means from the third evaluation: 0.5, 0.667, then (0.9 + 0.6 + 0.95) / 3.
    assert smoothed_reaching(series, 0.8) == series[4]
    assert smoothed_reaching(series, 0.85) is None
    assert smoothed_reaching(series[:2], 0.1) is None  # fewer evaluations than the window
    assert smoothed_reaching(series, None) is None
    assert smoothed_reaching(series, 0.8, window=1) == first_reaching(series, 0.8)
    losses = [2.0, 1.0, 0.4, 1.2, 0.5]  # means 1.133, 0.867, 0.7; lower is better
    curve = [EvalPoint(float(t), 0, 0, math.nan, loss) for t, loss in enumerate(losses)]
    assert smoothed_reaching(curve, 0.8, "loss") == curve[4]


def test_ratio() -> None:
    assert ratio(2.0, 8.0) == 0.25
    assert ratio(None, 8.0) is None
    assert ratio(2.0, None) is None
    assert ratio(2.0, 0.0) is None


def test_read_series_from_either_summary_shape(tmp_path: Path) -> None:
    entry = {"sim_time": 3.0, "cumulative_bytes_up": 7, "cumulative_bytes_down": 9, "accuracy": 0.5}
    assert read_series({"evaluations": [entry]}) == [EvalPoint(3.0, 7, 9, 0.5)]
    assert read_series({"evaluations": [entry]}) == [EvalPoint(3.0, 7, 9, 0.5)]
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "evaluation", "sim_time": 1.0, "accuracy": 0.2}\n')
    assert read_series({}, events) == [EvalPoint(1.0, 0, 0, 0.2)]


def _result(label: str, strategy: str, series: list[EvalPoint], status: str = "") -> RunResult:
    summary = {"final_accuracy": series[-1].accuracy, "best_accuracy": 1.0} if series else {}
    return RunResult(
        label, strategy, status or "finished:completed", 10.0, summary=summary, series=series
    )


def _toy() -> Scenario:
    """FedAvg (the baseline) and TEASQ-Fed; target: 0.9 x the best final accuracy."""
    return parse_scenario(
        {
            "name": "toy",
            "run-config": {"dataset": "digits", "fleet": "digits-stragglers"},
            "federation": {"num-supernodes": 4},
            "target": {"fraction-of-best": 0.9},
            "strategies": {
                "fedavg": {"strategy": "fedavg", "num-rounds": 3},
                "teasq": {"strategy": "teasq", "concurrency": 2},
            },
        }
    )


def test_comparison_fixes_the_target_after_all_runs_and_computes_ratios(tmp_path: Path) -> None:
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    comparison = build_comparison(_toy(), [fedavg, teasq])
    # 0.9 x the best final accuracy (teasq's 1.0), though fedavg's run never saw it.
    assert comparison.target == pytest.approx(0.9)
    assert comparison.all_completed
    base, fast = comparison.row("fedavg"), comparison.row("teasq")
    assert base["target"]["sim_time"] == 20 and base["target"]["bytes_up"] == 2000
    assert fast["target"]["sim_time"] == 4 and fast["target"]["bytes_down"] == 200
    assert fast["ratios_vs_baseline"]["time_to_target"] == pytest.approx(0.2)
    assert fast["ratios_vs_baseline"]["uplink_bytes_to_target"] == pytest.approx(0.05)
    assert base["ratios_vs_baseline"]["time_to_target"] == 1.0

    paths = write_reports(comparison, tmp_path)
    assert [p.name for p in paths] == ["comparison.json", "comparison.md", "comparison.png"]
    assert "| teasq | ok |" in (tmp_path / "comparison.md").read_text()


def test_rows_carry_the_smoothed_crossing_and_the_document_its_seed(tmp_path: Path) -> None:
    curve = ((0, 0, 0.1), (1, 10, 0.5), (2, 20, 0.9), (3, 30, 0.6), (4, 40, 0.95), (5, 50, 0.9))
    fedavg = _result("fedavg", "fedavg", _series(*curve))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 0.9)))
    comparison = build_comparison(_toy().seeded(7), [fedavg, teasq])
    assert comparison.target == pytest.approx(0.81)  # 0.9 x the best final 0.9
    base, fast = comparison.row("fedavg"), comparison.row("teasq")
    # _series sends twice the uplink bytes down: 20 + 40 at t = 2, 40 + 80 at t = 4.
    assert base["target"]["sim_time"] == 2 and base["target"]["bytes_total"] == 60
    assert base["target_smoothed"] == {"reached": True, "sim_time": 4, "bytes_total": 120}
    assert fast["target"]["sim_time"] == 2  # its trailing mean is 0.617 at its last point
    assert fast["target_smoothed"] == {"reached": False, "sim_time": None, "bytes_total": None}
    document = comparison.as_dict()
    assert document["seed"] == 7 and document["smoothing_window"] == SMOOTHING_WINDOW
    write_reports(comparison, tmp_path)
    assert (
        "Seed 7 (run-config `seed` of every strategy)." in (tmp_path / "comparison.md").read_text()
    )


def test_staleness_is_binned_and_reported_for_asynchronous_runs(tmp_path: Path) -> None:
    assert staleness_bins({"0": 3, "1": 1, "4": 2, "7": 1, "40": 5}) == [3, 1, 0, 2, 1, 0, 0, 5]
    assert staleness_bins({}) == [0] * 8
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (4, 100, 1.0)))
    teasq.summary.update(staleness_histogram={"0": 1, "1": 2, "3": 1}, mean_staleness=1.25)
    comparison = build_comparison(_toy(), [fedavg, teasq])
    paths = write_reports(comparison, tmp_path)
    assert [p.name for p in paths][-1] == "staleness.png"
    table = (tmp_path / "comparison.md").read_text()
    assert "| teasq | 4 | 1.25 | 25 % | 50 % | 0 % | 25 % | 0 % |" in table
    assert "| fedavg | " not in table.split("Staleness")[1]  # synchronous: no row


def test_a_failed_or_missing_run_gives_no_ratio_and_no_completion() -> None:
    fedavg = _result("fedavg", "fedavg", [], status="finished:failed")
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (4, 100, 0.9)))
    comparison = build_comparison(_toy(), [fedavg, teasq])
    assert not comparison.all_completed
    assert comparison.target == pytest.approx(0.81)  # from the completed run only
    row = comparison.row("teasq")
    assert row["target"]["reached"]
    assert row["ratios_vs_baseline"]["time_to_target"] is None
    assert comparison.row("fedavg")["target"]["reached"] is False


def test_total_bytes_to_the_target_count_both_ways(tmp_path: Path) -> None:
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    comparison = build_comparison(_toy(), [fedavg, teasq])
    # _series sends twice the uplink bytes down: 2000 + 4000 and 100 + 200 to 0.9.
    assert comparison.row("fedavg")["target"]["bytes_total"] == 6000
    assert comparison.row("teasq")["target"]["bytes_total"] == 300
    ratios = comparison.row("teasq")["ratios_vs_baseline"]
    assert ratios["total_bytes_to_target"] == pytest.approx(0.05)
    write_reports(comparison, tmp_path)
    table = (tmp_path / "comparison.md").read_text()
    assert "| MB total to target |" in table
    assert "| 0.200 | 0.0500 | 0.0500 |" in table  # time, uplink and total-bytes ratios


def test_reports_are_rewritten_from_the_json_alone(tmp_path: Path) -> None:
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    teasq.summary.update(staleness_histogram={"0": 1, "2": 3}, mean_staleness=1.5, sim_time=4.0)
    failed = _result("fedbuff", "fedbuff", [], status="finished:failed")
    scenario = load_scenario("fmnist-ci").only(["fedavg", "fedbuff", "teasq"]).scaled(0.5)
    written = build_comparison(scenario, [fedavg, failed, teasq])
    write_reports(written, tmp_path)
    document = json.loads((tmp_path / "comparison.json").read_text())

    rebuilt = load_comparison(document)
    assert rebuilt.as_dict() == json.loads(json.dumps(written.as_dict()))
    assert main([str(tmp_path)]) == 0
    again = json.loads((tmp_path / "comparison.json").read_text(encoding="utf-8"))
    origin = again.pop("provenance")  # the rewrite adds only where it came from
    # The runs recorded no provenance: the rewrite claims no command, commit or machine
    # for them, and names only itself.
    assert list(origin) == ["rewrites"]
    (rewrite,) = origin["rewrites"]
    assert rewrite["command"].startswith("python -m fedsync.simulations.report ")
    assert set(rewrite) == {"command", "commit", "date"}
    assert again == document
    assert not rebuilt.all_completed and rebuilt.scenario.scale == 0.5

    document["scenario"] = "no-such-scenario"
    (tmp_path / "comparison.json").write_text(json.dumps(document))
    assert main([str(tmp_path)]) == 2
    with pytest.raises(ScenarioError, match="no strategies"):
        load_comparison({"scenario": "fmnist-ci", "strategies": []})


def test_a_committed_comparison_loads_with_its_values_unchanged() -> None:
    """Rebuilt today, a committed comparison only gains the seed, the smoothed crossing and
    the (empty) downlink account."""
    path = Path(__file__).resolve().parents[2] / "simulations/results/fmnist-ci"
    committed = json.loads((path / "comparison.json").read_text(encoding="utf-8"))
    committed.pop("provenance")
    rebuilt = json.loads(json.dumps(load_comparison(committed).as_dict()))
    assert rebuilt.pop("seed") == 0 and rebuilt.pop("smoothing_window") == SMOOTHING_WINDOW
    for row in rebuilt["strategies"]:
        smoothed = row.pop("target_smoothed")
        if smoothed["reached"]:  # a mean of evaluations at the target has one there first
            assert row["target"]["sim_time"] <= smoothed["sim_time"]
        assert row.pop("downlink") is None  # older rows carry no downlink account
    assert rebuilt == committed


def test_a_rewrite_keeps_the_seed_and_refuses_documents_of_two_seeds(tmp_path: Path) -> None:
    scenario = load_scenario("fmnist-ci").scaled(0.5)
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    write_reports(build_comparison(scenario.only(["fedavg"]).seeded(2), [fedavg]), tmp_path / "a")
    write_reports(build_comparison(scenario.only(["teasq"]).seeded(3), [teasq]), tmp_path / "b")
    document = json.loads((tmp_path / "a" / "comparison.json").read_text())
    assert load_comparison(document).as_dict()["seed"] == 2
    assert main([str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "comparison.json").read_text())["seed"] == 2
    assert main([str(tmp_path / "a"), "--add", str(tmp_path / "b" / "comparison.json")]) == 2
    del document["seed"]  # written before compare had --seed: the scenario's own
    assert load_comparison(document).as_dict()["seed"] == scenario.seed == 0


def test_runs_split_across_runners_make_one_report(tmp_path: Path) -> None:
    scenario = load_scenario("fmnist-ci").scaled(0.5)
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    write_reports(build_comparison(scenario.only(["fedavg"]), [fedavg]), tmp_path / "a")
    write_reports(build_comparison(scenario.only(["teasq"]), [teasq]), tmp_path / "b")
    # A third run only left its folder (its runner was stopped).
    folder = tmp_path / "results" / "fedbuff"
    folder.mkdir(parents=True)
    entries = [
        {"sim_time": 3.0, "cumulative_bytes_up": 10, "cumulative_bytes_down": 5, "accuracy": 0.95}
    ]
    summary = {"stop_reason": "max-aggregations", "final_accuracy": 0.95, "wall_seconds": 7.5}
    (folder / "summary.json").write_text(json.dumps({**summary, "evaluations": entries}))
    (tmp_path / "results" / "fedasync").mkdir()  # no summary: did not finish

    argv = [str(tmp_path / "a"), "--add", str(tmp_path / "b" / "comparison.json")]
    assert main([*argv, "--runs", str(tmp_path / "results")]) == 0
    merged = json.loads((tmp_path / "a" / "comparison.json").read_text())
    assert [r["label"] for r in merged["strategies"]] == ["fedavg", "fedbuff", "fedasync", "teasq"]
    assert merged["target_accuracy"] == pytest.approx(0.85)  # 0.85 x teasq's 1.0, from b
    rows = {r["label"]: r for r in merged["strategies"]}
    assert rows["teasq"]["ratios_vs_baseline"]["time_to_target"] == pytest.approx(0.1)
    assert rows["fedbuff"]["completed"] and rows["fedbuff"]["elapsed_seconds"] == 7.5
    assert rows["fedbuff"]["target"]["bytes_total"] == 15
    assert not rows["fedasync"]["completed"] and merged["all_completed"] is False

    # Another scale, or a label twice, is refused.
    assert main([str(tmp_path / "a"), "--add", str(tmp_path / "b" / "comparison.json")]) == 2
    assert main([str(tmp_path / "c"), "--scenario", "fmnist-ci"]) == 2  # nothing found


def _origin(command: str, commit: str, cpus: int) -> dict[str, object]:
    return {
        "command": command,
        "commit": commit,
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": cpus, "load_average": [0.5, 0.4, 0.3], "platform": "Linux"},
    }


def _merged_fixture(tmp_path: Path) -> tuple[Path, dict[str, object], dict[str, object]]:
    """``a/comparison.json`` (fedavg, from one runner) and ``b/comparison.json`` (teasq,
    from another), each with its runner's provenance."""
    scenario = load_scenario("fmnist-ci").scaled(0.5)
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    first = _origin("python -m fedsync.simulations.compare fmnist-ci --only fedavg", "aaa1111", 2)
    second = _origin("python -m fedsync.simulations.compare fmnist-ci --only teasq", "bbb2222", 8)
    write_reports(build_comparison(scenario.only(["fedavg"]), [fedavg]), tmp_path / "a", first)
    write_reports(build_comparison(scenario.only(["teasq"]), [teasq]), tmp_path / "b", second)
    return tmp_path / "a", first, second


def test_a_rewrite_keeps_the_provenance_of_the_runs(tmp_path: Path) -> None:
    out, first, second = _merged_fixture(tmp_path)
    assert main([str(out)]) == 0  # rewritten alone
    assert main([str(out), "--add", str(tmp_path / "b" / "comparison.json")]) == 0
    origin = json.loads((out / "comparison.json").read_text(encoding="utf-8"))["provenance"]
    # The runs' command, commit, date and machine stay the result's, not the rewrite's.
    assert {key: origin[key] for key in first} == first
    assert origin["inputs"] == [{**second, "labels": ["teasq"]}]
    assert len(origin["rewrites"]) == 2
    for rewrite in origin["rewrites"]:
        assert rewrite["command"].startswith("python -m fedsync.simulations.report ")
        assert set(rewrite) == {"command", "commit", "date"}
    assert "--add" in origin["rewrites"][1]["command"]


def test_a_row_run_again_replaces_the_old_one_only_when_asked(tmp_path: Path) -> None:
    out, first, _ = _merged_fixture(tmp_path)
    assert main([str(out), "--add", str(tmp_path / "b" / "comparison.json")]) == 0
    scenario = load_scenario("fmnist-ci").scaled(0.5)
    again = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 40, 0.9), (4, 90, 0.97)))
    third = _origin("python -m fedsync.simulations.compare fmnist-ci --only teasq", "ccc3333", 2)
    write_reports(build_comparison(scenario.only(["teasq"]), [again]), tmp_path / "c", third)
    added = ["--add", str(tmp_path / "c" / "comparison.json")]
    assert main([str(out), *added]) == 2  # the label twice: refused without --replace
    assert main([str(out), *added, "--replace"]) == 0
    merged = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    rows = {r["label"]: r for r in merged["strategies"]}
    assert list(rows) == ["fedavg", "teasq"]
    assert rows["teasq"]["final_accuracy"] == pytest.approx(0.97)
    origin = merged["provenance"]
    assert {key: origin[key] for key in first} == first
    assert origin["inputs"] == [{**third, "labels": ["teasq"]}]  # b's block gave nothing now
    assert origin["rewrites"][-1]["replaced"] == ["teasq"]
    assert "--replace" in origin["rewrites"][-1]["command"]


def _page(tmp_path: Path, extra: str = "") -> str:
    manifest = tmp_path / "sources.toml"
    manifest.write_text(
        '[[page]]\nname = "p"\ntitle = "T"\nsummary = "S"\ndescription = "D"\n'
        '[[page.result]]\njson = "a/comparison.json"\nkind = "comparison"\n'
        f'heading = "H"\ndescription = "D"\n{extra}',
        encoding="utf-8",
    )
    return render_pages(tmp_path, manifest)["p.md"]


def test_the_page_of_a_merged_report_names_every_input(tmp_path: Path) -> None:
    out, _, _ = _merged_fixture(tmp_path)
    assert main([str(out), "--add", str(tmp_path / "b" / "comparison.json")]) == 0
    page = _page(tmp_path)
    assert "commit `aaa1111`" in page and "2 CPUs, Linux" in page  # the result's own
    merged = next(line for line in page.splitlines() if line.startswith("- **Merged in**"))
    assert "`teasq`" in merged and "--only teasq" in merged and "`bbb2222`" in merged
    assert "2026-01-01T00:00:00+00:00" in merged and "8 CPUs, Linux" in merged
    assert "load average 0.50 / 0.40 / 0.30" in merged
    assert "- **Report rewritten**: `python -m fedsync.simulations.report " in page


def test_rows_rebuilt_from_run_folders_leave_the_commit_to_the_manifest(tmp_path: Path) -> None:
    out, first, second = _merged_fixture(tmp_path)
    assert main([str(out), "--add", str(tmp_path / "b" / "comparison.json")]) == 0
    folder = tmp_path / "results" / "fedbuff"
    folder.mkdir(parents=True)
    entry = {"sim_time": 3.0, "cumulative_bytes_up": 10, "cumulative_bytes_down": 5}
    summary = {"stop_reason": "max-aggregations", "final_accuracy": 0.95, "wall_seconds": 7.5}
    (folder / "summary.json").write_text(
        json.dumps({**summary, "evaluations": [{**entry, "accuracy": 0.95}]}), encoding="utf-8"
    )
    assert main([str(out), "--runs", str(tmp_path / "results")]) == 0
    origin = json.loads((out / "comparison.json").read_text(encoding="utf-8"))["provenance"]
    # fedbuff's run recorded nothing: no command, commit, date or machine is claimed for
    # the whole result; fedavg's and teasq's runners keep theirs under inputs.
    assert not {"command", "commit", "date", "machine"} & origin.keys()
    assert origin["inputs"] == [
        {**first, "labels": ["fedavg"]},
        {**second, "labels": ["teasq"]},
    ]
    assert len(origin["rewrites"]) == 2
    with pytest.raises(PagesError, match="does not say its commands"):
        _page(tmp_path)
    page = _page(
        tmp_path,
        'commands = ["python -m fedsync.simulations.compare fmnist-ci"]\n'
        'commit = "ccc3333"\ndate = "2026-01-02"\n',
    )
    assert "- **Committed**: in `ccc3333` on 2026-01-02" in page
    assert "`fedavg` from `python -m fedsync.simulations.compare fmnist-ci --only fedavg`" in page


def test_the_downlink_accounts_of_a_committed_comparison_read_back_unchanged() -> None:
    """Rows carry each run's downlink account (per-device deltas and shared changes);
    rebuilt from the document alone, the comparison is the same, account included."""
    path = Path(__file__).resolve().parents[2] / "simulations/results/fmnist-iot-downlink"
    committed = json.loads((path / "comparison.json").read_text(encoding="utf-8"))
    committed.pop("provenance")
    kinds = {row["downlink"]["shared"] for row in committed["strategies"] if row["downlink"]}
    assert kinds == {True, False}
    assert json.loads(json.dumps(load_comparison(committed).as_dict())) == committed
