"""`metaltune status | confirm | rollback | recover | quarantine`: the safety journal from the
command line."""
from __future__ import annotations

import json
import time

from typing import Optional

import typer

from tuner.cli.common import invoke, settings
from tuner.cli.tables import csv_option, print_table
from tuner.errors import BadInput


def _fmt(v: object) -> str:
    return "-" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status_cmd(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON (baseline, current, pending, incidents)."),
        as_csv: bool = csv_option(),
        incidents: int = typer.Option(10, "--incidents", min=0, metavar="N", help="Show the last N incidents."),
    ) -> None:
        """The active profile, staged values, baseline and current values, the pending change
        and the last incidents."""

        res = invoke(settings(ctx), "status", incidents=incidents)
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        names = sorted(set(res["baseline"]) | set(res["current"]))
        rows = []
        for n in names:
            b, c = res["baseline"].get(n), res["current"].get(n)
            mark = "" if n not in res["baseline"] or b == c else " *"
            rows.append([n, _fmt(b) if n in res["baseline"] else "", _fmt(c) + mark])
        if as_csv:
            return print_table(["knob", "baseline", "current"], rows, as_csv=True)
        ap = res.get("active_profile")
        from tuner.ops.hints import verify_command

        print(f"active profile: {ap['name']} (transaction {ap['txn']}; "
              f"`{verify_command(ap.get('verify') or ap['name'])}` checks it is still in force)"
              if ap else "active profile: none")
        print_table(["knob", "baseline", "current"], rows, title="knobs (* = changed from baseline)")
        for s in res.get("staged") or []:
            print(f"staged: {s['knob']} = {_fmt(s['staged'])} (now {_fmt(s['current'])}; takes effect "
                  f"on the next {s['takes_effect'].replace('_', ' ')})")
        p = res["pending"]
        if p is None:
            print("pending: none")
        else:
            rem = f", {p['remaining_s']:.0f}s left" if p.get("remaining_s") is not None else ""
            print(f"pending: transaction {p['txn']} {p['label']} ({p['state']}{rem});"
                  " `metaltune confirm` keeps it, `metaltune rollback` undoes it")
            for c in p["changes"]:
                print(f"  {c['knob']}: {_fmt(c['before'])} -> {_fmt(c['after'])} ({c['state']})")
        if res["incidents"]:
            print_table(["time", "severity", "type", "gpu", "detail", "transaction"],
                        [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i["time"])),
                          i["severity"], i["type"], _fmt(i["gpu"]), i["detail"], _fmt(i["txn_id"])]
                         for i in res["incidents"]], title="last incidents", name_column=2)
        for r in res.get("canary_removals") or []:
            print(f"kernel canary: {r['family']} {r['variant']} removed at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['time']))} (shape "
                  f"{r['shape']} {r['dtype']}, {r['removed_entries']} table entries; those calls "
                  f"run the fallback): {r['detail'][:200]}")
        if res.get("quarantine"):
            print(f"quarantined candidates: {res['quarantine']} (`metaltune quarantine list`)")

    quarantine_app = typer.Typer(help="Candidates never tried again after a fatal incident.",
                                 no_args_is_help=True)
    app.add_typer(quarantine_app, name="quarantine")

    @quarantine_app.command("list")
    def quarantine_list_cmd(ctx: typer.Context,
                            as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                            as_csv: bool = csv_option()) -> None:
        """Quarantined change sets: the id to clear, when, why, the transaction and its values."""
        res = invoke(settings(ctx), "quarantine_list")
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        # a change set of 30 knobs on one line is 1,000 columns: one knob=value a line in the
        # table (each whole, to copy into a policy), one line a row in CSV
        sep = ", " if as_csv else "\n"
        rows = [[str(q["id"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(q["time"])),
                 _fmt(q["txn"]), q["reason"],
                 sep.join(f"{k}={_fmt(v)}" for k, v in (q["knobs"] or {}).items()) or q["key"]]
                for q in res["quarantine"]]
        if as_csv or rows:
            print_table(["id", "time", "transaction", "reason", "values"], rows,
                        title="quarantine", as_csv=as_csv, name_column=4, fit=True)
        if not as_csv:
            print("nothing is quarantined" if not rows else
                  "`metaltune quarantine clear ID` lets a change set be tried again")

    @quarantine_app.command("clear")
    def quarantine_clear_cmd(ctx: typer.Context,
                             items: Optional[list[int]] = typer.Argument(
                                 None, metavar="[ID]...", help="Entries to clear (ids from `quarantine list`)."),
                             all_: bool = typer.Option(False, "--all", help="Clear every entry."),
                             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Let quarantined change sets be tried again (journalled as the operator's decision)."""
        if items and all_:
            raise BadInput("quarantine clear: give ids or --all, not both")
        res = invoke(settings(ctx), "quarantine_clear", items=items or None, all=all_)
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        for q in res["cleared"]:
            print(f"cleared quarantine #{q['id']} (was: {q['reason']})")
        if not res["cleared"]:
            print("nothing was quarantined")

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
            print(f"rolled back {n} unconfirmed transaction(s): "
                  + ", ".join(f"{r['txn']} ({r['state']})" for r in res["recovered"]))
        print("restored to baseline: " + (", ".join(res["restored"]) or
                                          ("nothing else to restore" if n else "nothing to do")))
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
