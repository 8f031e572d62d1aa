"""The repository's layout: one real package, no symbolic links, arrows that point down.

``fedsync/`` is the library. The top-level folders are installed inside it by setuptools'
``package-dir`` mapping: ``kernels/`` (``fedsync.kernels``) is the compute under the
codecs, ``server/`` and ``clients/`` (``fedsync.server``, ``fedsync.clients``) are
fedsync's own Flower ServerApp and ClientApp, ``simulations/`` (``fedsync.simulations``)
the scenarios and the comparison tooling. The import graph's arrows point one way::

    fedsync.kernels <- fedsync <- fedsync.server, fedsync.clients <- fedsync.simulations
"""

from __future__ import annotations

import ast
import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
MAPPED: dict[str, str] = SETTINGS["package-dir"]
"""Import name -> top-level folder."""
ABOVE_THE_LIBRARY = ("fedsync.server", "fedsync.clients", "fedsync.simulations")


def python_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.py")):
        if not {"__pycache__", "results"} & set(path.relative_to(folder).parts):
            yield path


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, function-level ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def arrows_into(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(folder.parent)}:{line}: imports {module}"
        for path in python_files(folder)
        for line, module in imported(path)
        if any(module == name or module.startswith(name + ".") for name in forbidden)
    ]


def test_no_symbolic_links_in_the_repository() -> None:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    links = [line.split("\t", 1)[1] for line in listing.splitlines() if line.startswith("120000")]
    assert not links, f"symbolic links in the repository: {links}"
    on_disk = [
        str(Path(folder, name).relative_to(ROOT))
        for top in ("fedsync", *MAPPED.values())
        for folder, dirs, files in os.walk(ROOT / top)
        for name in dirs + files
        if Path(folder, name).is_symlink()
    ]
    assert not on_disk, f"symbolic links in the package: {on_disk}"


def test_every_package_folder_is_installed() -> None:
    """``[tool.setuptools] packages`` lists exactly the folders that hold an ``__init__``."""
    found = set()
    for name, folder in {"fedsync": "fedsync", **MAPPED}.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "results" not in parts:
                found.add(".".join((name, *parts)))
    assert sorted(SETTINGS["packages"]) == sorted(found)


def test_the_library_imports_nothing_above_it() -> None:
    found = arrows_into(ROOT / "fedsync", ABOVE_THE_LIBRARY)
    assert not found, (
        "fedsync/ is the library: it must not import fedsync's own apps or simulation "
        "tooling (move what both need into fedsync/):\n" + "\n".join(found)
    )


def test_the_kernels_import_nothing_of_the_library() -> None:
    found = [
        arrow
        for arrow in arrows_into(ROOT / MAPPED["fedsync.kernels"], ("fedsync",))
        if not arrow.split("imports ", 1)[1].startswith("fedsync.kernels")
    ]
    assert not found, "the kernels are the bottom layer:\n" + "\n".join(found)


def test_the_apps_do_not_import_the_simulations() -> None:
    found = [
        arrow
        for app in ("fedsync.server", "fedsync.clients")
        for arrow in arrows_into(ROOT / MAPPED[app], ("fedsync.simulations",))
    ]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_real_arrow(tmp_path: Path) -> None:
    """The check is not vacuous: an import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fedsync.simulations.seeds import x\n")
    assert [m for _, m in imported(module)] == [
        "fedsync.simulations.seeds",
        "fedsync.simulations.seeds.x",
    ]
    assert arrows_into(tmp_path, ABOVE_THE_LIBRARY)


def test_each_strategy_file_is_one_registered_class() -> None:
    """A strategy is its file: the package imports every module, the class registers
    itself by subclassing (docs/architecture.md, "Adding a strategy")."""
    import fedsync.strategies as package
    from fedsync.strategies.base import STRATEGIES

    helpers = {"__init__", "base", "arguments"}
    modules = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py"))
    by_module = {cls.__module__.rsplit(".", 1)[1]: cls for cls in STRATEGIES.values()}
    assert sorted(by_module) == [m for m in modules if m not in helpers]
    assert len(by_module) == len(STRATEGIES)


def test_each_sparsifier_file_registers_its_stage() -> None:
    """A sparsifier is its file: the package imports every module, ``@register()`` adds
    its config (docs/architecture.md, "Adding a sparsifier")."""
    import fedsync.compression.sparsifiers as package
    from fedsync.compression.registry import REGISTRY

    modules = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py"))
    registered = {
        REGISTRY.find(name, "sparsifier").__module__.rsplit(".", 1)[1]  # type: ignore[union-attr]
        for name in REGISTRY.names("sparsifier")
    }
    assert registered == {m for m in modules if m != "__init__"}
