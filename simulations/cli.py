"""The ``fedsync`` command: what users do, one subcommand each.

::

    fedsync compare quickstart                 # fedsync's mode against Flower's FedAvg
    fedsync run --run-config "strategy='fedavg' num-rounds=5"
    fedsync deploy --nodes 3 --run-config "strategy='teasq' clock='wall'"
    fedsync analyze --out runs/analysis --run-config "dataset='fashion-mnist'"

``run`` and ``compare`` go through :class:`fedsync.deploy.LocalSuperLink`: a simulation
SuperLink started for the command and stopped at its end by process id, so nothing
keeps running afterwards (plain ``flwr run`` leaves Flower's local SuperLink behind).
Run-config keys are checked against :func:`fedsync.config.check_keys` before Flower is
called; an unknown key is named with the closest valid one. ``deploy`` is
``fedsync-deploy``; ``analyze`` is ``python -m fedsync.analysis`` (the sparsity of a
model's real updates, and which buffer and index coding suit them). The command lives
here, at the top of the imports (``kernels <- fedsync <- clients, server <-
simulations``), because it drives the simulations and the deployment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from fedsync.aggregation.health import DIVERGED_EXIT, health_problem
from fedsync.clock.fleet import fleet_search_path
from fedsync.config import RunConfig, SettingsError, check_keys
from fedsync.reports import RunSummary
from fedsync.simulations.scenario import SCENARIO_DIR

__all__ = ["app", "main", "parse_run_config", "shipped"]


def shipped(kind: str) -> dict[str, str]:
    """The scenarios (``kind="scenarios"``) or fleets (``"fleets"``) that ship, name ->
    one-line description, read from ``simulations/scenarios/*.toml`` or
    ``fedsync/clock/fleets/*.toml``."""
    folder = SCENARIO_DIR if kind == "scenarios" else fleet_search_path()[0]
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.toml")):
        try:
            with path.open("rb") as file:
                data = tomllib.load(file)
        except (OSError, tomllib.TOMLDecodeError):
            continue
        description = " ".join(str(data.get("description", "")).split())
        found[str(data.get("name", path.stem))] = description
    return found


def _listing() -> str:
    lines = ["Scenarios (fedsync compare NAME):", ""]
    lines += [f"  {name}: {text}" for name, text in shipped("scenarios").items()]
    lines += ["", "Fleets (run-config fleet=NAME):", ""]
    lines += [f"  {name}: {text}" for name, text in shipped("fleets").items()]
    return "\n\n".join(lines)


app = typer.Typer(
    name="fedsync",
    help="Federated training with sparsified, quantized, asynchronous updates on Flower.",
    epilog=_listing(),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@app.callback()
def _environment() -> None:
    # Flower's SuperLink starts ``flower-superexec`` from PATH: make this environment's
    # scripts found even when it is not activated (``.venv/bin/fedsync ...``).
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    # Ray's init, which Flower's simulation engine calls without an address, joins the
    # last cluster `ray start` recorded on this machine (/tmp/ray/ray_current_cluster),
    # even a stopped or unreachable one, and the run then hangs. Start a private local
    # instance unless the user points RAY_ADDRESS at a cluster on purpose.
    os.environ.setdefault("RAY_ADDRESS", "local")


def parse_run_config(items: list[str]) -> dict[str, Any]:
    """Flower's ``--run-config`` syntax (``key=value`` TOML literals, space-separated),
    every key checked against the app's.

    Raises
    ------
    fedsync.config.SettingsError
        On a malformed string, an unknown key (naming the closest valid one) or a value
        of the wrong type or out of range.
    """
    import click

    from fedsync.compat.flower139 import parse_config_args

    for item in items:
        for token in item.split():
            if "=" not in token and not Path(token).is_file():
                raise SettingsError(f"run config: expected key=value, got {token!r}")
    try:
        values = parse_config_args(items)
    except click.ClickException as err:
        raise SettingsError(f"run config: {err.message}") from err
    check_keys(values)
    # Types, ranges and codec stages, before Flower starts.
    RunConfig.from_run_config(values).compression.check_codecs()
    return values


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


AllowDivergence = Annotated[
    bool,
    typer.Option(
        "--allow-divergence",
        help="exit 0, not 3, even when a run diverged or stayed at chance",
        show_default=False,
    ),
]
"""The opt-out of the non-zero exit for a run that did not learn (run and compare)."""


@app.command()
def run(
    run_config: Annotated[
        list[str] | None,
        typer.Option(
            "--run-config",
            "-c",
            help="run-config overrides, e.g. \"strategy='fedavg' num-rounds=5\" (repeatable)",
        ),
    ] = None,
    supernodes: Annotated[
        int, typer.Option(help="simulated nodes (default 10)", show_default=False)
    ] = 10,
    timeout: Annotated[
        float, typer.Option(help="longest run in real seconds (default 900)", show_default=False)
    ] = 900.0,
    quiet: Annotated[
        bool, typer.Option(help="do not stream the run's log", show_default=False)
    ] = False,
    allow_divergence: AllowDivergence = False,
) -> None:
    """One simulation of the app (the defaults: fedsync's TEASQ mode on digits).

    Exit status: 0 done; 1 the run failed; 2 bad arguments; 3 the run diverged or its
    accuracy stayed at chance (summary.json's `health`; --allow-divergence: 0).
    """
    from fedsync.deploy import DeploymentError, LocalSuperLink
    from fedsync.simulations.cleanup import stop_superlink
    from fedsync.simulations.scenario import PROJECT_ROOT

    try:
        values = parse_run_config(run_config or [])
    except SettingsError as err:
        raise _fail(str(err)) from err
    if supernodes < 1:
        raise _fail("--supernodes must be >= 1")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    values.setdefault("results-dir", str(Path.cwd() / "results"))
    values.setdefault("run-name", stamp)
    link = LocalSuperLink(PROJECT_ROOT / "runs" / "run" / stamp, simulation=True)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    link.start()
    try:
        outcome = link.run_app(
            PROJECT_ROOT,
            values,
            federation_config={"num-supernodes": supernodes, "client-resources-num-cpus": 1},
            timeout=timeout,
            echo=not quiet,
        )
    except DeploymentError as err:
        raise _fail(str(err)) from err
    finally:
        stop_superlink(link)
    output = RunConfig.from_run_config(values).output
    folder = output.results_path() / output.run_name
    typer.echo(f"[fedsync] run {outcome.run_id}: {outcome.status}; results in {folder}")
    if not outcome.completed:
        typer.echo(outcome.details or outcome.output[-2000:], err=True)
        raise typer.Exit(1)
    problem = health_problem(RunSummary.read(folder / "summary.json"))
    if problem:
        typer.echo(f"[fedsync] WARNING the run did not learn: {problem}", err=True)
        if not allow_divergence:
            raise typer.Exit(DIVERGED_EXIT)


@app.command(epilog="Scenarios: " + ", ".join(shipped("scenarios")))
def compare(
    scenario: Annotated[str, typer.Argument(show_default=False, hidden=True)],
    out: Annotated[
        str, typer.Option(help="folder for comparison.json/.md/.png", show_default=False)
    ] = "",
    only: Annotated[
        str, typer.Option(help="comma-separated strategy labels", show_default=False)
    ] = "",
    scale: Annotated[
        float, typer.Option(help="multiply every run's length (default 1)", show_default=False)
    ] = 1.0,
    seed: Annotated[
        int | None,
        typer.Option(help="run-config seed of every strategy (default: the scenario's)"),
    ] = None,
    run_dir: Annotated[
        str, typer.Option(help="folder for the SuperLink and runs", show_default=False)
    ] = "",
    verbose: Annotated[
        bool, typer.Option(help="stream every run's log", show_default=False)
    ] = False,
    allow_divergence: AllowDivergence = False,
) -> None:
    """Run every strategy of SCENARIO (a shipped scenario name or a .toml path) on the
    simulation engine and compare them.

    Exit status: 0 done; 1 a run failed; 2 bad arguments; 3 a run diverged or its
    accuracy stayed at chance (--allow-divergence: 0).
    """
    from fedsync.simulations.compare import main as compare_main

    argv = [scenario, "--scale", str(scale)]
    argv += ["--out", out] if out else []
    argv += ["--only", only] if only else []
    argv += ["--seed", str(seed)] if seed is not None else []
    argv += ["--run-dir", run_dir] if run_dir else []
    argv += ["--verbose"] if verbose else []
    argv += ["--allow-divergence"] if allow_divergence else []
    raise typer.Exit(compare_main(argv))


PASS_THROUGH = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": [],
}
"""Subcommands that hand every argument, ``--help`` included, to another command's parser."""


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def deploy(ctx: typer.Context) -> None:
    """A real deployment on this machine: SuperLink and SuperNodes over gRPC
    (fedsync-deploy; `fedsync deploy --help` for its options)."""
    from fedsync.deploy.cli import main as deploy_main

    args = list(ctx.args)
    for index, arg in enumerate(args[:-1]):
        if arg == "--run-config":
            try:
                parse_run_config([args[index + 1]])  # keys, names and values
            except SettingsError as err:
                raise _fail(str(err)) from err
    raise typer.Exit(deploy_main(args))


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def analyze(ctx: typer.Context) -> None:
    """Measure the sparsity of a model's real updates and recommend a server buffer and
    an index coding (python -m fedsync.analysis; `fedsync analyze --help` for its options)."""
    from fedsync.analysis.cli import main as analysis_main

    raise typer.Exit(analysis_main(list(ctx.args)))


def _exit_on_signal(signum: int, frame: object) -> None:
    # SIGTERM must reach the ``finally`` that stops the SuperLink.
    raise SystemExit(128 + signum)


def main() -> None:
    """The console script."""
    app(prog_name="fedsync")


if __name__ == "__main__":
    main()
