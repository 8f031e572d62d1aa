"""The two example apps in ``examples/`` end to end: a plain Flower PyTorch app
(``quickstart-flower``, FedAvg) and the same app switched to fedsync's asynchronous,
compressed TEASQ mode (``quickstart-fedsync``) with a few changed lines.

Each app runs as a real ``flwr run`` on Flower's simulation engine (5 SuperNodes),
through one local SuperLink for the module: the ``superlink`` fixture of fedsync's
dataset tests (its own FLWR_HOME in a temporary folder, stopped by process id at the
end, and nothing it started left running). Each run's status is read from the SuperLink
(``flwr run --stream`` exits 0 on a failed run), its central accuracy on the held-out
20% of Breast Cancer Wisconsin from the ``final_metrics.json`` the app writes into its
``output-dir``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PROJECT_ROOT
from tests.integration.test_dataset_defaults import superlink  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EXAMPLES = PROJECT_ROOT / "examples"
FLOWER_APP = EXAMPLES / "quickstart-flower"
FEDSYNC_APP = EXAMPLES / "quickstart-fedsync"
FEDERATION = {"num-supernodes": 5, "client-resources-num-cpus": 1}

FEDAVG_ROUNDS = 3
TEASQ_AGGREGATIONS = 18
"""Short runs: FedAvg 3 rounds of 5 nodes; TEASQ 18 aggregations of K = 3 updates
(concurrency 5), the app's own settings otherwise."""

CHANCE = 72 / 114
"""The held-out split's majority class (benign): 72 of 114 samples."""

MIN_ACCURACY = 0.85
"""Both apps' final central accuracy must reach this. Measured over 4-5 runs each (2 CPU
cores): FedAvg 3 rounds 0.947-0.956, TEASQ 18 aggregations 0.965-0.982; chance is 0.63."""

MAX_CHANGED_LINES = 25
"""Lines added plus lines removed between the two apps (the project name excepted)."""


def run_example(
    link: Any, app: Path, run_config: dict[str, Any], output: Path
) -> dict[int, dict[str, float]]:
    """``flwr run`` one example app to the end; its ``final_metrics.json`` (central
    metrics by server round / model version)."""
    outcome = link.run_app(
        app,
        {**run_config, "output-dir": str(output)},
        federation_config=FEDERATION,
        timeout=420,
    )
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    assert (output / "final_model.pt").stat().st_size > 0
    evaluations = json.loads((output / "final_metrics.json").read_text())
    print(f"{app.name}: {evaluations}")  # shown with pytest -s
    return {int(version): metrics for version, metrics in evaluations.items()}


def test_the_flower_app_learns_with_fedavg(superlink: Any, tmp_path: Path) -> None:  # noqa: F811
    evaluations = run_example(
        superlink, FLOWER_APP, {"num-server-rounds": FEDAVG_ROUNDS}, tmp_path / "out"
    )
    assert sorted(evaluations) == list(range(FEDAVG_ROUNDS + 1))  # round 0 is the initial model
    final = evaluations[FEDAVG_ROUNDS]
    assert final["accuracy"] >= MIN_ACCURACY > CHANCE, evaluations
    assert final["loss"] < evaluations[0]["loss"], evaluations


def test_the_fedsync_app_learns_with_teasq(superlink: Any, tmp_path: Path) -> None:  # noqa: F811
    evaluations = run_example(
        superlink, FEDSYNC_APP, {"max-aggregations": TEASQ_AGGREGATIONS}, tmp_path / "out"
    )
    # TEASQ evaluates every 5 model versions and at the end: the run reached its length.
    assert max(evaluations) == TEASQ_AGGREGATIONS, evaluations
    final = evaluations[TEASQ_AGGREGATIONS]
    assert final["accuracy"] >= MIN_ACCURACY > CHANCE, evaluations
    assert final["loss"] < evaluations[min(evaluations)]["loss"], evaluations


def app_sources(app: Path) -> dict[str, list[str]]:
    """The app's Python files and pyproject.toml by relative path, as lines; the
    project's name line left out (the two apps must differ there)."""
    files = sorted([*app.rglob("*.py"), app / "pyproject.toml"])
    return {
        str(path.relative_to(app)): [
            line
            for line in path.read_text().splitlines()
            if not (path.name == "pyproject.toml" and line.startswith("name = "))
        ]
        for path in files
        if "__pycache__" not in path.parts
    }


def changed_lines(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """The ``+`` and ``-`` lines of a unified diff between two apps' files."""
    changed = []
    for name in sorted(before.keys() | after.keys()):
        diff = difflib.unified_diff(before.get(name, []), after.get(name, []), lineterm="", n=0)
        changed += [
            line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
    return changed


def test_the_fedsync_app_is_the_flower_app_with_a_few_lines_changed() -> None:
    flower, fedsync = app_sources(FLOWER_APP), app_sources(FEDSYNC_APP)
    assert flower.keys() == fedsync.keys()
    changed = changed_lines(flower, fedsync)
    assert 0 < len(changed) <= MAX_CHANGED_LINES, "\n".join(changed)
    # examples/README.md shows the current diff.
    readme = (EXAMPLES / "README.md").read_text()
    missing = [line for line in changed if line not in readme.splitlines()]
    assert missing == [], f"examples/README.md does not show: {missing}"
