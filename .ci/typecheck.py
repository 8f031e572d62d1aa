"""Type-check fedsync as it is installed: ``mypy`` over the package's import layout.

fedsync's top-level folders are installed inside the package by setuptools' mapping
(``[tool.setuptools.package-dir]`` in ``pyproject.toml``: ``kernels/`` is
``fedsync.kernels``, ``server/`` is ``fedsync.server``, ...). mypy finds modules by their
place on disk and cannot follow that mapping, so this script lays the sources out as
they are imported, in ``build/typecheck/`` (hard links, or copies where links cannot be
made), runs mypy there over ``fedsync`` and ``benchmarks``, and prints mypy's report with
each path turned back into the file in the repository.

Usage: ``python .ci/typecheck.py [MYPY_ARGS...]`` (``./dev test`` runs it); the exit
status is mypy's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"


def layout() -> dict[str, Path]:
    """Import-path folder (``fedsync/kernels``) -> its source folder, longest first."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"fedsync": ROOT / "fedsync", "benchmarks": ROOT / "benchmarks"}
    for package, folder in settings.get("package-dir", {}).items():
        folders[package.replace(".", "/")] = ROOT / folder
    return dict(sorted(folders.items(), key=lambda item: -len(item[0])))


def _place(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def build(folders: dict[str, Path]) -> None:
    """Lay every ``.py`` file of ``folders`` out under :data:`TREE` as it is imported."""
    if TREE.exists():
        for path in TREE.rglob("*.py"):
            path.unlink()
    for name, folder in folders.items():
        for source in folder.rglob("*.py"):
            parts = source.relative_to(folder).parts
            if "__pycache__" in parts or "results" in parts:
                continue
            _place(source, TREE / name / Path(*parts))


def main(argv: list[str]) -> int:
    folders = layout()
    build(folders)
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    command += [*argv, "fedsync", "benchmarks"]
    done = subprocess.run(command, cwd=TREE, capture_output=True, text=True, check=False)
    back = [
        (re.compile(rf"^{re.escape(name)}/"), f"{os.path.relpath(folder, ROOT)}/")
        for name, folder in folders.items()
    ]
    for line in (done.stdout + done.stderr).splitlines():
        for pattern, folder in back:
            if pattern.match(line):
                line = pattern.sub(folder, line, count=1)
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
