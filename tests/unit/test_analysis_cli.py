"""``fedsync analyze`` / ``python -m fedsync.analysis`` end to end on digits: real
training, real frames, the JSON and the plots; bad settings are refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedsync.analysis.cli import main
from fedsync.analysis.report import OVERALL
from fedsync.simulations.cli import app

FAST = "strategy='fedbuff' local-epochs=1 local-steps=4 buffer-size=2 density-start=0.05"
PNGS = ("union_growth.png", "index_coding.png", "imbalance.png", "overlap.png")


def test_analyze_command_on_digits(tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    result = CliRunner().invoke(
        app,
        ["analyze", "--clients", "3", "--tasks", "2", "--out", str(out), "-c", FAST],
    )
    assert result.exit_code == 0, result.output
    assert "cheapest single index coding" in result.output
    report = json.loads((out / "analysis.json").read_text())
    for name in PNGS:
        assert (out / name).stat().st_size > 1000
    model = report["layers"][OVERALL]
    assert report["k"] == 2 and len(report["accuracy"]) == 2
    assert report["settings"]["codecs"] == ["topk:0.05+uniform:8+ef"]
    # top-k keeps 5 % of every tensor (rounded per tensor, at least one each)
    assert 0.04 < model["density"]["mean"] < 0.07
    growth = model["union_growth"]["mean"]
    assert len(growth) == 3 and growth[0] <= growth[1] <= growth[2] <= 3 * growth[0]
    assert model["union_at_k"] == growth[1]
    assert report["recommendation"]["buffer"] == model["buffer"]
    bits = model["index_bits_per_nnz"]
    assert bits["coo_int32"] == 32.0
    assert bits["best_per_tensor"] <= min(bits[c] for c in ("bitmap", "elias_fano", "rice"))
    # What the real frames spent on positions: the encoder takes the smallest of the
    # same codings (the context coder only where its quick test says so), so never
    # more than bitmap, Elias-Fano or Rice, never less than the best per tensor.
    sent = model["index_bytes_per_update"]["sent"]
    assert sent == pytest.approx(report["sent"]["index_bytes_per_update"])
    assert bits["best_per_tensor"] - 1e-9 <= bits["sent"]
    assert bits["sent"] <= min(bits[c] for c in ("bitmap", "elias_fano", "rice")) + 1e-9
    for name, layer in report["layers"].items():
        if name != OVERALL:
            assert set(layer["imbalance"]) <= {"2", "4", "8", "16"}
            assert all(v["update"]["min"] >= 1.0 for v in layer["imbalance"].values())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-c", "local-epoch=1"], "local-epochs"),
        (["--codec", "topk:2"], "topk"),
        (["--clients", "1"], "--clients"),
        (["-c", "dirichlet-alpha=-1"], "dirichlet-alpha"),
    ],
)
def test_bad_settings_exit_2_and_write_nothing(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "none"
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
