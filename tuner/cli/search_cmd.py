"""`metaltune search host|kernel`. `kernel` is registered by tuner/cli/kernel_cmd.py."""
from __future__ import annotations

import json
from typing import Optional

import typer

from tuner.cli import settings

search_app = typer.Typer(help="Run a verified search.", no_args_is_help=True)


@search_app.command("host")
def search_host_cmd(
    ctx: typer.Context,
    budget: int = typer.Option(30, "--budget", help="Trials to run."),
    proposer: str = typer.Option("optuna", "--proposer", help="random|grid|coordinate|optuna|llm"),
    policy: Optional[str] = typer.Option(None, "--policy", help="Policy YAML (default: the shipped conservative one)."),
    knobs: Optional[list[str]] = typer.Option(None, "--knob", help="Knob name or glob; repeatable."),
    seed: int = typer.Option(0, "--seed"),
    repeats: int = typer.Option(3, "--repeats", help="Interleaved A/B pairs per trial."),
    workload: Optional[str] = typer.Option(None, "--workload", help="sim | llama | cmd:<command line>"),
    metric_regex: Optional[str] = typer.Option(None, "--metric-regex", help="For cmd: regex with one group, higher is better."),
    timeout_s: float = typer.Option(600.0, "--timeout", help="Per measurement."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Search host settings: propose, gate, apply in a safety transaction, A/B against the
    incumbent, keep or roll back."""
    from tuner import ops

    # through the daemon when one runs (it holds the writer lock and starts the search in a
    # child process); otherwise in this process
    res = ops.invoke(settings(ctx), "search_host", budget=budget, proposer=proposer, policy=policy,
                     knobs=knobs, seed=seed, repeats=repeats, workload=workload,
                     metric_regex=metric_regex, timeout_s=timeout_s)
    if as_json:
        print(json.dumps(res, indent=2, default=str))
    else:
        from rich.console import Console

        Console().print(res)


def register(app: typer.Typer) -> None:
    app.add_typer(search_app, name="search")
