"""`metaltune demo`: the whole loop on a fresh simulated host."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tuner.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo_cmd(
        trials: int = typer.Option(60, "--trials", help="Trials to run."),
        seed: int = typer.Option(1, "--seed", help="Seed for the host, its noise and the proposer."),
        proposer: str = typer.Option("optuna", "--proposer", help="random|grid|coordinate|optuna"),
        sku: str = typer.Option("h200", "--sku", help="h200 or rtx4090."),
        workdir: Optional[Path] = typer.Option(None, "--workdir", help="Keep the host and state here."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Run the verified search loop on a fresh simulated host and print what it found."""
        from tuner.search.demo import run_demo

        if trials < 1:
            raise BadInput("--trials: expected a number ≥ 1")
        if sku not in ("h200", "rtx4090"):
            raise BadInput(f"--sku: expected h200 or rtx4090, got {sku!r}")
        if proposer == "llm":
            raise BadInput("--proposer llm needs an API key and the network; use `search host`")
        from tuner.proposers import names as proposer_names

        if proposer not in proposer_names():  # before the progress bar starts
            raise BadInput(f"--proposer: unknown proposer {proposer!r}; expected one of "
                           + ", ".join(n for n in proposer_names() if n != "llm"))
        if workdir is not None and workdir.exists() and (not workdir.is_dir() or any(
                (workdir / n).exists() and not (workdir / n).is_dir() for n in ("host", "state"))):
            raise BadInput(f"--workdir: {workdir}: expected a folder (or a path to create)")
        if as_json:
            res = run_demo(trials, seed, proposer, sku, workdir)
            res.pop("trials_detail", None)
            print(json.dumps(res, indent=2))
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        con = Console()
        with Progress(TextColumn("[bold]demo"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), console=con) as prog:
            task = prog.add_task("", total=trials)

            def on_trial(t):  # type: ignore[no-untyped-def]
                gain = f" {t.gain:+.1%}" if t.gain is not None else ""
                prog.update(task, advance=1, description=f"#{t.number} {t.verdict} ({t.reason}){gain}")

            res = run_demo(trials, seed, proposer, sku, workdir, on_trial=on_trial)
        print_summary(con, res)


def print_summary(con, res: dict) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    rb = [d for d in res.get("trials_detail", []) if d["verdict"] == "rolled_back"]
    if rb:
        r = Table(title="rolled back: the incident, and the change active when it happened")
        for col in ("#", "change", "incident"):
            r.add_column(col)
        for d in rb:
            r.add_row(str(d["n"]), ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in d["knobs"].items()),
                      d.get("incident") or d["reason"])
        con.print(r)
    t = Table(title=f"metaltune demo — simulated {res['sku']}, {res['proposer']}, seed {res['seed']}",
              show_header=False)
    t.add_column("")
    t.add_column("")
    t.add_row("trials", str(res["trials"]))
    t.add_row("kept", str(res["kept"]))
    t.add_row("reverted", f"{res['reverted']}  {fmt(res['reverted_by_reason'])}")
    t.add_row("rolled back (instability)", f"{res['rolled_back']}  {fmt(res['rolled_back_by_reason'])}")
    t.add_row("rejected", f"{sum(res['rejected'].values())}  {fmt(res['rejected'])}")
    t.add_row("baseline throughput", f"{res['baseline_throughput']:.1f}")
    t.add_row("best throughput", f"{res['best_throughput']:.1f}  ({res['gain']:+.1%})")
    t.add_row("true optimum (noise-free)", f"{res['true_optimum']:.1f}  (best reaches "
              f"{res['true_best'] / res['true_optimum']:.1%})")
    t.add_row("best settings", "\n".join(f"{k} = {v}" for k, v in res["best_settings"].items()))
    t.add_row("profile", res["profile_path"])
    t.add_row("trial store", f"{res['state_dir']}/trials.db  (metaltune --state-dir {res['state_dir']} trials)")
    con.print(t)


def fmt(counts: dict) -> str:
    return "(" + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")" if counts else ""
