"""Resolve fedsync's install as a user's machine would, and fail on a conflict.

This machine's pip also reads local wheel folders (a CPU build of torch with no triton
requirement, and a cap on torch's version), which hides what a user meets on the public
index: there, torch's Linux wheels are CUDA builds that pin their own triton. So this
check ignores every local pip setting (``PIP_CONFIG_FILE=/dev/null`` and ``--isolated``;
``--isolated`` alone still reads the machine-wide configuration files) and resolves
against the public index only, from metadata, without downloading a wheel:

* on this platform (Linux x86-64, torch's CUDA build) with pip, for the ``test`` and the
  ``gpu`` extra: ``pip install --dry-run --report``, and for ``./dev setup``'s install
  (the ``test`` extra with the torch release ``dev`` pins);
* on macOS arm64 (no triton wheels) and Linux aarch64 (edge GPU boards) with uv, which
  resolves for a platform other than its own (pip evaluates markers for the machine it
  runs on).

Usage: ``python .ci/resolve.py [PROJECT_DIR]`` (``./dev resolve``); exit 1 on a conflict
or on a package taken from anywhere but the public index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test", "gpu")
OTHER_PLATFORMS = {
    # torch's macOS wheels are built for macOS 14 and later.
    "aarch64-apple-darwin": {"MACOSX_DEPLOYMENT_TARGET": "14.0"},
    "aarch64-unknown-linux-gnu": {},
}
SHOWN = ("torch", "triton", "flwr", "numpy", "numba")


def _public_env() -> dict[str, str]:
    """The environment without any pip or uv setting of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # no configuration file at all, global ones too
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["UV_NO_CONFIG"] = "1"
    return env


def dev_torch(root: Path) -> str | None:
    """The torch requirement ``./dev setup`` installs beside the project (``torch==X``)."""
    found = re.search(r"\"(torch==[0-9][^\"]*)\"", (root / "dev").read_text())
    return found.group(1) if found else None


def resolve_here(root: Path, extra: str, workdir: Path, *also: str) -> str | None:
    """Resolve ``.[extra]`` (and ``also``) for this platform with pip; ``None`` when it
    resolves."""
    label = " ".join([f"[{extra}]", *also])
    report = workdir / f"{extra}{len(also)}.json"
    command = [
        sys.executable, "-m", "pip", "install", "--isolated", "--dry-run",
        "--ignore-installed", "--quiet", "--report", str(report), f".[{extra}]", *also,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=root, env=_public_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip()
    installs = json.loads(report.read_text())["install"]
    local = [
        item["metadata"]["name"]
        for item in installs
        if item["download_info"]["url"].startswith("file:")
        and item["metadata"]["name"] != "fedsync"
    ]
    if local:
        return f"taken from a local folder, not the public index: {', '.join(local)}"
    versions = {item["metadata"]["name"]: item["metadata"]["version"] for item in installs}
    shown = ", ".join(f"{name} {versions[name]}" for name in SHOWN if name in versions)
    print(f"  ok   {_platform_name()} {label}: {shown}")
    return None


def resolve_for(
    root: Path, platform: str, extra: str, settings: dict[str, str], uv: str
) -> str | None:
    """Resolve ``.[extra]`` for another platform with uv; ``None`` when it resolves."""
    command = [
        uv, "pip", "compile", "pyproject.toml", "--extra", extra, "--python-platform",
        platform, "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
        "--no-config", "--no-header", "--no-annotate", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=root,
        env={**_public_env(), **settings},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip()
    pins = dict(
        line.split("==", 1) for line in done.stdout.splitlines() if "==" in line and "#" not in line
    )
    shown = ", ".join(f"{name} {pins[name]}" for name in SHOWN if name in pins)
    print(f"  ok   {platform} [{extra}]: {shown}")
    return None


def _platform_name() -> str:
    return f"{sys.platform}-{os.uname().machine}"


def main(argv: list[str]) -> int:
    """Resolve every extra on every platform; print each result; 1 on any failure."""
    root = Path(argv[0]).resolve() if argv else ROOT
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    failures: list[str] = []
    print("== resolving the install against the public index (local pip settings ignored)")
    with tempfile.TemporaryDirectory() as tmp:
        runs: list[tuple[str, ...]] = [(extra,) for extra in EXTRAS]
        pinned = dev_torch(root)
        if pinned:
            runs.append(("test", pinned))
        for extra, *also in runs:
            problem = resolve_here(root, extra, Path(tmp), *also)
            if problem:
                failures.append(f"{_platform_name()} {' '.join([f'[{extra}]', *also])}:\n{problem}")
    if uv is None:
        failures.append("uv not found: the other platforms were not resolved")
    else:
        for platform, settings in OTHER_PLATFORMS.items():
            for extra in EXTRAS:
                problem = resolve_for(root, platform, extra, settings, uv)
                if problem:
                    failures.append(f"{platform} [{extra}]:\n{problem}")
    for failure in failures:
        print(f"  FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
