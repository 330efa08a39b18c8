"""`metaltune status | confirm | rollback | recover`: the safety journal from the command line."""
from __future__ import annotations

import json
import time

import typer

from tuner.cli.common import invoke, settings


def _fmt(v: object) -> str:
    return "-" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status_cmd(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON (baseline, current, pending, incidents)."),
        incidents: int = typer.Option(10, "--incidents", min=0, help="Show the last N incidents."),
    ) -> None:
        """Baseline, current values, the pending change and the last incidents."""

        res = invoke(settings(ctx), "status", incidents=incidents)
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        from rich.console import Console
        from rich.table import Table

        con = Console()
        t = Table(title="knobs")
        for col in ("knob", "baseline", "current"):
            t.add_column(col)
        names = sorted(set(res["baseline"]) | set(res["current"]))
        for n in names:
            b, c = res["baseline"].get(n), res["current"].get(n)
            mark = "" if n not in res["baseline"] or b == c else " *"
            t.add_row(n, _fmt(b) if n in res["baseline"] else "", _fmt(c) + mark)
        con.print(t)
        p = res["pending"]
        if p is None:
            con.print("pending: none")
        else:
            rem = f", {p['remaining_s']:.0f}s left" if p.get("remaining_s") is not None else ""
            con.print(f"pending: transaction {p['txn']} [bold]{p['label']}[/] ({p['state']}{rem});"
                      " `metaltune confirm` keeps it, `metaltune rollback` undoes it")
            for c in p["changes"]:
                con.print(f"  {c['knob']}: {_fmt(c['before'])} -> {_fmt(c['after'])} ({c['state']})")
        if res["incidents"]:
            it = Table(title="last incidents")
            for col in ("time", "severity", "type", "gpu", "detail", "transaction"):
                it.add_column(col)
            for i in res["incidents"]:
                it.add_row(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i["time"])),
                           i["severity"], i["type"], _fmt(i["gpu"]), i["detail"], _fmt(i["txn_id"]))
            con.print(it)
        if res.get("quarantine"):
            con.print(f"quarantined candidates: {res['quarantine']}")

    @app.command("confirm")
    def confirm_cmd(ctx: typer.Context) -> None:
        """Keep the change in probation now (before its deadline)."""

        res = invoke(settings(ctx), "confirm")
        print(f"confirmed transaction {', '.join(map(str, res['confirmed']))}")

    @app.command("rollback")
    def rollback_cmd(ctx: typer.Context,
                     as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Return every knob metaltune changed to its baseline (the value before the first change)."""

        res = invoke(settings(ctx), "rollback")
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        n = len(res["recovered"])
        if n:
            print(f"rolled back {n} unconfirmed transaction(s)")
        print("restored to baseline: " + (", ".join(res["restored"]) or "nothing to do"))
        for s in res.get("skipped", []):
            print(f"skipped {s['knob']}: {s['why']}")

    @app.command("recover")
    def recover_cmd(ctx: typer.Context,
                    from_defaults: bool = typer.Option(
                        False, "--from-defaults",
                        help="Restore every knob metaltune changed to its driver default and make "
                             "that the baseline (the way out of a damaged journal)."),
                    as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Roll back every change that was never confirmed (after a crash), from the journal."""
        res = invoke(settings(ctx), "recover", **({"from_defaults": True} if from_defaults else {}))
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        if from_defaults:
            _print_reset(res)
            print("restored to driver defaults: " + (", ".join(res["restored"]) or "nothing to do"))
            return
        if not res["recovered"]:
            print("nothing to recover")
        for r in res["recovered"]:
            print(f"transaction {r['txn']}: {r['state']} ({r['reason']})")

    @app.command("baseline")
    def baseline_cmd(ctx: typer.Context,
                     accept_current: bool = typer.Option(
                         False, "--accept-current",
                         help="Record the values in force now as the baseline (no knob is written)."),
                     as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Accept the host's current values as the baseline that `rollback` returns to."""
        res = invoke(settings(ctx), "baseline", accept_current=accept_current)
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        _print_reset(res)
        print("baseline accepted: " + (", ".join(f"{k} = {_fmt(v)}" for k, v in res["baseline"].items())
                                       or "no knob"))


def _print_reset(res: dict) -> None:
    for name, where in (res.get("damaged_journal") or {}).items():
        print(f"damaged {name} kept as {where}")
    for s in res.get("skipped", []):
        print(f"skipped {s['knob']}: {s['why']}")
