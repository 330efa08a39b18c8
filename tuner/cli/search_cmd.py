"""`metaltune search host|mixed|kernel`. `kernel` is registered by tuner/cli/kernel_cmd.py."""
from __future__ import annotations

import json
from typing import Optional

import typer

from tuner.cli.common import invoke, live_help, settings
from tuner.cli.numbers import finite

search_app = typer.Typer(help="Run a verified search.", no_args_is_help=True)


@search_app.command("host")
def search_host_cmd(
    ctx: typer.Context,
    budget: int = typer.Option(30, "--budget", min=1, metavar="N", help="Trials to run."),
    proposer: str = typer.Option("optuna", "--proposer", help="random|grid|coordinate|optuna|llm"),
    policy: Optional[str] = typer.Option(None, "--policy", metavar="FILE", help="Policy YAML (default: the shipped conservative one); proposals stay inside it."),
    knobs: Optional[list[str]] = typer.Option(None, "--knob", help="Knob name or glob; repeatable."),
    seed: int = typer.Option(0, "--seed", help="Seed for the proposer."),
    rounds: int = typer.Option(3, "--rounds", min=1, metavar="N", help="Interleaved A/B pairs per trial."),
    workload: Optional[str] = typer.Option(None, "--workload", help="sim | llama | deepseek | deepseek-v3.2 | hf:<config>[:layers=N] | cmd:<command line>"),
    metric_regex: Optional[str] = typer.Option(None, "--metric-regex", help="For cmd: regex with one group, higher is better."),
    timeout_s: float = typer.Option(600.0, "--timeout", callback=finite(0.1, 86400), metavar="SECONDS", help="Per measurement."),
    objective: str = typer.Option("throughput", "--objective", help="What to keep: throughput (most tokens/s) | energy (most tokens/J, throughput at least --throughput-floor of the incumbent's) | power-capped (most tokens/s with mean watts <= --power-budget)."),
    throughput_floor: Optional[float] = typer.Option(None, "--throughput-floor", callback=finite(0.01, 1.0), metavar="FRACTION", help="--objective energy: the least throughput kept, as a fraction of the incumbent's at every size (default 0.95)."),
    power_budget: Optional[float] = typer.Option(None, "--power-budget", callback=finite(1.0, 100000.0), metavar="W", help="--objective power-capped: the most mean board watts (and power limit) per GPU."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Search host settings: propose (inside the policy), gate, apply in a safety transaction,
    A/B against the incumbent, keep or roll back."""

    # through the daemon when one runs (it holds the writer lock and starts the search in a
    # child process); otherwise in this process
    res = invoke(settings(ctx), "search_host", budget=budget, proposer=proposer, policy=policy,
                     knobs=knobs, seed=seed, repeats=rounds, workload=workload,
                     metric_regex=metric_regex, timeout_s=timeout_s,
                     **objective_args(objective, throughput_floor, power_budget))
    if as_json:
        print(json.dumps(res, indent=2, default=str))
        return
    _print_host_result(res)


def objective_args(objective: str, floor: Optional[float], budget: Optional[float]) -> dict:
    """The objective's arguments as the options models take them (the defaults left out, so a
    daemon without the fields still answers a plain search)."""
    out: dict = {} if objective == "throughput" else {"objective": objective}
    if floor is not None:
        out["throughput_floor"] = floor
    if budget is not None:
        out["power_budget_w"] = budget
    return out


def _print_host_result(res: dict) -> None:
    from tuner.cli.tables import print_table

    rej = ", ".join(f"{n} {why}" for why, n in sorted(res.get("rejected", {}).items())) or "none"
    print(f"run {res['run_id']}: {res['trials']} trials in {res['seconds']:.0f}s: {res['kept']} kept, "
          f"{res['reverted']} reverted, {res['rolled_back']} rolled back; rejected: {rej}")
    names = sorted(set(res["start"]) | set(res["best_settings"]))
    rows = [[n, _val(res["start"].get(n)), _val(res["best_settings"].get(n))
             + ("" if res["start"].get(n) == res["best_settings"].get(n) else " *")] for n in names]
    print_table(["knob", "start", "best"], rows, title="settings (* = changed; in force now)")
    if isinstance(res.get("baseline"), (int, float)):
        print(f"baseline (start settings): {res['baseline']:.4g}")
    if res.get("objective", "throughput") != "throughput":
        tpj = res.get("baseline_tok_per_j")
        print(f"objective {res['objective']}" + (f"; baseline {tpj:.4g} tok/J" if tpj else "")
              + (f"; budget {res['power_budget_w']:g} W" if res.get("power_budget_w") else ""))
    print("`metaltune trials` lists each trial; `metaltune profile export --from-host` saves the result")


def _val(v: object) -> str:
    return "-" if v is None else json.dumps(v) if not isinstance(v, str) else v


@search_app.command("mixed")
def search_mixed_cmd(
    ctx: typer.Context,
    budget: int = typer.Option(20, "--budget", help="Trials to run."),
    proposer: str = typer.Option("random", "--proposer", help="random|grid|coordinate|optuna|llm"),
    policy: Optional[str] = typer.Option(None, "--policy", help="Policy YAML (default: the shipped conservative one)."),
    knobs: Optional[list[str]] = typer.Option(None, "--knob", help="Knob name or glob; repeatable; 'none': no host knobs."),
    families: Optional[list[str]] = typer.Option(None, "--family", help="Kernel family; repeatable (default: every family the workload calls); 'none': no kernels."),
    runtime: Optional[bool] = typer.Option(None, "--runtime/--no-runtime", help="Search runtime settings (llama: CUDA graphs, fused projections, attention; hf: compile, metaltune); default: on for llama and hf workloads."),
    seed: int = typer.Option(0, "--seed", help="Seed for the proposer."),
    rounds: int = typer.Option(3, "--rounds", help="Interleaved A/B pairs per trial."),
    repeats: int = typer.Option(3, "--repeats", help="Repeats inside each measurement."),
    max_choices: int = typer.Option(6, "--max-choices", help="Values per kernel slot, torch included."),
    table: Optional[str] = typer.Option(None, "--table", help="Start from this dispatch table (JSON)."),
    suggest: Optional[list[str]] = typer.Option(None, "--suggest-table", help="Tables whose choices become slot choices and the first candidate: 'auto' (default: the ones shipped for this GPU), 'none', or JSON paths; repeatable."),
    workload: Optional[str] = typer.Option(None, "--workload", help="sim-llama (sim host default) | llama | deepseek | deepseek-v3.2 | hf:<config>[:layers=N] | sim | cmd:<command line>"),
    metric_regex: Optional[str] = typer.Option(None, "--metric-regex", help="For cmd: regex with one group, higher is better."),
    timeout_s: float = typer.Option(600.0, "--timeout", callback=finite(0.1, 86400), help="Per measurement."),
    objective: str = typer.Option("throughput", "--objective", help="What to keep: throughput (most tokens/s) | energy (most tokens/J, throughput at least --throughput-floor of the incumbent's) | power-capped (most tokens/s with mean watts <= --power-budget)."),
    throughput_floor: Optional[float] = typer.Option(None, "--throughput-floor", callback=finite(0.01, 1.0), metavar="FRACTION", help="--objective energy: the least throughput kept, as a fraction of the incumbent's at every size (default 0.95)."),
    power_budget: Optional[float] = typer.Option(None, "--power-budget", callback=finite(1.0, 100000.0), metavar="W", help="--objective power-capped: the most mean board watts (and power limit) per GPU."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Search host settings, runtime settings and kernel choices together: each candidate is
    gated (policy, kernel judge), applied (host in a safety transaction, kernels in the dispatch
    table, runtime in the workload), A/B-measured end to end against the incumbent and kept only
    if no size regresses; everything else is rolled back."""

    res = invoke(settings(ctx), "search_mixed", budget=budget, proposer=proposer,
                     policy=policy, knobs=knobs, families=families, runtime=runtime, seed=seed,
                     rounds=rounds, repeats=repeats, max_choices=max_choices, table=table,
                     suggest=suggest, workload=workload, metric_regex=metric_regex, timeout_s=timeout_s,
                     **objective_args(objective, throughput_floor, power_budget))
    if as_json:
        print(json.dumps(res, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"run {res['run_id']}: {res['trials']} trials, {res['by_verdict']}")
    t = Table("kind", "verdict:reason", "trials")
    for kind, counts in res["by_kind"].items():
        for vr, n in counts.items():
            t.add_row(kind, vr, str(n))
    con.print(t)
    con.print({"kept": res["kept"]})
    con.print(f"dispatch table ({res['table_entries']} entries) -> {res['table']}")


def _workloads(default: str) -> str:
    from tuner.sim import register_workloads
    from tuner.workloads import factory

    register_workloads()
    return f"{factory.usage(default)} (default on a sim host: {default}, else llama)"


def _proposers() -> str:
    from tuner import proposers

    return "|".join(proposers.names())


def register(app: typer.Typer) -> None:
    app.add_typer(search_app, name="search")
    live_help(search_host_cmd, "workload", lambda: _workloads("sim"))
    live_help(search_mixed_cmd, "workload", lambda: _workloads("sim-llama"))
    live_help(search_host_cmd, "proposer", _proposers)
    live_help(search_mixed_cmd, "proposer", _proposers)
