"""The results pages under ``docs/results/``, generated from the committed JSON.

::

    python -m fedsync.simulations.pages            # write docs/results/<page>.md and index.md
    python -m fedsync.simulations.pages --check    # exit 1 when a page differs from its sources

Every page is drawn from ``docs/results/sources.toml`` (the manifest) and the result
files it names (``comparison.json`` of a comparison, ``seeds.json`` of several seeds of
one, a benchmark's JSON). Tables and
every number on a page come from the JSON; the manifest holds what the JSON does not:
the command that produced it, the commit that committed it, the date, the machine and
its load, the seeds, a short fixed description of each result and of each table row,
the goals a result is held against and the headline figures the index quotes. A JSON
written with a ``provenance`` block (:mod:`fedsync.reports.provenance`) carries its
command, commit, date and machine itself; the manifest must not repeat them (it is an
error), so the page cannot show a fact that disagrees with its data. The page also lists
the block's ``inputs`` (rows merged from other runs' JSON, each with its command,
commit, date and machine) and ``rewrites`` (the report rewrites, each with its command,
commit and date; see :func:`fedsync.simulations.report.main`).

A page is never edited by hand: ``tests/unit/test_docs.py`` regenerates every page and
compares it with the committed text. ``docs/results/methods.md`` is the one hand-written
page (how the comparisons measure; it quotes no result).

Manifest layout (TOML)::

    [defaults]
    machine = "..."                   # for results whose JSON names no machine

    [[page]]
    name = "fmnist-iot"               # docs/results/fmnist-iot.md
    title = "..."
    summary = "..."                   # its line in index.md
    description = "..."               # what the page shows (no result numbers)

    [[page.result]]
    json = "simulations/results/fmnist-iot/comparison.json"   # relative, inside the root
    kind = "comparison"               # or seeds, link-ratio, deploy-overhead, soak, table
    heading = "..."
    description = "..."
    commands = ["python -m ..."]      # unless the JSON has provenance.command
    commit = "f91feb4"                # the commit that committed the JSON
    date = "2026-11-24"
    machine = "..."                   # overrides [defaults]
    load = "..."                      # unless the JSON records the load average
    seeds = "..."
    labels = { fedavg = "..." }       # comparison (seeds) rows / deployment paths, described
    figures = ["comparison.png"]      # beside the JSON
    goals = [{ kind = "sooner", row = "teasq", than = "fedavg", factor = 10 }]
    headlines = [{ row = "teasq", than = "fedavg" }]

    [[page.result.tables]]            # kind = "table": any JSON, one or more tables
    caption = "..."                   # optional, a line above the table
    rows = ["runs.*.cases.*"]         # paths to the rows (a string or a list of them)
    columns = [["method", "`{@}`"], ["MB", "{bytes*1e-6:.2f}"], ["ms", "{t.median:.1f}"]]

A ``seeds`` result is the ``seeds.json`` of :mod:`fedsync.simulations.seeds`. Its goals
and headlines are spelled as a comparison's, plus ``{ kind = "time-at-most", row = "...",
seconds = 114.6 }`` (``row``'s mean simulated time to the target at most ``seconds``). A
goal or headline that compares two rows takes the seeds where both have the number (for a
cost to the target: where both reached it): ``fewer-bytes`` the ratio of the means of the
bytes to the target (``than``'s over ``row``'s), ``sooner`` 1 / the mean of the seeds' time
ratios (``row``'s simulated time to the target over ``than``'s), ``accuracy-within`` the
difference of the mean final accuracies. A row that missed the target under any seed
misses every goal but ``accuracy-within``. Goals report the worst seed, headlines the range
of the seeds' own ratios.

A row path is keys joined by dots (a key may hold dots itself) and ``*`` for every item of
a list or every value of an object; a path without ``*`` is one row. A column is its
heading and a template: ``{path:spec}`` is the value at ``path`` in the row, or else in
the objects the path passed through, innermost first, formatted with Python's ``spec``
(``{path*1e-6:.2f}`` scales it first; a list is formatted item by item). ``{@}`` is the
key of the row's innermost ``*`` (for a path without one, its last key), ``{@1}`` that of
the first, ``{.}`` the row itself. A cell whose template names a value the JSON lacks is ``-``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsync.simulations.seeds import fewer_of_means

__all__ = [
    "GENERATOR",
    "HAND_WRITTEN",
    "MANIFEST",
    "PAGES",
    "PagesError",
    "github_slug",
    "main",
    "render_pages",
    "stale_pages",
    "write_pages",
]

ROOT = Path(__file__).resolve().parents[1]
PAGES = Path("docs/results")
"""Where the pages go, relative to the checkout."""
MANIFEST = PAGES / "sources.toml"
"""The manifest, relative to the checkout."""
HAND_WRITTEN = frozenset({"methods.md"})
"""Pages in :data:`PAGES` that are written by hand."""
GENERATOR = "python -m fedsync.simulations.pages"

_PAGE_KEYS = {"name", "title", "summary", "description", "result"}
_RESULT_KEYS = {
    "json",
    "kind",
    "heading",
    "description",
    "commands",
    "commit",
    "date",
    "machine",
    "load",
    "seeds",
    "labels",
    "figures",
    "goals",
    "headlines",
    "tables",
}
_TABLE_KEYS = {"rows", "columns", "caption"}
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


class PagesError(ValueError):
    """The manifest or a result it names is missing or malformed."""


# --- the manifest -----------------------------------------------------------------------------
@dataclass
class Result:
    """One result: its manifest entry and its JSON document."""

    spec: dict[str, Any]
    data: dict[str, Any]
    path: Path
    """The JSON's path, relative to the checkout."""
    where: str
    """Where in the manifest, for error messages."""

    @property
    def heading(self) -> str:
        """The result's section heading."""
        return str(self.spec["heading"])

    def label(self, key: str) -> str:
        """A row's (or a path's) description from the manifest's ``labels``, or ``""``."""
        return str(self.spec.get("labels", {}).get(key, ""))


@dataclass
class Page:
    """One generated page."""

    name: str
    title: str
    summary: str
    description: str
    results: list[Result] = field(default_factory=list)


def load_manifest(root: Path, manifest: Path | None = None) -> list[Page]:
    """The pages of the manifest, each result's JSON read.

    Raises
    ------
    PagesError
        If the manifest or a JSON it names is missing, unreadable or malformed, a JSON
        path is absolute or leaves the checkout, or the manifest states a fact that the
        JSON carries.
    """
    path = manifest if manifest is not None else root / MANIFEST
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PagesError(f"{path}: no such manifest") from err
    except tomllib.TOMLDecodeError as err:
        raise PagesError(f"{path}: {err}") from err
    defaults = document.get("defaults", {})
    pages: list[Page] = []
    names: set[str] = set()
    for i, entry in enumerate(document.get("page", [])):
        where = f"{path}: page {entry.get('name', i)!r}"
        _require(entry, ("name", "title", "summary", "description", "result"), _PAGE_KEYS, where)
        name = str(entry["name"])
        if not _NAME.fullmatch(name) or f"{name}.md" in HAND_WRITTEN or name == "index":
            raise PagesError(f"{where}: the name must be lower-case words and dashes, not taken")
        if name in names:
            raise PagesError(f"{where}: two pages of that name")
        names.add(name)
        page = Page(name, str(entry["title"]), str(entry["summary"]), str(entry["description"]))
        for j, spec in enumerate(entry["result"]):
            page.results.append(_load_result(root, spec, defaults, f"{where}, result {j + 1}"))
        pages.append(page)
    if not pages:
        raise PagesError(f"{path}: no [[page]]")
    return pages


def _require(entry: Mapping[str, Any], needed: Iterable[str], known: set[str], where: str) -> None:
    if missing := [key for key in needed if key not in entry]:
        raise PagesError(f"{where}: missing {', '.join(missing)}")
    if unknown := sorted(set(entry) - known):
        raise PagesError(f"{where}: unknown key {', '.join(unknown)}")


def _load_result(
    root: Path, spec: Mapping[str, Any], defaults: Mapping[str, Any], where: str
) -> Result:
    _require(spec, ("json", "kind", "heading", "description"), _RESULT_KEYS, where)
    if spec["kind"] not in _KINDS:
        raise PagesError(f"{where}: kind {spec['kind']!r} is not one of {', '.join(_KINDS)}")
    if (spec["kind"] == "table") != ("tables" in spec):
        raise PagesError(f'{where}: tables go with kind = "table", and it needs them')
    for i, table in enumerate(spec.get("tables", [])):
        _require(table, ("rows", "columns"), _TABLE_KEYS, f"{where}, table {i + 1}")
    relative = Path(str(spec["json"]))
    if relative.is_absolute() or ".." in relative.parts:
        raise PagesError(
            f"{where}: json = {str(spec['json'])!r}: give a path inside the checkout, "
            "relative to its root (not absolute, no '..')"
        )
    try:
        data = json.loads((root / relative).read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PagesError(
            f"{where}: {relative}: no such file (the result the page shows; "
            "run its command again, or fix the path)"
        ) from err
    except (OSError, json.JSONDecodeError) as err:
        raise PagesError(f"{where}: {relative}: {err}") from err
    if not isinstance(data, dict):
        raise PagesError(f"{where}: {relative}: not a JSON object")
    carried = _carried(data)
    if repeated := sorted(key for key in carried if key in spec):
        raise PagesError(
            f"{where}: {', '.join(repeated)} {'is' if len(repeated) == 1 else 'are'} in "
            f"{relative} already: the page takes it from there, drop it from the manifest"
        )
    merged = dict(spec)
    unnamed = "machine" not in data and "machine" not in carried  # the JSON names none
    if unnamed and "machine" not in merged and "machine" in defaults:
        merged["machine"] = defaults["machine"]
    for key in ("commands", "commit", "date"):
        if key not in carried and key not in merged:
            raise PagesError(f"{where}: {relative} does not say its {key}: give it here")
    if isinstance(merged.get("commands"), str):
        raise PagesError(f"{where}: commands is a list of strings")
    return Result(merged, data, relative, where)


def _carried(data: Mapping[str, Any]) -> set[str]:
    """The manifest's facts that a JSON document carries itself."""
    origin = data.get("provenance")
    carried: set[str] = set()
    if isinstance(origin, dict):
        carried |= {
            name
            for key, name in (("command", "commands"), ("commit", "commit"), ("date", "date"))
            if origin.get(key)
        }
        if origin.get("machine"):
            carried |= {"machine", "load"}
    if isinstance(data.get("command"), str):  # a benchmark that records its command line
        carried.add("commands")
    machine = data.get("machine")
    if isinstance(machine, dict) and "loadavg_start" in machine:
        carried.add("load")
    return carried


# --- pages ------------------------------------------------------------------------------------
def render_pages(root: Path = ROOT, manifest: Path | None = None) -> dict[str, str]:
    """Every generated page's text by file name (``index.md`` included).

    Raises
    ------
    PagesError
        As :func:`load_manifest`, or when a manifest entry names a row the JSON lacks.
    """
    pages = load_manifest(root, manifest)
    texts = {f"{page.name}.md": _render_page(page) for page in pages}
    texts["index.md"] = _render_index(pages)
    return texts


def write_pages(root: Path = ROOT, manifest: Path | None = None) -> list[Path]:
    """Write every page (only those whose text changed); returns the paths written."""
    written = []
    for name, text in render_pages(root, manifest).items():
        path = root / PAGES / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def stale_pages(root: Path = ROOT, manifest: Path | None = None) -> list[str]:
    """Pages that differ from what :func:`write_pages` would write, or are missing, and
    Markdown files in :data:`PAGES` that it does not write and are not hand-written."""
    texts = render_pages(root, manifest)
    folder = root / PAGES
    stale = [
        name
        for name, text in texts.items()
        if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text
    ]
    extra = {p.name for p in folder.glob("*.md")} - set(texts) - HAND_WRITTEN
    return sorted(stale) + sorted(f"{name} (not generated)" for name in extra)


def _banner() -> str:
    return (
        f"<!-- Generated by `{GENERATOR}` from {MANIFEST.name} and the JSON it names. "
        "Do not edit: change those and run it again. -->"
    )


def _render_page(page: Page) -> str:
    lines = [_banner(), "", f"# {page.title}", "", page.description.strip(), ""]
    lines += ["See [methods](methods.md) for how the comparisons measure.", ""]
    for result in page.results:
        lines += [f"## {result.heading}", "", result.spec["description"].strip(), ""]
        lines += _provenance(result)
        lines += _KINDS[result.spec["kind"]].render(result)
    return _join(lines)


def _render_index(pages: Sequence[Page]) -> str:
    lines = [_banner(), "", "# Results", ""]
    lines += [
        "Every page here is generated from committed JSON and names, for each result, the "
        "command that produced it, the commit, the date and the machine. "
        f"[methods.md](methods.md) says how the comparisons measure. Regenerate with "
        f"`{GENERATOR}` (`--check` to compare).",
        "",
        "| page | what it shows | data |",
        "| --- | --- | --- |",
    ]
    for page in pages:
        data = "<br>".join(f"[`{r.path}`](../../{r.path})" for r in page.results)
        lines.append(f"| [{page.title}]({page.name}.md) | {page.summary.strip()} | {data} |")
    lines += ["", "## Headline figures", ""]
    for page in pages:
        for result in page.results:
            for headline in result.spec.get("headlines", []):
                text = _KINDS[result.spec["kind"]].headline(result, headline)
                anchor = github_slug(result.heading)
                lines.append(f"- [{page.title}]({page.name}.md#{anchor}): {text}")
    return _join(lines)


def _join(lines: Sequence[str]) -> str:
    text = "\n".join(lines).rstrip("\n") + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


def _provenance(result: Result) -> list[str]:
    spec, data = result.spec, result.data
    raw = data.get("provenance")
    origin: dict[str, Any] = raw if isinstance(raw, dict) else {}
    lines = [f"- **Data**: [`{result.path}`](../../{result.path})"]
    if spec["kind"] in _BESIDE:  # the report its command writes beside the JSON
        name, what = _BESIDE[spec["kind"]]
        lines[-1] += f"; {what}: [`{name}`](../../{result.path.parent / name})"
    if origin.get("commit"):
        lines.append(f"- **Code**: commit `{origin['commit']}`, run on {origin.get('date', '-')}")
    else:
        lines.append(f"- **Committed**: in `{spec['commit']}` on {spec['date']}")
    lines.append(f"- **Machine**: {_machine(spec, data)}")
    if spec.get("load"):
        lines.append(f"- **Load**: {spec['load']}")
    if spec.get("seeds"):
        lines.append(f"- **Seeds**: {spec['seeds']}")
    for i in _entries(origin, "inputs"):
        rows = ", ".join(f"`{label}`" for label in i.get("labels", [])) or "rows"
        lines.append(
            f"- **Merged in**: {rows} from `{i.get('command', '-')}`; commit "
            f"`{i.get('commit', '-')}`, run on {i.get('date', '-')}; machine: "
            f"{_host(i['machine']) if isinstance(i.get('machine'), dict) else '-'}"
        )
    for r in _entries(origin, "rewrites"):
        lines.append(
            f"- **Report rewritten**: `{r.get('command', '-')}`; commit "
            f"`{r.get('commit', '-')}`, on {r.get('date', '-')}"
        )
    command = origin.get("command") or data.get("command")
    commands = [command] if isinstance(command, str) else list(spec.get("commands", []))
    if commands:
        lines += ["- **Command**:", "", "  ```bash"]
        lines += [f"  {command}" for command in commands]
        lines += ["  ```"]
    return [*lines, ""]


_BESIDE = {
    "comparison": ("comparison.md", "full table and staleness histograms"),
    "seeds": ("seeds.md", "every metric by seed"),
}
"""By kind, the Markdown report written beside the JSON, and what it shows."""


def _entries(origin: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    entries = origin.get(key)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _machine(spec: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    parts = [str(spec["machine"])] if spec.get("machine") else []
    origin = data.get("provenance")
    if isinstance(origin, dict) and isinstance(origin.get("machine"), dict):
        parts.append(_host(origin["machine"]))
    elif isinstance(data.get("machine"), dict):
        host = data["machine"]
        cpus = host.get("cpus", host.get("cores"))
        named = (("python", "Python"), ("torch", "torch"), ("flwr", "Flower"))
        words = [f"{cpus} CPUs"] if cpus else []
        words += [f"{name} {host[key]}" for key, name in named if host.get(key)]
        parts.append(", ".join(words))
        if host.get("loadavg_start"):
            start = " / ".join(f"{x:.2f}" for x in host["loadavg_start"])
            end = " / ".join(f"{x:.2f}" for x in host.get("loadavg_end", []))
            parts.append(f"load average (1 / 5 / 15 min) {start} at the start, {end} at the end")
    return "; ".join(part for part in parts if part) or "-"


def _host(host: Mapping[str, Any]) -> str:
    """A :func:`fedsync.reports.provenance.machine` block in words."""
    parts = [f"{host.get('cpus', '-')} CPUs, {host.get('platform', '-')}"]
    parts.append(", ".join(f"{k} {host[k]}" for k in ("python", "torch", "flwr") if host.get(k)))
    if host.get("load_average"):
        load = " / ".join(f"{x:.2f}" for x in host["load_average"])
        if host.get("load_average_end"):  # a benchmark that records both ends
            end = " / ".join(f"{x:.2f}" for x in host["load_average_end"])
            load = f"(1 / 5 / 15 min) {load} at the start, {end} at the end"
        parts.append(f"load average {load}")
    return "; ".join(part for part in parts if part)


# --- formatting -------------------------------------------------------------------------------
def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


def _times(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _rows_described(result: Result, keys: Iterable[str]) -> list[str]:
    described = [f"- `{key}`: {result.label(key)}" for key in keys if result.label(key)]
    return [*described, ""] if described else []


def _figures(result: Result) -> list[str]:
    folder = result.path.parent
    return [
        f"![{result.heading}: {name}](../../{folder / name})\n"
        for name in result.spec.get("figures", [])
    ]


# --- comparisons ------------------------------------------------------------------------------
def _rows(result: Result) -> dict[str, dict[str, Any]]:
    rows = result.data.get("strategies")
    if not isinstance(rows, list):
        raise PagesError(f"{result.where}: {result.path} has no strategies")
    return {str(row["label"]): row for row in rows}


def _row(result: Result, label: str) -> dict[str, Any]:
    rows = _rows(result)
    if label not in rows:
        raise PagesError(f"{result.where}: {result.path} has no row {label!r}")
    return rows[label]


def _is_loss(result: Result) -> bool:
    return result.data.get("target_metric") == "loss"


def _metric(result: Result) -> str:
    """What the target is of: ``accuracy`` or ``test loss``."""
    return "test loss" if _is_loss(result) else "accuracy"


def _target_total(row: Mapping[str, Any]) -> int | None:
    target = row.get("target") or {}
    if not target.get("reached"):
        return None
    total = target.get("bytes_total")
    return int(total) if total is not None else int(target["bytes_up"]) + int(target["bytes_down"])


def _final(result: Result, row: Mapping[str, Any]) -> float | None:
    value = row.get("final_loss") if _is_loss(result) else row.get("final_accuracy")
    return None if value is None else float(value)


def _updates(row: Mapping[str, Any]) -> int:
    return sum(int(n) for n in (row.get("staleness_histogram") or {}).values())


def _render_comparison(result: Result) -> list[str]:
    data, loss = result.data, _is_loss(result)
    rows = _rows(result)
    base = str(data.get("baseline", ""))
    base_total = _target_total(rows[base]) if base in rows else None
    metric = "test loss" if loss else "accuracy"
    target = data.get("target_loss") if loss else data.get("target_accuracy")
    rule = data.get("target_rule", {})
    lines = [str(data.get("description", "")).strip(), ""]
    lines += [
        f"Scenario `{data.get('scenario')}` at scale {data.get('scale')}; target {metric} "
        f"**{_f(target, '.4f')}** (rule `{rule.get('kind')}` = {rule.get('value')}); "
        f"ratios are strategy / `{base}` (below 1: sooner, fewer bytes).",
        "",
    ]
    head = ["strategy", f"final {metric} (best)"]
    if loss:
        head.append("final acc")
    head += ["sim s to target", f"time / `{base}`"]
    head += ["MB up to target", "MB down to target", "MB total to target", f"bytes / `{base}`"]
    table = []
    for label, row in rows.items():
        spec = ".4f" if loss else ".3f"
        best = row.get("best_loss") if loss else row.get("best_accuracy")
        final = _f(_final(result, row), spec)
        if best is not None and final not in ("-", f"{best:{spec}}"):
            final += f" ({best:{spec}})"
        if not row.get("completed"):
            final += f", {row.get('status')}"
        cells = [f"`{label}`", final]
        if loss:
            cells.append(_f(row.get("final_accuracy"), ".3f"))
        hit = row.get("target") or {}
        total = _target_total(row)
        if hit.get("reached"):
            ratios = row.get("ratios_vs_baseline") or {}
            bytes_ratio = total / base_total if total is not None and base_total else None
            cells += [
                f"{hit['sim_time']:.1f}",
                _f(ratios.get("time_to_target"), ".3g"),
                _mb(hit.get("bytes_up")),
                _mb(hit.get("bytes_down")),
                _mb(total),
                _f(bytes_ratio, ".3g"),
            ]
        else:
            cells += ["not reached", "-", "-", "-", "-", "-"]
        table.append(cells)
    lines += ["To the target:", "", *_table(head, table)]
    whole = []
    for label, row in rows.items():
        updates = _updates(row)
        up, down = row.get("total_bytes_up"), row.get("total_bytes_down")
        per_update = f"{up / updates / 1e3:.2f}" if updates and up is not None else "-"
        whole.append(
            [
                f"`{label}`",
                _f(row.get("sim_time"), ".1f"),
                _mb(up),
                _mb(down),
                _mb(None if up is None or down is None else up + down),
                str(updates) if updates else "-",
                per_update,
                _f(row.get("mean_staleness"), ".2f"),
                _f(row.get("wall_seconds"), ".0f"),
            ]
        )
    head = ["strategy", "sim s", "MB up", "MB down", "MB total", "updates received"]
    head += ["kB up / update", "mean staleness", "wall s"]
    lines += ["The whole run:", "", *_table(head, whole)]
    lines += _rows_described(result, rows)
    lines += _goals(result, _comparison_goal)
    lines += _figures(result)
    return lines


_Judged = tuple[str, str, bool]
"""A goal's text, what was measured, and whether it is met."""


def _goals(result: Result, judge: Callable[[Result, Mapping[str, Any]], _Judged]) -> list[str]:
    """The ``Goals:`` table of a result, each goal in the manifest judged by ``judge``."""
    goals = result.spec.get("goals", [])
    if not goals:
        return []
    table = []
    for goal in goals:
        try:
            text, measured, met = judge(result, goal)
        except KeyError as err:
            raise PagesError(f"{result.where}: goal {dict(goal)!r} needs {err}") from err
        table.append([f"`{goal['row']}`: {text}", measured, "yes" if met else "no"])
    return ["Goals:", "", *_table(["goal", "measured", "met"], table)]


def _comparison_goal(result: Result, goal: Mapping[str, Any]) -> _Judged:
    row, than = _row(result, goal["row"]), _row(result, goal["than"])
    kind = goal.get("kind")
    if kind == "sooner":
        return _sooner(goal, row, than)
    if kind == "fewer-bytes":
        return _fewer_bytes(goal, row, than)
    if kind == "accuracy-within":
        text = _within_text(goal)
        mine, theirs = row.get("final_accuracy"), than.get("final_accuracy")
        if mine is None or theirs is None:
            return text, "no final accuracy", False
        diff = (mine - theirs) * 100
        measured = f"{diff:+.1f} points ({mine:.3f} against {theirs:.3f})"
        return text, measured, diff >= -float(goal["points"])
    raise PagesError(f"{result.where}: goal kind {kind!r} is not known")


def _sooner_text(goal: Mapping[str, Any]) -> str:
    factor, name = float(goal.get("factor", 1)), f"`{goal['than']}`"
    if factor == 1:
        return f"sooner to the target than {name}"
    return f">= {factor:g}x sooner to the target than {name}"


def _is_sooner(ratio: float, goal: Mapping[str, Any]) -> bool:
    """Whether ``ratio`` (the other's time over the row's) meets a ``sooner`` goal: at
    least its ``factor``, or above 1 when it gives none."""
    factor = float(goal.get("factor", 1))
    return ratio >= factor if factor != 1 else ratio > 1


def _fewer_text(goal: Mapping[str, Any]) -> str:
    what = "uplink bytes" if goal.get("which", "total") == "up" else "bytes up and down"
    return f">= {float(goal.get('factor', 1)):g}x fewer {what} to the target than `{goal['than']}`"


def _within_text(goal: Mapping[str, Any]) -> str:
    points = float(goal["points"])
    unit = "point" if points == 1 else "points"
    return f"final accuracy within {points:g} {unit} of `{goal['than']}`"


def _sooner(goal: Mapping[str, Any], row: Mapping[str, Any], than: Mapping[str, Any]) -> _Judged:
    text, name = _sooner_text(goal), f"`{goal['than']}`"
    mine, theirs = row.get("target") or {}, than.get("target") or {}
    if not mine.get("reached"):
        return text, f"`{goal['row']}` did not reach the target", False
    if not theirs.get("reached"):
        return text, f"{name} did not reach the target", True
    ratio = theirs["sim_time"] / mine["sim_time"]
    measured = f"{_times(ratio)} ({mine['sim_time']:.1f} s against {theirs['sim_time']:.1f} s)"
    return text, measured, _is_sooner(ratio, goal)


def _fewer_bytes(
    goal: Mapping[str, Any], row: Mapping[str, Any], than: Mapping[str, Any]
) -> _Judged:
    factor, which = float(goal.get("factor", 1)), str(goal.get("which", "total"))
    text = _fewer_text(goal)

    def count(r: Mapping[str, Any]) -> int | None:  # None: did not reach the target
        if which != "up":
            return _target_total(r)
        target = r.get("target") or {}
        return int(target["bytes_up"]) if target.get("reached") else None

    mine, theirs = count(row), count(than)
    if mine is None:
        return text, f"`{goal['row']}` did not reach the target", False
    if theirs is None:
        return text, f"`{goal['than']}` did not reach the target", True
    ratio = theirs / mine
    return text, f"{_times(ratio)} ({_mb(mine)} MB against {_mb(theirs)} MB)", ratio >= factor


def _headline_comparison(result: Result, headline: Mapping[str, Any]) -> str:
    label, other = str(headline["row"]), str(headline["than"])
    row, than = _row(result, label), _row(result, other)
    metric = _metric(result)
    spec = ".3f"
    head = f"`{label}` against `{other}`"
    mine, theirs = row.get("target") or {}, than.get("target") or {}
    finals = (
        f"final {metric} {_f(_final(result, row), spec)} against {_f(_final(result, than), spec)}"
    )
    if mine.get("reached") and theirs.get("reached"):
        time = theirs["sim_time"] / mine["sim_time"]
        volume = (_target_total(than) or 0) / (_target_total(row) or 1)
        return (
            f"{head}: {_more_or_less(time, 'sooner', 'later')} to the target {metric} in "
            f"simulated time, on {_more_or_less(volume, 'fewer', 'more')} bytes up and down; "
            f"{finals}."
        )
    totals = [
        (r.get("total_bytes_up") or 0) + (r.get("total_bytes_down") or 0) for r in (row, than)
    ]
    whole = totals[1] / totals[0] if totals[0] else None
    moved = ""
    if whole and abs(whole - 1) >= 0.01:
        moved = f", on {_more_or_less(whole, 'fewer', 'more')} bytes over the whole run"
    reached = "reached" if mine.get("reached") else "did not reach"
    return f"{head}: {reached} the target {metric}; {finals}{moved}."


def _more_or_less(ratio: float, more: str, less: str) -> str:
    return f"{_times(ratio)} {more}" if ratio >= 1 else f"{_times(1 / ratio)} {less}"


# --- several seeds of a comparison (fedsync.simulations.seeds) ------------------------------
_TIME, _SMOOTHED = "sim_time_to_target", "sim_time_to_target_smoothed"
_TOTAL, _FINAL = "bytes_total_to_target", "final_accuracy"
_UP_DOWN = ("bytes_up_to_target", "bytes_down_to_target")
_RUN = ("bytes_up_run", "bytes_down_run")


def _seeds_final(result: Result) -> tuple[str, str]:
    """The final quality's metric key and column heading: the test loss where the
    target is a loss, else the accuracy."""
    return ("final_loss", "final loss") if _is_loss(result) else (_FINAL, "final acc")


def _seeds(result: Result) -> list[Any]:
    """The seeds, in the order of every metric's ``values``."""
    seeds = [i.get("seed") for i in _entries(result.data, "inputs")]
    if not seeds:
        raise PagesError(f"{result.where}: {result.path} has no inputs")
    return seeds


def _stats(result: Result, row: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A row's metric: its ``values`` (one per seed), ``n``, ``mean``, ``min`` and ``max``."""
    stats = (row.get("metrics") or {}).get(key)
    if not isinstance(stats, dict) or len(stats.get("values") or []) != len(_seeds(result)):
        raise PagesError(
            f"{result.where}: {result.path}: row {row['label']!r} has no {key} by seed"
        )
    return stats


def _pairs(
    result: Result, row: Mapping[str, Any], than: Mapping[str, Any], key: str
) -> list[tuple[Any, float, float]]:
    """``(seed, row's value, than's value)`` of a metric in every seed where both have one
    (to the target: where both reached it)."""
    mine, theirs = _stats(result, row, key)["values"], _stats(result, than, key)["values"]
    return [
        (seed, a, b)
        for seed, a, b in zip(_seeds(result), mine, theirs, strict=True)
        if a is not None and b is not None
    ]


def _by_seed(pairs: Iterable[tuple[Any, float, float]]) -> list[tuple[Any, float]]:
    """``(seed, than's value / row's value)``: how many times fewer, or how much sooner."""
    return [(seed, b / a) for seed, a, b in pairs if a > 0 and b > 0]


def _fewer_of_means(
    result: Result, row: Mapping[str, Any], than: Mapping[str, Any], key: str
) -> tuple[float, float, float] | None:
    """Than's mean over the row's, and the two means, over the seeds where both have the
    metric (:func:`fedsync.simulations.seeds.fewer_of_means`); ``None`` where there are
    none."""
    return fewer_of_means(_stats(result, row, key)["values"], _stats(result, than, key)["values"])


def _sooner_of_ratios(
    result: Result, row: Mapping[str, Any], than: Mapping[str, Any]
) -> float | None:
    """1 / the mean over the seeds where both reached the target of the row's simulated
    time to it over than's (the time ratio); ``None`` where there are none."""
    ratios = [a / b for _, a, b in _pairs(result, row, than, _TIME) if b > 0]
    mean = statistics.fmean(ratios) if ratios else 0
    return 1 / mean if mean > 0 else None


def _spread(stats: Mapping[str, Any], spec: str, unit: float = 1) -> str:
    """``mean (min-max)``, in ``unit`` (1e6: bytes as MB); ``-`` when there is none."""
    if stats.get("mean") is None:
        return "-"
    low, mean, high = (float(stats[key]) / unit for key in ("min", "mean", "max"))
    return f"{mean:{spec}} ({low:{spec}}-{high:{spec}})"


def _times_range(ratios: Sequence[float]) -> str:
    """``low-highx`` of ratios, or ``-``."""
    if not ratios:
        return "-"
    return f"{_times(min(ratios)).removesuffix('x')}-{_times(max(ratios))}"


def _worst(by_seed: Sequence[tuple[Any, float]], show: Callable[[float], str]) -> str:
    """``; worst seed <value> (seed <seed>)`` of the smallest value, or ``""``."""
    if not by_seed:
        return ""
    seed, value = min(by_seed, key=lambda pair: pair[1])
    return f"; worst seed {show(value)} (seed {seed})"


def _render_seeds(result: Result) -> list[str]:
    data, count = result.data, len(_seeds(result))
    base = str(data.get("baseline", ""))
    rule = data.get("target_rule") or {}
    targets = ", ".join(
        f"**{_f(entry.get('target'), '.4f')}** under seed {entry.get('seed')}"
        for entry in _entries(data, "inputs")
    )
    lines = [
        f"Scenario `{data.get('scenario')}` at scale {data.get('scale')} over {count} seeds. "
        f"Every seed fixes its own target {_metric(result)} from its own runs (rule "
        f"`{rule.get('kind')}` = {rule.get('value')}): {targets}. Smoothed: the first "
        f"evaluation where the trailing mean of the last {data.get('smoothing_window')} "
        "evaluations reaches the target.",
        "",
        "Over the seeds: mean (min-max) of those with a value; up and down, the mean alone. "
        f"Against `{base}`, over the seeds where both reached the target (above 1: fewer "
        f"bytes, sooner): fewer bytes is `{base}`'s mean over the strategy's (ratio of "
        "means); sooner is 1 / the mean of the seeds' time ratios, the strategy's simulated "
        f"time to the target over `{base}`'s (mean ratio); by seed, the range of each "
        "seed's own ratio.",
        "",
    ]
    lines += _seeds_table(result, base)
    lines += _rows_described(result, _rows(result))
    lines += ["Every run:", "", *_seeds_runs(result)]
    lines += [
        "Each seed's comparison (the command, commit, date and machine above are those of "
        "the summary):",
        "",
    ]
    for entry in _entries(data, "inputs"):
        line = f"- seed {entry.get('seed')}: `{entry.get('dir')}`"
        line += f", commit `{entry.get('commit') or '-'}`"
        if entry.get("date"):
            line += f", run on {entry['date']}"
        if isinstance(entry.get("machine"), dict):
            line += f"; machine: {_host(entry['machine'])}"
        if entry.get("command"):
            line += f"; `{entry['command']}`"
        lines.append(line)
    lines.append("")
    lines += _goals(result, _seeds_goal)
    lines += _figures(result)
    return lines


def _seeds_table(result: Result, base: str) -> list[str]:
    """Each strategy over the seeds."""
    rows, count = _rows(result), len(_seeds(result))
    final, final_head = _seeds_final(result)
    head = ["strategy", "reached", final_head, "sim s to target", "smoothed sim s to target"]
    head += ["MB total to target", "MB up to target", "MB down to target"]
    whole = all(key in (row.get("metrics") or {}) for row in rows.values() for key in _RUN)
    if whole:
        head.append("MB total (run)")
    head += [f"fewer bytes than `{base}` (ratio of means)", "by seed"]
    head += [f"sooner than `{base}` (mean ratio)", "by seed"]
    table = []
    for label, row in rows.items():
        reached, smoothed = (_stats(result, row, key)["n"] for key in (_TIME, _SMOOTHED))
        cells = [f"`{label}`", f"{reached} of {count}"]
        if smoothed != reached:
            cells[-1] += f", smoothed {smoothed}"
        cells.append(_spread(_stats(result, row, final), ".3f"))
        for key, spec, unit in ((_TIME, ".1f", 1), (_SMOOTHED, ".1f", 1), (_TOTAL, ".2f", 1e6)):
            stats = _stats(result, row, key)
            cells.append(_spread(stats, spec, unit) if stats["n"] else "not reached")
        cells += [_mb(_stats(result, row, key)["mean"]) for key in _UP_DOWN]
        if whole:
            means = [_stats(result, row, key)["mean"] for key in _RUN]
            cells.append("-" if None in means else _mb(sum(means)))
        if base in rows:
            fewer = _fewer_of_means(result, row, rows[base], _TOTAL)
            sooner = _sooner_of_ratios(result, row, rows[base])
            cells += [
                "-" if fewer is None else _times(fewer[0]),
                _times_range([x for _, x in _by_seed(_pairs(result, row, rows[base], _TOTAL))]),
                "-" if sooner is None else _times(sooner),
                _times_range([x for _, x in _by_seed(_pairs(result, row, rows[base], _TIME))]),
            ]
        else:
            cells += ["-"] * 4
        table.append(cells)
    return _table(head, table)


def _seeds_runs(result: Result) -> list[str]:
    """Every strategy under every seed."""
    final_key, final_head = _seeds_final(result)
    head = ["strategy", "seed", final_head, "sim s to target", "smoothed sim s to target"]
    head.append("MB total to target")
    table = []
    for label, row in _rows(result).items():
        columns = [_stats(result, row, key)["values"] for key in (final_key, _TIME, _SMOOTHED)]
        columns.append(
            [None if x is None else _mb(x) for x in _stats(result, row, _TOTAL)["values"]]
        )
        for i, seed in enumerate(_seeds(result)):
            final, time, smoothed, total = (column[i] for column in columns)
            if final is None:  # not run under this seed
                table.append([f"`{label}`", str(seed), "-", "-", "-", "-"])
                continue
            reached = [None if x is None else f"{x:.1f}" for x in (time, smoothed)] + [total]
            cells = [f"`{label}`", str(seed), f"{final:.3f}"]
            table.append(cells + ["not reached" if x is None else x for x in reached])
    return _table(head, table)


def _seeds_goal(result: Result, goal: Mapping[str, Any]) -> _Judged:
    """A goal of a seeds result, as the module's docstring says."""
    kind = goal.get("kind")
    if kind not in _SEEDS_GOALS:
        raise PagesError(f"{result.where}: goal kind {kind!r} is not known")
    return _SEEDS_GOALS[kind](result, goal)


def _short(result: Result, label: str) -> str:
    """``"`label` reached the target under n of N seeds"`` if it missed it under a seed,
    else ``""``."""
    reached = _stats(result, _row(result, label), _TIME)["n"]
    count = len(_seeds(result))
    return (
        f"`{label}` reached the target under {reached} of {count} seeds" if reached < count else ""
    )


def _seeds_time_at_most(result: Result, goal: Mapping[str, Any]) -> _Judged:
    seconds = float(goal["seconds"])
    text = f"at most {seconds:g} simulated s to the target (mean)"
    if missed := _short(result, str(goal["row"])):
        return text, missed, False
    stats = _stats(result, _row(result, str(goal["row"])), _TIME)
    measured = f"{stats['mean']:.1f} s ({stats['min']:.1f}-{stats['max']:.1f} s by seed)"
    return text, measured, stats["mean"] <= seconds


def _seeds_within(result: Result, goal: Mapping[str, Any]) -> _Judged:
    text = _within_text(goal) + " (means)"
    pairs = _pairs(result, _row(result, goal["row"]), _row(result, goal["than"]), _FINAL)
    if not pairs:
        return text, "no final accuracies under the same seed", False
    mine, theirs = (statistics.fmean(pair[i] for pair in pairs) for i in (1, 2))
    diff = (mine - theirs) * 100
    worst = _worst([(seed, (a - b) * 100) for seed, a, b in pairs], lambda x: f"{x:+.1f} points")
    means = "means" if len(pairs) == len(_seeds(result)) else f"means over {len(pairs)} seeds"
    measured = f"{diff:+.1f} points ({mine:.3f} against {theirs:.3f}, {means}){worst}"
    return text, measured, diff >= -float(goal["points"])


def _seeds_sooner(result: Result, goal: Mapping[str, Any]) -> _Judged:
    return _seeds_ratio_goal(result, goal, _sooner_text(goal) + " (mean ratio)", _TIME)


def _seeds_fewer_bytes(result: Result, goal: Mapping[str, Any]) -> _Judged:
    key = "bytes_up_to_target" if goal.get("which", "total") == "up" else _TOTAL
    return _seeds_ratio_goal(result, goal, _fewer_text(goal) + " (ratio of means)", key)


def _seeds_ratio_goal(result: Result, goal: Mapping[str, Any], text: str, key: str) -> _Judged:
    """A ``sooner`` (``key``: the time) or ``fewer-bytes`` goal of a seeds result."""
    label, other = str(goal["row"]), str(goal["than"])
    row, than = _row(result, label), _row(result, other)
    if missed := _short(result, label):
        return text, missed, False
    pairs = _pairs(result, row, than, key)
    if key == _TIME:
        ratio, details = _sooner_of_ratios(result, row, than), ""
    elif fewer := _fewer_of_means(result, row, than, key):
        ratio, details = fewer[0], f"{_mb(fewer[1])} MB against {_mb(fewer[2])} MB, means "
    else:
        ratio = None
    if ratio is None:
        return text, f"`{other}` did not reach the target under any seed", True
    by_seed = _by_seed(pairs)
    details += f"over {len(pairs)} seeds"
    if missed := _short(result, other):
        details += f"; {missed}"
    measured = f"{_times(ratio)} ({details}){_worst(by_seed, _times)}"
    if key == _TIME:
        return text, measured, _is_sooner(ratio, goal)
    return text, measured, ratio >= float(goal.get("factor", 1))


_SEEDS_GOALS: dict[Any, Callable[[Result, Mapping[str, Any]], _Judged]] = {
    "sooner": _seeds_sooner,
    "fewer-bytes": _seeds_fewer_bytes,
    "accuracy-within": _seeds_within,
    "time-at-most": _seeds_time_at_most,
}


def _headline_seeds(result: Result, headline: Mapping[str, Any]) -> str:
    label, other = str(headline["row"]), str(headline["than"])
    row, than = _row(result, label), _row(result, other)
    count, metric = len(_seeds(result)), _metric(result)
    head = f"`{label}` against `{other}` over {count} seeds"
    if short := "; ".join(filter(None, (_short(result, label), _short(result, other)))):
        head += f" ({short})"
    final_key = _seeds_final(result)[0]
    finals = _pairs(result, row, than, final_key)
    mine, theirs = (
        _f(statistics.fmean(p[i] for p in finals) if finals else None, ".3f") for i in (1, 2)
    )
    accuracy = f"final {metric} {mine} against {theirs} (means)"
    sooner, fewer = _sooner_of_ratios(result, row, than), _fewer_of_means(result, row, than, _TOTAL)
    if sooner is None or fewer is None:
        return f"{head}: no seed where both reached the target {metric}; {accuracy}."
    time, times = _more_or_less_by_seed(sooner, _pairs(result, row, than, _TIME), "sooner", "later")
    volume, volumes = _more_or_less_by_seed(
        fewer[0], _pairs(result, row, than, _TOTAL), "fewer", "more"
    )
    return (
        f"{head}: {time} to the target {metric} in simulated time (mean ratio; {times} by "
        f"seed), on {volume} bytes up and down (ratio of means; {volumes} by seed); {accuracy}."
    )


def _more_or_less_by_seed(
    ratio: float, pairs: Iterable[tuple[Any, float, float]], more: str, less: str
) -> tuple[str, str]:
    """:func:`_more_or_less` of ``ratio``, and the range of the seeds' own ratios (of
    ``pairs``, :func:`_by_seed`) in the same sense."""
    ratios = [x for _, x in _by_seed(pairs)]
    if ratio < 1:
        ratios = [1 / x for x in ratios]
    return _more_or_less(ratio, more, less), _times_range(ratios)


# --- link ratio (fedsync.simulations.linkbound) -----------------------------------------------
def _render_link_ratio(result: Result) -> list[str]:
    data = result.data
    median = data.get("median_device") or {}
    share = {k: v for k, v in data.items() if k.startswith("share_of_devices_at_least_")}
    lines = [
        f"{data.get('devices')} devices. The median device by compute time is device "
        f"{median.get('device')} ({median.get('group')}, {median.get('examples')} examples): "
        f"{_f(median.get('compute_s'), '.2f')} s of compute, {median.get('upload_bytes')} B "
        f"uploaded in {_f(median.get('upload_s'), '.2f')} s, a ratio of "
        f"**{_f(median.get('ratio'), '.2f')}**. Median ratio over all devices: "
        f"{_f(data.get('median_ratio_over_devices'), '.2f')}"
        + "".join(
            f"; share of devices at {_threshold(key)}x or more: {value:.0%}"
            for key, value in share.items()
        )
        + ".",
        "",
    ]
    groups = data.get("groups") or {}
    table = [
        [
            name,
            str(g.get("devices")),
            _f(g.get("median_compute_s"), ".2f"),
            _f(g.get("median_upload_s"), ".2f"),
            _f(g.get("median_ratio"), ".2f"),
        ]
        for name, g in groups.items()
    ]
    head = ["group", "devices", "median compute s", "median upload s", "median upload / compute"]
    lines += _table(head, table)
    spent = data.get("bytes_by_kind")
    if isinstance(spent, dict):
        lines += [
            f"Bytes until simulated second {_f(spent.get('until_sim_time'), '.1f')}: "
            f"{spent.get('updates')} updates, {_mb(spent.get('uplink_bytes'))} MB up; "
            f"{spent.get('devices_reached')} devices had been sent a task.",
            "",
        ]
        down = spent.get("downlink") or {}
        lines += _table(
            ["downlink kind", "tasks", "MB"],
            [[kind, str(v.get("tasks")), _mb(v.get("bytes"))] for kind, v in down.items()],
        )
    return lines


def _threshold(key: str) -> str:
    return key.removeprefix("share_of_devices_at_least_").removesuffix("x")


def _headline_link_ratio(result: Result, headline: Mapping[str, Any]) -> str:
    median = result.data.get("median_device") or {}
    return (
        f"{headline.get('what', 'the update')}: the median device uploads it in "
        f"{_f(median.get('ratio'), '.2f')}x its compute time "
        f"({_f(median.get('upload_s'), '.2f')} s against {_f(median.get('compute_s'), '.2f')} s)."
    )


# --- deployment overhead (benchmarks.deploy_overhead) -----------------------------------------
_PHASES = (
    ("poll_wait", "poll wait (SuperNode poll)"),
    ("download", "download"),
    ("exec_start", "ClientApp process start"),
    ("clientapp_boot", "ClientApp boot"),
    ("imports", "imports"),
    ("data", "data"),
    ("training", "training"),
    ("encode", "decode / encode, rest"),
    ("reply_wait", "reply wait (SuperNode)"),
    ("upload", "upload"),
    ("server", "server decode + replan"),
)


def _steady(result: Result, mode: str) -> dict[str, Any]:
    summary = result.data.get("summary") or {}
    if mode not in summary:
        raise PagesError(f"{result.where}: {result.path} has no path {mode!r}")
    return dict(summary[mode]["steady"])


def _render_deploy(result: Result) -> list[str]:
    data = result.data
    modes = list(data.get("summary") or {})
    steady = {mode: _steady(result, mode) for mode in modes}
    head = ["phase (s, median)", *(f"`{m}`" for m in modes)]
    table = [
        [name, *(_f(steady[m].get(key, {}).get("median"), ".3f") for m in modes)]
        for key, name in _PHASES
    ]
    for key, name in (("round_trip_s", "**round trip**"), ("overhead_s", "**overhead**")):
        table.append([name, *(_median_range(steady[m].get(key)) for m in modes)])
    table.append(["tasks (after each node's first)", *(str(steady[m].get("tasks")) for m in modes)])
    runs = data.get("runs") or {}
    table.append(["run wall s", *(_f(runs.get(m, {}).get("wall_s"), ".1f") for m in modes)])
    if any(runs.get(m, {}).get("superlink_cpu_s") is not None for m in modes):
        cpu = [_f(runs.get(m, {}).get("superlink_cpu_s"), ".2f") for m in modes]
        table.append(["SuperLink CPU s", *cpu])
        rate = [_cpu_rate(runs.get(m, {})) for m in modes]
        table.append(["SuperLink CPU s per wall s", *rate])
    table.append(["node RSS MB (min to max)", *(_rss_range(runs.get(m, {})) for m in modes)])
    lines = [
        f"{data.get('nodes')} nodes; the executor's poll of its SuperNode "
        f"{_f(data.get('exec_poll_s'), 'g')} s. Overhead is the round trip less training, "
        "download and upload; medians (min to max) over the tasks after each node's first.",
        "",
    ]
    lines += _table(head, table)
    for label, ratio in (data.get("ratios") or {}).items():
        lines.append(
            f"- `{label}`: round trip {_f(ratio.get('round_trip_s'), '.2f')}x, "
            f"overhead {_f(ratio.get('overhead_s'), '.2f')}x (ratio of medians)"
        )
    if data.get("ratios"):
        lines.append("")
    lines += _rows_described(result, modes)
    lines += _figures(result)
    return lines


def _cpu_rate(run: Mapping[str, Any]) -> str:
    cpu, wall = run.get("superlink_cpu_s"), run.get("wall_s")
    return f"{cpu / wall:.3f}" if cpu is not None and wall else "-"


def _median_range(stats: Mapping[str, Any] | None) -> str:
    if not stats:
        return "-"
    return f"{stats['median']:.3f} ({stats['min']:.2f} to {stats['max']:.2f})"


def _rss_range(run: Mapping[str, Any]) -> str:
    values = [x for sample in run.get("rss_mb", []) for x in sample["rss_mb"]]
    return f"{min(values):.0f} to {max(values):.0f}" if values else "-"


def _headline_deploy(result: Result, headline: Mapping[str, Any]) -> str:
    mode = str(headline["mode"])
    overhead = _steady(result, mode)["overhead_s"]
    name = result.label(mode) or f"`{mode}`"
    text = (
        f"{name}: per-task overhead {overhead['median']:.2f} s median "
        f"(min {overhead['min']:.2f}, max {overhead['max']:.2f} s)"
    )
    if "than" in headline:
        other = str(headline["than"])
        theirs = _steady(result, other)["overhead_s"]["median"]
        text += f", against {theirs:.2f} s for {result.label(other) or f'`{other}`'}"
    return text + "."


# --- soak (benchmarks.deploy_overhead --soak) -------------------------------------------------
def _soak_run(result: Result) -> tuple[str, dict[str, Any]]:
    runs = result.data.get("runs") or {}
    if len(runs) != 1:
        raise PagesError(f"{result.where}: {result.path}: a soak has one path, not {len(runs)}")
    mode, run = next(iter(runs.items()))
    if not run.get("rss_mb"):
        raise PagesError(f"{result.where}: {result.path}: no RSS samples")
    return str(mode), dict(run)


def _soak_stats(run: Mapping[str, Any]) -> dict[str, Any]:
    """Per node: the first sample, the medians of the second and the last minute (the
    first is the warm-up), the range after the first minute and the medians of windows
    of about five minutes."""
    samples = run["rss_mb"]
    end = samples[-1]["t"]
    nodes = len(samples[0]["rss_mb"])

    def median(i: int, lo: float, hi: float) -> float | None:
        values = [s["rss_mb"][i] for s in samples if lo < s["t"] <= hi]
        return statistics.median(values) if values else None

    windows = max(1, round(end / 300))
    width = end / windows
    return {
        "end": end,
        "start": samples[0]["rss_mb"],
        "warm": [median(i, 60, 120) for i in range(nodes)],
        "last": [median(i, end - 60, end) for i in range(nodes)],
        "later": [[s["rss_mb"][i] for s in samples if s["t"] > 60] for i in range(nodes)],
        "windows": [
            [median(i, k * width, (k + 1) * width) for k in range(windows)] for i in range(nodes)
        ],
        "width": width,
    }


def _change(warm: float | None, last: float | None) -> str:
    return "-" if warm is None or last is None else f"{last - warm:+.1f}"


def _render_soak(result: Result) -> list[str]:
    mode, run = _soak_run(result)
    stats = _soak_stats(run)
    summary = (result.data.get("summary") or {}).get(mode, {}).get("all", {})
    trip = summary.get("round_trip_s") or {}
    cpu = run.get("superlink_cpu_s")
    lines = [
        f"Path `{mode}`: {len(run.get('tasks', []))} tasks in {run.get('wall_s')} s"
        + (f", SuperLink CPU {cpu:.1f} s" if cpu is not None else "")
        + f"; round trip median {_f(trip.get('median'), '.2f')} s (min "
        f"{_f(trip.get('min'), '.2f')}, max {_f(trip.get('max'), '.2f')}); "
        f"{len(run['rss_mb'])} RSS samples per node over {stats['end']:.0f} s. "
        "Resident memory in MB, all processes of a node's process group:",
        "",
    ]
    width = stats["width"] / 60
    head = ["node", "first sample", "second minute (median)", "last minute (median)"]
    head += ["change", "after the first minute (min to max)"]
    head += [f"{k * width:.0f}-{(k + 1) * width:.0f} min" for k in range(len(stats["windows"][0]))]
    table = []
    for i, start in enumerate(stats["start"]):
        later = stats["later"][i]
        table.append(
            [
                str(i),
                f"{start:.1f}",
                _f(stats["warm"][i], ".1f"),
                _f(stats["last"][i], ".1f"),
                _change(stats["warm"][i], stats["last"][i]),
                f"{min(later):.1f} to {max(later):.1f}" if later else "-",
                *(_f(m, ".0f") for m in stats["windows"][i]),
            ]
        )
    lines += _table(head, table)
    lines += _figures(result)
    return lines


def _headline_soak(result: Result, headline: Mapping[str, Any]) -> str:
    mode, run = _soak_run(result)
    stats = _soak_stats(run)
    change = " / ".join(_change(a, b) for a, b in zip(stats["warm"], stats["last"], strict=True))
    return (
        f"{result.label(mode) or f'`{mode}`'}, {run.get('wall_s', 0) / 60:.0f} minutes, "
        f"{len(run.get('tasks', []))} tasks: each node's resident memory moved {change} MB "
        "from its second minute to its last (medians)."
    )


# --- tables (any JSON) ------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"\{([^{}:*]+)(?:\*([^{}:]+))?(?::([^{}]*))?\}")
_MISSING = object()


@dataclass(frozen=True)
class _Row:
    chain: tuple[Any, ...]
    """The objects the row's path passed through, the row last."""
    keys: tuple[str, ...]
    """The keys of the path's ``*``s, outermost first."""


def _step(value: Any, parts: Sequence[str]) -> tuple[Any, int]:
    """The value one key down (the longest run of ``parts`` that is a key, so keys may
    hold dots) and how many parts that key took; ``_MISSING`` if none is."""
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if isinstance(value, Mapping) and key in value:
            return value[key], n
        if isinstance(value, list) and n == 1 and key.isdigit() and int(key) < len(value):
            return value[int(key)], n
    return _MISSING, 1


def _lookup(value: Any, path: str) -> Any:
    parts = path.split(".") if path else []
    while parts and value is not _MISSING:
        value, n = _step(value, parts)
        parts = parts[n:]
    return value


def _select(result: Result, path: str) -> list[_Row]:
    rows = [_Row((result.data,), ())]
    parts = path.split(".")
    last = parts[-1]
    while parts:
        if parts[0] == "*":
            parts = parts[1:]
            wider = []
            for row in rows:
                value = row.chain[-1]
                items = (
                    value.items()
                    if isinstance(value, Mapping)
                    else enumerate(value)
                    if isinstance(value, list)
                    else []
                )
                wider += [_Row((*row.chain, v), (*row.keys, str(k))) for k, v in items]
            rows = wider
            continue
        keys = parts[: parts.index("*")] if "*" in parts else parts
        stepped = [(row, *_step(row.chain[-1], keys)) for row in rows]
        rows = [_Row((*row.chain, v), row.keys) for row, v, _ in stepped if v is not _MISSING]
        parts = parts[stepped[0][2] if stepped else 1 :]
    if not rows:
        raise PagesError(f"{result.where}: {result.path} has nothing at {path!r}")
    if "*" not in path.split("."):
        rows = [_Row(row.chain, (last,)) for row in rows]
    return rows


def _value(row: _Row, path: str) -> Any:
    if path == ".":
        return row.chain[-1]
    if path == "@" or re.fullmatch(r"@\d+", path):
        index = int(path[1:]) - 1 if len(path) > 1 else len(row.keys) - 1
        return row.keys[index] if 0 <= index < len(row.keys) else _MISSING
    for value in reversed(row.chain):
        found = _lookup(value, path)
        if found is not _MISSING:
            return found
    return _MISSING


def _formatted(value: Any, scale: str | None, spec: str) -> str:
    if isinstance(value, list):
        return ", ".join(_formatted(v, scale, spec) for v in value)
    if isinstance(value, bool) and not spec:
        return "yes" if value else "no"
    if scale is not None and isinstance(value, int | float):
        value *= float(scale)
    return format(value, spec)


def _cell(row: _Row, template: str, where: str) -> str:
    values = {}
    for match in _PLACEHOLDER.finditer(template):
        value = _value(row, match.group(1).strip())
        if value is _MISSING or value is None:
            return "-"
        try:
            values[match.group(0)] = _formatted(value, match.group(2), match.group(3) or "")
        except (TypeError, ValueError) as err:
            raise PagesError(f"{where}: {match.group(0)}: {err}") from err
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], template)


def _render_tables(result: Result) -> list[str]:
    lines: list[str] = []
    for i, table in enumerate(result.spec["tables"]):
        where = f"{result.where}, table {i + 1}"
        paths = [table["rows"]] if isinstance(table["rows"], str) else list(table["rows"])
        rows = [row for path in paths for row in _select(result, str(path))]
        columns = [(str(head), str(template)) for head, template in table["columns"]]
        if table.get("caption"):
            lines += [str(table["caption"]).strip(), ""]
        body = [[_cell(row, template, where) for _, template in columns] for row in rows]
        lines += _table([head for head, _ in columns], body)
    lines += _rows_described(result, result.spec.get("labels", {}))
    lines += _figures(result)
    return lines


def _headline_table(result: Result, headline: Mapping[str, Any]) -> str:
    raise PagesError(f"{result.where}: a table result has no headlines")


# --- kinds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    render: Callable[[Result], list[str]]
    headline: Callable[[Result, Mapping[str, Any]], str]


_KINDS: dict[str, _Kind] = {
    "comparison": _Kind(_render_comparison, _headline_comparison),
    "seeds": _Kind(_render_seeds, _headline_seeds),
    "link-ratio": _Kind(_render_link_ratio, _headline_link_ratio),
    "deploy-overhead": _Kind(_render_deploy, _headline_deploy),
    "soak": _Kind(_render_soak, _headline_soak),
    "table": _Kind(_render_tables, _headline_table),
}


# --- GitHub's heading anchors -----------------------------------------------------------------
def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (before ``-1``, ``-2`` for repeats):
    inline markup dropped, lower case, punctuation other than ``-`` and ``_`` removed,
    spaces made ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


# --- the command line -------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedsync.simulations.pages [--check] [--root DIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog=GENERATOR, description="Write docs/results/*.md from sources.toml and the JSON."
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a page is stale"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_pages(args.root)
            for name in stale:
                print(f"stale: {PAGES / name}", file=sys.stderr)
            if stale:
                print(f"run `{GENERATOR}` and commit the pages", file=sys.stderr)
            return 1 if stale else 0
        for path in write_pages(args.root):
            print(f"wrote {path}")
    except PagesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
