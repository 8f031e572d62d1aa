"""Documentation that stays true: generated results pages and links that resolve.

Every page under ``docs/results/`` but ``methods.md`` is written by
``python -m fedsync.simulations.pages`` from ``docs/results/sources.toml`` and the committed
JSON: regenerating it must give the committed text, so nobody edits a page by hand and a
changed JSON cannot leave a stale page behind. Every relative link in ``README.md``,
``docs/`` and ``examples/`` must point at a file that exists and, for ``#anchor`` links
into Markdown, at a heading GitHub gives that anchor. Facts the docs state that a test can
compute (the app bundle's contents) are computed here.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from fedsync.simulations.pages import (
    HAND_WRITTEN,
    MANIFEST,
    PAGES,
    PagesError,
    github_slug,
    main,
    render_pages,
    stale_pages,
)

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")])


# --- the results pages ------------------------------------------------------------------------


def one_result_page(json_path: str, kind: str) -> str:
    """A manifest of one page ``p`` with one result of ``kind`` drawn from ``json_path``."""
    return f"""
[[page]]
name = "p"
title = "T"
summary = "S"
description = "D"
[[page.result]]
json = "{json_path}"
kind = "{kind}"
heading = "H"
description = "D"
"""


def test_every_results_page_is_what_the_generator_writes() -> None:
    stale = stale_pages(ROOT)
    assert not stale, (
        f"{', '.join(stale)} in {PAGES} differ from their sources: run "
        "`python -m fedsync.simulations.pages` (edit docs/results/sources.toml, not the pages)"
    )
    assert main(["--check", "--root", str(ROOT)]) == 0


def test_the_pages_cover_the_headline_results() -> None:
    pages = render_pages(ROOT)
    wanted = {
        "fmnist-iot.md": "simulations/results/fmnist-iot/comparison.json",
        "fmnist-teasq.md": "simulations/results/fmnist-teasq/comparison.json",
        "ci-scale.md": "simulations/results/digits-stragglers/comparison.json",
        "cross-site.md": "simulations/results/cross-site-full/comparison.json",
        "deploy-overhead.md": "benchmarks/results/deploy_overhead_quiet.json",
        "deploy-soak.md": "benchmarks/results/deploy_soak_30min.json",
    }
    for name, data in wanted.items():
        assert f"[`{data}`](../../{data})" in pages[name]
        assert "**Command**" in pages[name] and "**Machine**" in pages[name]
    assert all(f"({name}" in pages["index.md"] for name in wanted)
    assert {p.name for p in (ROOT / PAGES).iterdir()} >= HAND_WRITTEN


def test_a_missing_json_fails_clearly(tmp_path: Path) -> None:
    manifest = (ROOT / MANIFEST).read_text(encoding="utf-8")
    moved = manifest.replace(
        'json = "simulations/results/fmnist-ci/comparison.json"',
        'json = "simulations/results/fmnist-ci/no-such.json"',
    )
    assert moved != manifest
    (tmp_path / "sources.toml").write_text(moved, encoding="utf-8")
    with pytest.raises(PagesError, match=r"fmnist-ci/no-such\.json: no such file"):
        render_pages(ROOT, tmp_path / "sources.toml")
    assert main(["--root", str(tmp_path)]) == 2  # no manifest there at all


def test_the_manifest_may_not_repeat_what_the_json_carries(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    path = ROOT / "simulations/results/fmnist-ci/comparison.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    document["provenance"] = {
        "command": "python -m fedsync.simulations.compare fmnist-ci",
        "commit": "abc1234",
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 4, "load_average": [0.5, 0.4, 0.3], "platform": "Linux"},
    }
    (folder / "comparison.json").write_text(json.dumps(document), encoding="utf-8")
    page = one_result_page("r/comparison.json", "comparison")
    (tmp_path / "sources.toml").write_text(page, encoding="utf-8")
    text = render_pages(tmp_path, tmp_path / "sources.toml")["p.md"]
    assert "python -m fedsync.simulations.compare fmnist-ci" in text
    assert "commit `abc1234`" in text and "4 CPUs" in text
    (tmp_path / "sources.toml").write_text(page + 'commit = "f00"\n', encoding="utf-8")
    with pytest.raises(PagesError, match=r"commit is in r/comparison\.json already"):
        render_pages(tmp_path, tmp_path / "sources.toml")
    # A benchmark that records the load at both ends (benchmarks/deploy_overhead.py).
    document["provenance"]["machine"]["load_average_end"] = [1.5, 1.0, 0.5]
    (folder / "comparison.json").write_text(json.dumps(document), encoding="utf-8")
    (tmp_path / "sources.toml").write_text(page, encoding="utf-8")
    text = render_pages(tmp_path, tmp_path / "sources.toml")["p.md"]
    assert "0.50 / 0.40 / 0.30 at the start, 1.50 / 1.00 / 0.50 at the end" in text


def test_a_table_result_renders_named_columns_of_any_json(tmp_path: Path) -> None:
    document = {
        "machine": {"cores": 2, "python": "3.11.7"},
        "command": "python -m benchmarks.x --fast",
        "runs": {
            "cpu": {
                "threads": 1,
                "cases": [
                    {"numel": 1000, "methods": {"topk:0.1+fp32": {"ms": 1.25, "b": 40_000}}},
                    {"numel": 2000, "methods": {"dgc": {"ms": 2.5, "iqr": [2.0, 3.0]}}},
                ],
            }
        },
        "stream": {"torch.sum": 10.5},
    }
    (tmp_path / "x.json").write_text(json.dumps(document), encoding="utf-8")
    page = (
        one_result_page("x.json", "table")
        + """commit = "abc1234"
date = "2026-01-01"
[[page.result.tables]]
caption = "Cap:"
rows = "runs.*.cases.*.methods.*"
columns = [["clock", "{@1}"], ["method", "`{@}`"], ["n", "{numel:,}"], ["threads", "{threads}"],
           ["ms", "{ms:.1f}"], ["MB", "{b*1e-6:.2f}"], ["iqr", "{iqr:.1f}"]]
[[page.result.tables]]
rows = ["stream", "machine"]
columns = [["what", "{@}"], ["rate", "{torch.sum:g}"], ["cores", "{cores}"]]
"""
    )
    (tmp_path / "sources.toml").write_text(page, encoding="utf-8")
    text = render_pages(tmp_path, tmp_path / "sources.toml")["p.md"]
    assert "python -m benchmarks.x --fast" in text and "2 CPUs, Python 3.11.7" in text
    assert "Cap:\n\n| clock | method | n | threads | ms | MB | iqr |" in text
    assert "| cpu | `topk:0.1+fp32` | 1,000 | 1 | 1.2 | 0.04 | - |" in text
    assert "| cpu | `dgc` | 2,000 | 1 | 2.5 | - | 2.0, 3.0 |" in text
    assert "| stream | 10.5 | - |" in text and "| machine | - | 2 |" in text
    for wrong, right, message in [
        ('rows = ["stream", "machine"]', 'rows = "runs.nope"', "has nothing at 'runs.nope'"),
        ('kind = "table"', 'kind = "soak"', "tables go with kind"),
    ]:
        (tmp_path / "sources.toml").write_text(page.replace(wrong, right), encoding="utf-8")
        with pytest.raises(PagesError, match=message):
            render_pages(tmp_path, tmp_path / "sources.toml")
    bad = page.replace('commit = "abc1234"\n', 'commit = "abc1234"\ncommands = ["x"]\n')
    (tmp_path / "sources.toml").write_text(bad, encoding="utf-8")
    with pytest.raises(PagesError, match=r"commands is in x\.json already"):
        render_pages(tmp_path, tmp_path / "sources.toml")


_CI_JSON = "simulations/results/fmnist-ci/comparison.json"


@pytest.mark.parametrize(
    "where",
    [str(ROOT / _CI_JSON), f"../{ROOT.name}/{_CI_JSON}", "simulations/../../x.json"],
    ids=["absolute", "out-and-back", "outside"],
)
def test_a_json_path_must_stay_inside_the_checkout(tmp_path: Path, where: str) -> None:
    # The first two name a file that exists: the page would show it, from outside the root.
    manifest = (ROOT / MANIFEST).read_text(encoding="utf-8")
    moved = manifest.replace(f'json = "{_CI_JSON}"', f'json = "{where}"')
    assert moved != manifest
    (tmp_path / "sources.toml").write_text(moved, encoding="utf-8")
    with pytest.raises(PagesError, match=r"page 'ci-scale', result 1: json = .* the checkout"):
        render_pages(ROOT, tmp_path / "sources.toml")


# --- links --------------------------------------------------------------------------------------
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def _prose(text: str) -> str:
    return _CODE.sub("", _FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (repeats numbered)."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(text))
    for heading in _HEADING.findall(text):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file that point at nothing."""
    broken = []
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    return broken


def test_github_slugs() -> None:
    assert github_slug("Warm nodes: per-task overhead") == "warm-nodes-per-task-overhead"
    assert github_slug("Pruned subnetworks (`prune-at-version`)") == (
        "pruned-subnetworks-prune-at-version"
    )
    assert github_slug("Dirichlet 0.1, re-run with today's defaults") == (
        "dirichlet-01-re-run-with-todays-defaults"
    )
    assert github_slug("See [the docs](x.md) & more_things") == "see-the-docs--more_things"


def test_the_link_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Same\n\n## Same\n", encoding="utf-8")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#title) [ok](a.md#same-1) [ok](#here) [web](https://x.org/y)\n"
        "[gone](nope.md) [bad](a.md#nope) `[code](nope.md)`\n\n## Here\n\n"
        "```\n[fenced](nope.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(tmp_path / "b.md") == [
        "nope.md (no such file)",
        "a.md#nope (no such heading)",
    ]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


def test_the_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "docs/results/index.md" in readme and "docs/results.md" not in readme


# --- figures quoted from the results pages ------------------------------------------------------
QUOTING = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
_FIGURE = re.compile(r"\d+(\.\d+)?x\b")


@pytest.fixture(scope="module")
def headlines() -> set[str]:
    """The headline lines of the generated ``index.md``, links relative to its folder."""
    index = render_pages(ROOT)["index.md"]
    return {line for line in index.splitlines() if line.startswith("- [")}


def quoted_figures(path: Path, pages: Path = ROOT / PAGES) -> list[str]:
    """The lines of a Markdown file that link a results page (in ``pages``) and state a
    figure (``7.29x``), as list items with their links made relative to ``pages``, as the
    headlines of ``index.md`` are."""
    prefix = Path(os.path.relpath(pages, path.parent)).as_posix() + "/"
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return [
        "- " + line.lstrip("-* ").replace(f"]({prefix}", "](")
        for line in text.splitlines()
        if f"]({prefix}" in line and _FIGURE.search(line)
    ]


def test_quoted_figures_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "a.md"
    doc.write_text(
        "- [T](results/p.md#h): `a` against `b`: 2.00x sooner.\n"
        "See [the page](results/p.md) for the rest; 3x is not in this line's link.\n"
        "[a page](results/p.md) says 1.5x.\n"
        "```\n[T](results/p.md#h): 9.00x in a fence\n```\n",
        encoding="utf-8",
    )
    assert quoted_figures(doc, tmp_path / "docs" / "results") == [
        "- [T](p.md#h): `a` against `b`: 2.00x sooner.",
        "- See [the page](p.md) for the rest; 3x is not in this line's link.",
        "- [a page](p.md) says 1.5x.",
    ]
    assert quoted_figures(tmp_path / "docs" / "a.md", tmp_path / "other") == []


@pytest.mark.parametrize("path", QUOTING, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_quoted_figure_is_a_generated_headline(path: Path, headlines: set[str]) -> None:
    # A figure a document quotes next to a link into docs/results/ is a headline line of
    # the generated index, word for word, with its link: it changes when the JSON does.
    for line in quoted_figures(path):
        assert line in headlines, (
            f"{path.relative_to(ROOT)} quotes a figure that is no headline of "
            f"docs/results/index.md (quote the generated line, or link without the figure): "
            f"{line}"
        )


# --- the app bundle -----------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # flwr's CLI dependencies
def test_the_fab_is_the_apps_configuration_alone() -> None:
    # docs/deployment.md: the FAB every node downloads is pyproject.toml alone, a few kB. Built
    # as `flwr build` builds it; its include patterns decide, so a few files of each kind the
    # checkout holds stand for the rest.
    from flwr.cli.build import build_fab_from_files

    files = [
        "pyproject.toml",
        ".gitignore",
        "README.md",
        "fedsync/__init__.py",
        "docs/deployment.md",
    ]
    fab, _ = build_fab_from_files({name: ROOT / name for name in files})
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert [name for name in names if not name.startswith(".info/")] == ["pyproject.toml"]
    assert len(fab) < 10_000, f"the FAB is {len(fab)} bytes"
