"""Shared fixtures: where the real datasets live for tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedsync.codecs
from fedsync.compression.pipeline import BuildContext, Pipeline, PipelineConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Tests read the real data from ../shared/data beside the project (the team layout); a
# copy of the tree that carries shared/ inside it (e.g. on a device machine) also works.
_DATA_CANDIDATES = (PROJECT_ROOT.parent / "shared" / "data", PROJECT_ROOT / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The folder of real datasets (``fashion-mnist/``, ``mnist/``, ``shakespeare/``).

    Skips the test when it is absent, so a bare checkout still runs the rest.
    """
    for candidate in _DATA_CANDIDATES:
        if candidate.is_dir():
            return candidate
    pytest.skip(f"shared data not found (looked in {', '.join(map(str, _DATA_CANDIDATES))})")


@pytest.fixture
def built_pipelines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The spec of every pipeline :mod:`fedsync.codecs` builds during the test, in order
    (the real builder, recorded)."""
    built: list[str] = []
    build = fedsync.codecs.build_pipeline

    def recording(config: PipelineConfig, context: BuildContext) -> Pipeline:
        built.append(config.to_spec())
        return build(config, context)

    monkeypatch.setattr(fedsync.codecs, "build_pipeline", recording)
    return built
