"""`metaltune search host|mixed|kernel`, their options made from the options models
(tuner.cli.model_options). `kernel` is registered by tuner/cli/kernel_cmd.py."""
from __future__ import annotations

import json

import typer

from tuner.cli.common import live_help
from tuner.cli.model_options import model_command
from tuner.search.options import HostSearchOptions, MixedSearchOptions

search_app = typer.Typer(help="Run a verified search.", no_args_is_help=True)


def _show_host(res: dict, o: object) -> None:
    _print_host_result(res)


# the options are the models' fields (tuner.cli.model_options): through the daemon when one runs
# (it holds the writer lock and starts the search in a child process); otherwise in this process
search_host_cmd = search_app.command("host")(model_command(
    HostSearchOptions, "search_host", _show_host,
    """Search host settings: propose (inside the policy's bounds), gate, apply in a safety
    transaction, A/B against the incumbent, keep or roll back. The policy's hourly change limits
    (the default: 30 power/clock changes an hour) can end a search before its --budget: the
    plan is said up front, and the search stops there (or waits, --wait-for-policy)."""))


def _print_host_result(res: dict) -> None:
    if res.get("run_id") is not None:
        _print_runtime_result(res)
    for n, why in (res.get("left_out") or {}).items():
        print(f"left out: {n}: {why}")
    b = res.get("boot_search")
    if b and b["boot_search"] == "armed":
        print(f"boot-time search: trial #{b['trial']} armed with {json.dumps(b['candidate'])}; "
              f"{b['reboots_left']} reboots left after this one; {b['result']}. The gate after "
              f"each boot decides it and arms the next (`metaltune boot status`)")
    elif b:
        print(b["reason"])


def _print_runtime_result(res: dict) -> None:
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
    print_objective(res)
    if res.get("policy_plan"):
        print(res["policy_plan"])
    if res.get("stopped"):
        print(f"stopped: {res['stopped']['message']}")
    print(f"`metaltune trials --run {res['run_id']}` lists each trial; `metaltune profile export "
          f"--from-search {res['run_id']} -o FILE` saves what it changed as a profile")


def _num(v: object) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"


def print_objective(res: dict) -> None:
    """The objective's metric and tokens/s, start -> kept (the result's `summary`)."""
    s = res.get("summary")
    if not isinstance(s, dict):
        return
    flags = {"throughput_floor": "--throughput-floor {:g}", "power_budget_w": "--power-budget {:g} W"}
    params = ", ".join(f.format(res[k]) for k, f in flags.items() if isinstance(res.get(k), (int, float)))
    print(f"objective {s['objective']}" + (f" ({params})" if params else ""))
    for n, (before, after) in sorted((res.get("budget_clamped") or {}).items()):
        print(f"  brought within the budget before the search: {n} {before} -> {after}")
    tp = s["throughput"]
    if s["metric"] != "throughput":
        print(f"  {s['metric']}: {_num(s['start'])} -> {_num(s['kept'])} {s['unit']} (start -> kept)")
    print(f"  throughput: {_num(tp['start'])} -> {_num(tp['kept'])} {tp['unit']} (start -> kept)")


def _val(v: object) -> str:
    return "-" if v is None else json.dumps(v) if not isinstance(v, str) else v


def _show_mixed(res: dict, o: object) -> None:
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
    print_objective(res)
    if res.get("policy_plan"):
        print(res["policy_plan"])
    if res.get("stopped"):
        print(f"stopped: {res['stopped']['message']}")


search_mixed_cmd = search_app.command("mixed")(model_command(
    MixedSearchOptions, "search_mixed", _show_mixed,
    """Search host settings, runtime settings and kernel choices together: each candidate is
    gated (policy, kernel judge), applied (host in a safety transaction, kernels in the dispatch
    table, runtime in the workload), A/B-measured end to end against the incumbent and kept only
    if no size regresses; everything else is rolled back."""))


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
