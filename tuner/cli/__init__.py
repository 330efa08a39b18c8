"""`metaltune` command line (typer). Each area registers its commands from its own module; heavy
imports (torch, triton, optuna) happen inside commands, never at start-up."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Optional

import typer

from tuner.cli import help_style
from tuner.errors import BadInput, MetaltuneError
from tuner.ops.settings import Settings

help_style.apply()

app = typer.Typer(
    name="metaltune",
    help="Verified search over GPU host settings and Triton kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# tuner.cli.<module>.register(app) for each (a module that fails to import fails loudly)
MODULES = [
    "demo_cmd", "sim_cmd", "trials_cmd", "search_cmd", "kernel_cmd", "safety_cmd",
    "profile_cmd", "host_cmd", "daemon_cmd", "compare_cmd", "fleet_cmd", "diagnose_cmd", "boot_cmd",
]


def _version(value: bool) -> None:
    if value:
        from tuner import __version__

        print(f"metaltune {__version__}")
        raise typer.Exit(0)


@app.callback()
def _common(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Print the version and exit."),
    state_dir: Path = typer.Option(
        Path("/var/lib/metaltune"), "--state-dir", envvar="METALTUNE_STATE_DIR", metavar="DIR",
        help="Where the trial store and journal live.",
    ),
    backend: Optional[str] = typer.Option(
        None, "--backend", envvar="METALTUNE_BACKEND", metavar="real|sim",
        help="real (this machine) or sim (a simulated host, see --sim-root)."
    ),
    sim_root: Optional[Path] = typer.Option(
        None, "--sim-root", envvar="METALTUNE_SIM_ROOT", metavar="DIR",
        help="Folder of a simulated host (made by `metaltune sim init DIR`)."
    ),
) -> None:
    if backend is not None and backend not in ("real", "sim"):
        raise BadInput(f"--backend: expected 'real' or 'sim', got {backend!r}")
    ctx.obj = Settings(state_dir=state_dir, backend=backend, sim_root=sim_root)


def _register_all() -> None:
    for m in MODULES:
        importlib.import_module(f"tuner.cli.{m}").register(app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps every error a user can cause to its exit code and one line on stderr."""
    from safety.errors import SafetyError
    from tuner.cli.common import refresh_help

    try:
        refresh_help()
        rc = app(args=argv, prog_name="metaltune", standalone_mode=False)
        if isinstance(rc, int) and rc:  # typer returns typer.Exit(n)'s code in this mode
            return rc
    except (MetaltuneError, SafetyError) as e:  # safety's errors carry their own exit code too
        from tuner import redact

        print(f"metaltune: error: {redact.text(str(e))}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("metaltune: aborted", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # a command that needs an extra the install left out
        from tuner.extras import missing_extra

        why = missing_extra(e)
        if why is None:
            raise
        print(f"metaltune: error: {why}", file=sys.stderr)
        return 1
    except typer.TyperException as e:  # typer's own (vendored click) usage errors: exit 2
        return _usage_error(e)
    return 0


def _usage_error(e: typer.TyperException) -> int:
    """One line for a usage error (unknown option or command, missing or bad argument), naming
    the command and where its help is; a group called without a command prints its help."""
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
        text = ctx.get_help()  # typer's rich help prints itself (to stdout) and returns ""
        if text.strip():
            print(text, file=sys.stderr)
        return 2
    msg = " ".join(e.format_message().split()).rstrip(".")  # typer's may wrap over lines
    where = ctx.command_path if ctx is not None else "metaltune"
    print(f"metaltune: error: {msg} (see '{where} --help')", file=sys.stderr)
    return e.exit_code


def run() -> None:
    sys.exit(main())
