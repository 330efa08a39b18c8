"""`metaltune profile list|show|diff|export`, `metaltune verify PROFILE`, `metaltune apply PROFILE`."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from safety.bounds import MAX_PROBATION_S
from tuner.cli.common import invoke, settings
from tuner.cli.numbers import finite
from tuner.cli.tables import csv_option


def _print_json(res: Any) -> None:
    print(json.dumps(res, indent=2, default=str))


def _v(x: Any) -> str:
    return "" if x is None else json.dumps(x) if not isinstance(x, str) else x


STATUS_STYLE = {"ok": "green", "applied": "green", "drifted": "red", "missing": "red", "unsupported": "dim", "pending-reboot": "yellow",
                "error": "magenta"}


def register(app: typer.Typer) -> None:
    profile_app = typer.Typer(help="Host profiles: list, show, diff, export.", no_args_is_help=True)
    app.add_typer(profile_app, name="profile")

    @profile_app.command("list")
    def list_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                 as_csv: bool = csv_option()) -> None:
        """Shipped and local profiles, whether each matches this host, and where its values
        come from (values: measured on real hardware, simulated only, guidance, unstated)."""
        from tuner.cli.tables import print_table

        res = invoke(settings(ctx), "profile_list")
        if as_json:
            return _print_json(res)
        rows = []
        for p in res["profiles"]:
            if "error" in p:
                rows.append([p["name"], "[red]error[/]", "", "", "", p["error"]])
                continue
            m = p.get("matches_host")
            mt = "abstract" if p.get("abstract") else ("yes" if m else "no" if m is not None else "?")
            vf = p.get("values_from", "unstated")
            rows.append([p["name"], mt, f"[yellow]{vf}[/]" if vf == "simulated" else vf,
                         ", ".join(Path(i).stem for i in p["include"]), str(p["knobs"]),
                         p["description"]])
        print_table(("name", "matches", "values", "includes", "knobs", "description"), rows,
                    title="host profiles", as_csv=as_csv)

    @profile_app.command("show")
    def show_cmd(ctx: typer.Context,
                 profile: str = typer.Argument(..., metavar="PROFILE",
                                               help="Profile name (see `profile list`) or a YAML file."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                 as_csv: bool = csv_option()) -> None:
        """A profile with its includes resolved (each value with the file and line it comes from)."""
        from tuner.cli.tables import print_table

        res = invoke(settings(ctx), "profile_show", profile=profile)
        if as_json:
            return _print_json(res)
        rows = [[k["key"], _v(k["value"]), f"{k['file']}:{k['line']}"] for k in res["knobs"]]
        if as_csv:
            return print_table(["knob", "value", "from"], rows, as_csv=True)
        from rich.console import Console

        c = Console()
        c.print(f"[bold]{res['name']}[/] ({res['path']}): {res['description']}")
        c.print(f"chain: {' -> '.join(res['chain'])}")
        c.print(f"match: {json.dumps({k: v for k, v in res['match'].items() if v is not None})}")
        print_table(["knob", "value", "from"], rows)
        if res.get("kernels"):
            c.print(f"kernels: {json.dumps(res['kernels'])[:200]}")
        prov = {k: v for k, v in res["provenance"].items() if v is not None}
        if prov:
            c.print(f"provenance: {json.dumps(prov)}")

    @profile_app.command("diff")
    def diff_cmd(ctx: typer.Context,
                 a: str = typer.Argument(..., metavar="PROFILE", help="First profile (name or YAML file)."),
                 b: Optional[str] = typer.Argument(None, metavar="OTHER", help="Second profile (default: this host's current values)."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Differences knob by knob (exit 1 when they differ, like diff(1))."""

        res = invoke(settings(ctx), "profile_diff", a=a, b=b)
        if as_json:
            _print_json(res)
        else:
            for r in res["differences"]:
                print(f"{r['knob']}: {res['a']}={_v(r.get(res['a']))}  "
                      f"{res['b']}={_v(r.get(res['b']))}")
            if res["same"]:
                print("no differences")
        if not res["same"]:
            raise typer.Exit(1)

    @profile_app.command("export")
    def export_cmd(ctx: typer.Context,
                   profile: Optional[str] = typer.Argument(None, help="Profile to flatten."),
                   from_host: bool = typer.Option(False, "--from-host", help="Export this host's current values (every knob it has, BIOS and sysctls included)."),
                   from_search: Optional[str] = typer.Option(None, "--from-search", metavar="RUN", help="Export only what search run RUN kept (its id, or the end of it as `trials` shows it), with the objective, policy and measurements in provenance."),
                   name: Optional[str] = typer.Option(None, "--name", help="Name of the exported profile."),
                   output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to FILE instead of stdout."),
                   kernels: Optional[Path] = typer.Option(None, "--kernels", help="Carry this dispatch table (JSON) as the profile's kernels."),
                   engine: Optional[str] = typer.Option(None, "--engine", help="Record the serving engine it was measured with: vllm:<serve.toml> (its settings, flags, environment) in provenance.engine."),
                   as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """A self-contained YAML profile (includes flattened), what a search kept, or this host's current values.
        Stored kernel sources its kernels name (src:<sha256>) are bundled, so `apply` on
        another host can verify and install them."""
        res = invoke(settings(ctx), "profile_export", profile=profile, from_host=from_host,
                     new_name=name, kernels=str(kernels) if kernels else None,
                     from_search=from_search, engine=engine)
        if output is not None:
            output.write_text(res["yaml"])
        if as_json:
            return _print_json(res["profile"])
        if output is None:
            print(res["yaml"], end="")

    @app.command("recommend")
    def recommend_cmd(ctx: typer.Context,
                      as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """The profile for this host (as `tuned-adm recommend`), with its evidence: measured on
        this host, measured elsewhere (where and when), only simulated, or not measured end to
        end; and the matching profiles for other objectives. Exit 1 when none matches."""
        res = invoke(settings(ctx), "recommend")
        if as_json:
            return _print_json(res)
        h, best = res["host"], res["recommended"]
        print(f"host: {', '.join(h['gpus']) or 'no GPU'}, driver {h['driver']}, {h['virtualization']}")
        print(f"recommended: {best['name']} ({best['objective']}): {best['description']}")
        print(f"  evidence: {best['evidence']['text']}")
        for alt in res["alternatives"]:
            print(f"also matches: {alt['name']} ({alt['objective']}): {alt['description']}")
            print(f"  evidence: {alt['evidence']['text']}")
        print(f"next: `{res['next']}`, then `metaltune apply {best['name']}`")

    @app.command("set")
    def set_cmd(ctx: typer.Context,
                knob: str = typer.Argument(..., metavar="KNOB", help="A knob name as `metaltune host` lists it, e.g. gpu0.power_limit_w."),
                value: str = typer.Argument(..., metavar="VALUE", help="The value: 650, performance, [1530, 1530], or default."),
                dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; write nothing."),
                probation: Optional[float] = typer.Option(None, "--probation", min=0, callback=finite(0, MAX_PROBATION_S),
                                                          metavar="SECONDS",
                                                          help="Seconds of probation (default: the policy's)."),
                policy: Optional[Path] = typer.Option(None, "--policy", metavar="FILE",
                                                      help="Allowed-change list (YAML; default as for apply)."),
                no_wait: bool = typer.Option(False, "--no-wait",
                                             help="Return once the change is in probation (`metaltune confirm` ends it early)."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Change one setting through the safety layer (the device's domain, the policy, the
        journal, probation and rollback), as `apply` changes a profile's."""
        from tuner.cli.probation_view import ProbationView
        from tuner.ops.set_knob import SET_LABEL, parse_value

        s = settings(ctx)
        args = dict(knob=knob, value=parse_value(value), dry_run=dry_run, probation_s=probation,
                    policy=str(policy) if policy else None, no_wait=no_wait)
        if dry_run or as_json or no_wait:
            res = invoke(s, "set", **args)
        else:
            with ProbationView(s, SET_LABEL):
                res = invoke(s, "set", **args)
        if as_json:
            return _print_json(res)
        _print_items(res, f"set {knob}" + (" (dry run)" if dry_run else ""), items_key="plan")
        if res.get("refused"):  # a dry run (a real set raised): what set would say
            print("set would be refused:\n" + res["refused"])
            return
        print(res["result"] + (f" (transaction {res['transaction']})" if res.get("transaction") else ""))
        if res.get("note"):
            print(res["note"])

    @app.command("verify")
    def verify_cmd(ctx: typer.Context,
                   profile: str = typer.Argument(..., metavar="PROFILE",
                                                 help="Profile name (see `profile list`) or a YAML file."),
                   as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                   as_csv: bool = csv_option()) -> None:
        """Compare this host with a profile: each knob ok / drifted / unsupported / pending-reboot
        / missing (a GPU this host does not have). Exit 1 when something drifted or is missing."""

        res = invoke(settings(ctx), "verify", profile=profile)
        if as_json:
            _print_json(res)
        else:
            _print_items(res, f"verify {res['profile']}", as_csv=as_csv)
            for m in ([] if as_csv else res["match"]):
                print(f"note: profile does not match this host: {m}")
            if not as_csv:
                bad = [it.get("knob") or it["key"] for it in res["knobs"]
                       if it["status"] in ("drifted", "error")]
                gone = [f"{it['key']}: {it['reason']}" for it in res["knobs"]
                        if it["status"] == "missing"]
                if gone:
                    print(f"not in force: {', '.join(gone)}; the profile names hardware this "
                          "host does not have")
                boot = [it for it in res["knobs"] if (it.get("knob") or "").startswith("boot.")
                        and it.get("reason")]
                for it in boot:  # TuneD's verify words: missing, or present with another value
                    print(f"{it['knob']}: {it['reason']}")
                runtime = [n for n in bad if not n.startswith("boot.")]
                if bad or not gone:
                    print(f"profile {res['profile']} is in force" if not bad else
                          f"not in force: {', '.join(bad)}"
                          + (f"; `metaltune apply {res['profile']}` puts them back" if runtime
                             else "")
                          + ("; boot-time values: `metaltune boot try KNOB=VALUE...`"
                             if len(runtime) < len(bad) else ""))
        if not res["ok"]:
            raise typer.Exit(1)

    @app.command("apply")
    def apply_cmd(ctx: typer.Context,
                  profile: str = typer.Argument(..., metavar="PROFILE",
                                                help="Profile name (see `profile list`) or a YAML file."),
                  dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; write nothing."),
                  probation: Optional[float] = typer.Option(None, "--probation", min=0, callback=finite(0, MAX_PROBATION_S),
                                                            metavar="SECONDS",
                                                            help="Seconds of probation (default: the policy's)."),
                  policy: Optional[Path] = typer.Option(None, "--policy", metavar="FILE",
                                                        help="Allowed-change list (YAML; default: "
                                                             "/etc/metaltune/policy.yaml if present, "
                                                             "else the shipped default policy)."),
                  force: bool = typer.Option(False, "--force", help="Apply even if match: rules fail."),
                  no_wait: bool = typer.Option(False, "--no-wait",
                                               help="Return once the change is in probation; the "
                                                    "probation goes on in the background "
                                                    "(`metaltune confirm` ends it early)."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                  as_csv: bool = csv_option()) -> None:
        """Apply a profile through a safety transaction (policy, journal, probation, rollback)."""
        from tuner.cli.probation_view import ProbationView
        from tuner.ops.safety import APPLY_LABEL

        s = settings(ctx)
        args = dict(profile=profile, dry_run=dry_run, probation_s=probation, force=force,
                    policy=str(policy) if policy else None, no_wait=no_wait)
        if dry_run or as_json or no_wait:
            res = invoke(s, "apply", **args)
        else:
            with ProbationView(s, APPLY_LABEL):
                res = invoke(s, "apply", **args)
        for w in res.get("warnings") or []:
            print(f"metaltune: warning: {w}", file=sys.stderr)
        if as_json:
            return _print_json(res)
        _print_items(res, f"apply {res['profile']}" + (" (dry run)" if dry_run else ""),
                     items_key="plan", as_csv=as_csv)
        if as_csv:
            return
        for m in res.get("match") or []:
            print(f"note: profile does not match this host: {m}")
        if res.get("refused"):  # a dry run (a real apply raised): what apply would say
            print("apply would be refused:\n" + res["refused"])
            return
        print(res["result"] + (f" (transaction {res['transaction']})" if res.get("transaction") else ""))
        if res.get("note"):
            print(res["note"])
        k = res.get("kernels")
        if k:
            print(f"kernels: {k['entries']} table entries"
                  + (f" -> {k['table']}" if k.get("table") else " (checked)") + "; sources: "
                  + (", ".join(f"src:{s['sha256'][:12]} ({s['from']}, digest verified)"
                               for s in k["sources"]) or "none"))
        if not dry_run:
            from tuner.ops.hints import verify_arg, verify_command
            from tuner.ops.profile import _dirs

            arg = verify_arg(res["profile"], res.get("path"), _dirs(s))
            print(f"next: `metaltune status` names the active profile; `{verify_command(arg)}` "
                  "checks the host against it")


def _print_items(res: dict[str, Any], title: str, items_key: str = "knobs",
                 as_csv: bool = False) -> None:
    from tuner.cli.tables import print_table

    cols = ["knob", "status", "current", "wanted", "effect", "from"]
    if items_key == "plan":
        cols.insert(5, "policy")
    rows, shown = [], []
    after = res.get("after") or {} if res.get("result") == "applied" else {}
    for it in res[items_key]:
        a = after.get(it.get("knob"))
        if it["status"] == "drifted" and a and "value" in a:  # the plan, as the apply left it
            it = {**it, "status": "applied" if a.get("pending") is None else "pending-reboot",
                  "current": a["value"], "pending": a.get("pending")}
        st = it["status"]
        shown.append(st)
        row = [it.get("knob") or it["key"], f"[{STATUS_STYLE.get(st, '')}]{st}[/]",
               _v(it.get("current")) + (f" (pending {_v(it['pending'])})" if it.get("pending") is not None else ""),
               _v(it.get("wanted")), it.get("effect", ""), f"{Path(it['file']).name}:{it['line']}" if it.get("line") else it["file"]]
        if items_key == "plan":
            pol = it.get("policy", "")
            row.insert(5, pol.split(":")[0] + (f" ({pol.split(':', 1)[1].strip()})" if ":" in pol else ""))
        if st in ("unsupported", "error") and it.get("reason"):
            row[2] = it["reason"]
        rows.append(row)
    print_table(cols, rows, title=title, as_csv=as_csv)
    if as_csv:
        return
    summary = dict(res["summary"])
    if after:  # counted as the table shows them: what the apply changed is no longer drifted
        summary = {k: shown.count(k) for k in sorted(set(shown))}
    line = "summary: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.items()))
    if res.get("policy_summary"):
        line += "; policy: " + ", ".join(f"{k} {v}" for k, v in sorted(res["policy_summary"].items()))
    print(line)
