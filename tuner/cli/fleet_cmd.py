"""`metaltune fleet status|verify|apply|collect --inventory FILE`: metaltune on many hosts over SSH
(host keys verified against known_hosts; `--trust-new` for trust on first use), at most
`--parallel` hosts at once. An unreachable host is reported in the summary, never fatal; the exit
code is 1 when any host failed or could not be reached."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from safety.bounds import MAX_PROBATION_S
from tuner.cli.numbers import finite
from tuner.errors import BadInput

fleet = typer.Typer(help="Run metaltune on a fleet over SSH: status, verify, apply (rollout), collect.",
                    no_args_is_help=True)

INV = typer.Option(..., "--inventory", "-I", envvar="METALTUNE_INVENTORY", help="Inventory YAML.")
LIMIT = typer.Option(None, "--limit", help="Comma-separated hosts and groups (default: all).")
PAR = typer.Option(8, "--parallel", min=1, max=256, help="Hosts worked on at once.")
TRUST = typer.Option(False, "--trust-new", help="Trust unknown host keys on first use (recorded in known_hosts).")
JSON = typer.Option(False, "--json", help="Print results as JSON.")
TIMEOUT = typer.Option(900.0, "--timeout", min=1, callback=finite(1, 7 * 86400), help="Seconds per remote command.")


def register(app: typer.Typer) -> None:
    app.add_typer(fleet, name="fleet")


def _hosts(inventory: Path, limit: Optional[str]) -> list[Any]:
    from tuner.fleet.inventory import load

    hosts = load(inventory).select(limit)
    if not hosts:
        raise BadInput(f"--limit {limit!r}: no host of {inventory} selected")
    return hosts


def _emit(as_json: bool, doc: Any, table: Any) -> None:
    from tuner.fleet.summary import print_table

    if as_json:
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print_table(table)


def _exit(outcomes: dict[str, Any]) -> None:
    if any(not o.ok for o in outcomes.values()):
        raise typer.Exit(1)


def _check_profile(profile: str) -> None:
    """A local profile file must exist and parse before any host is touched (bad input changes
    nothing); a bare name is a profile shipped with metaltune on the hosts."""
    p = Path(profile)
    if p.suffix in (".yaml", ".yml") or "/" in profile:
        if not os.path.lexists(p):
            raise BadInput(f"PROFILE {profile}: no such file")
        from tuner import profiles

        profiles.load(profile)  # read through safety.inputs, includes resolved, every field checked


@fleet.command("status")
def status_cmd(inventory: Path = INV, limit: Optional[str] = LIMIT, parallel: int = PAR,
               trust_new: bool = TRUST, as_json: bool = JSON, timeout: float = TIMEOUT) -> None:
    """`metaltune status --json` on every host."""
    from tuner.fleet.remote import Outcome, Remote, fan_out
    from tuner.fleet.summary import outcomes_table

    def step(h: Any) -> Outcome:
        r = Remote(h, trust_new, timeout)
        try:
            rc, data, err = r.metaltune_json(["status", "--json"])
            return Outcome(h.name, rc == 0, "ok" if rc == 0 else "failed",
                           _status_line(data) if rc == 0 else err[-200:], data=data, rc=rc)
        finally:
            r.close()

    res = fan_out(_hosts(inventory, limit), step, parallel)
    _emit(as_json, {n: o.as_dict() for n, o in res.items()}, outcomes_table("fleet status", res))
    _exit(res)


def _status_line(data: Any) -> str:
    """One line from `metaltune status --json`: changed knobs, pending change, last incident."""
    if not isinstance(data, dict):
        return ""
    base, cur = data.get("baseline") or {}, data.get("current") or {}
    changed = sorted(k for k in base if k in cur and base[k] != cur[k])
    p = data.get("pending")
    incs = data.get("incidents") or []
    parts = [f"{len(changed)} knob(s) changed from baseline" + (f" ({', '.join(changed[:3])}"
             f"{'...' if len(changed) > 3 else ''})" if changed else "")]
    parts.append(f"pending: transaction {p.get('txn')} ({p.get('state')})" if p else "pending: none")
    if incs:
        parts.append(f"last incident: {incs[0].get('type')}")
    return "; ".join(parts)


@fleet.command("verify")
def verify_cmd(profile: str = typer.Argument(..., help="Profile name or local YAML file."),
               inventory: Path = INV, limit: Optional[str] = LIMIT, parallel: int = PAR,
               trust_new: bool = TRUST, as_json: bool = JSON, timeout: float = TIMEOUT) -> None:
    """`metaltune verify PROFILE --json` on every host: is the profile in effect there?"""
    from tuner.fleet.remote import Outcome, Remote, fan_out
    from tuner.fleet.rollout import _verify_summary
    from tuner.fleet.summary import outcomes_table

    _check_profile(profile)
    local = Path(profile) if Path(profile).is_file() else None

    def step(h: Any) -> Outcome:
        r = Remote(h, trust_new, timeout)
        try:
            prof = r.upload_profile(local) if local else profile
            rc, data, err = r.metaltune_json(["verify", prof, "--json"])
            detail = "in effect" if rc == 0 else (_verify_summary(data) or err[-200:])
            return Outcome(h.name, rc == 0, "ok" if rc == 0 else "drifted" if data else "failed",
                           detail, data=data, rc=rc)
        finally:
            r.close()

    res = fan_out(_hosts(inventory, limit), step, parallel)
    _emit(as_json, {n: o.as_dict() for n, o in res.items()}, outcomes_table(f"fleet verify {profile}", res))
    _exit(res)


@fleet.command("apply")
def apply_cmd(
    ctx: typer.Context,
    profile: str = typer.Argument(..., help="Profile name or local YAML file (uploaded to each host)."),
    inventory: Path = INV, limit: Optional[str] = LIMIT, parallel: int = PAR, trust_new: bool = TRUST,
    as_json: bool = JSON, timeout: float = TIMEOUT,
    canary: int = typer.Option(1, "--canary", min=0, help="Hosts in the first (canary) wave."),
    wave_size: int = typer.Option(0, "--wave-size", min=0, help="Hosts per later wave (0: all at once)."),
    probation: float = typer.Option(30.0, "--probation", min=0, callback=finite(0, MAX_PROBATION_S), help="Seconds each host holds the change on probation."),
    health_cmd: Optional[str] = typer.Option(None, "--health-cmd", help="Shell command run on each host after apply; must exit 0."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Compare metric measured before/after (regression check), e.g. decode_tok_s."),
    tolerance: float = typer.Option(0.02, "--tolerance", min=0, max=0.5, callback=finite(0, 0.5), help="Allowed relative drop of --metric."),
    repeats: int = typer.Option(5, "--repeats", min=2, help="Repeats of --metric."),
    state: Optional[Path] = typer.Option(None, "--state", help="Rollout state file (default under --state-dir/fleet/)."),
    resume_halted: bool = typer.Option(False, "--resume-halted", help="Resume a halted rollout (after fixing its cause)."),
    restart: bool = typer.Option(False, "--restart", help="Ignore an existing state file and start a new rollout."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the waves and each host's `apply --dry-run` plan; change nothing."),
    drain_cmd: Optional[str] = typer.Option(None, "--drain-cmd", help="With boot-time settings: run on this machine before a host's trial boot ({host} is replaced); must exit 0."),
    undrain_cmd: Optional[str] = typer.Option(None, "--undrain-cmd", help="With boot-time settings: run once the host is healthy again."),
    gate_timeout: float = typer.Option(1800.0, "--gate-timeout", min=1, callback=finite(1, 86400), help="Seconds to wait for a host's gate after its trial boot."),
) -> None:
    """Roll PROFILE out: canaries first (probation + health check), then waves; halt and roll back
    the current wave on an incident or regression; resumable from the state file."""
    from tuner.cli.common import settings
    from tuner.compare.suite import METRICS
    from tuner.fleet.inventory import load
    from tuner.fleet.rollout import Options, Rollout, RolloutState, plan_waves, prepare_resume, _sha
    from tuner.fleet.summary import rollout_table

    _check_profile(profile)
    if metric is not None and metric not in METRICS:
        raise BadInput(f"--metric: unknown metric {metric!r}; expected one of {list(METRICS)}")
    inv = load(inventory)
    hosts = inv.select(limit)
    if not hosts:
        raise BadInput(f"--limit {limit!r}: no host of {inventory} selected")
    opts = Options(canary=canary, wave_size=wave_size, probation_s=probation, parallel=parallel,
                   health_cmd=health_cmd, metric=metric, tolerance=tolerance, repeats=repeats,
                   trust_new=trust_new, timeout_s=timeout, drain_cmd=drain_cmd,
                   undrain_cmd=undrain_cmd, gate_timeout_s=gate_timeout)
    if dry_run:
        return _dry_run(profile, hosts, plan_waves([h.name for h in hosts], canary, wave_size), opts, as_json)
    if state is None:
        stem = Path(profile).stem if Path(profile).is_file() else profile.replace("/", "_")
        state = settings(ctx).state_dir / "fleet" / f"rollout-{stem}-{inventory.stem}.json"
    names = [h.name for h in hosts]
    lock = RolloutState(state, {}).lock()
    if state.exists() and not restart:
        st = RolloutState.load(state)
        doc = st.doc
        if Path(profile).is_file() and doc.get("profile_sha256") not in (None, _sha(Path(profile))):
            raise BadInput(f"rollout state {state}: it rolls out a different version of {profile}; "
                           f"use --restart or another --state")
        missing = sorted(set(doc["hosts"]) - set(inv.hosts))
        if missing:
            raise BadInput(f"rollout state {state}: hosts {missing} are not in {inventory}")
        if doc["status"] == "done":
            print(f"fleet apply: rollout in {state} is already done (--restart to start again)", file=sys.stderr)
            _emit(as_json, doc, rollout_table(doc))
            lock.close()
            return
        prepare_resume(st, resume_halted)
        print(f"fleet apply: resuming {state} at wave {doc['current_wave']}", file=sys.stderr)
        run_hosts = [inv.hosts[n] for n in doc["hosts"]]
    else:
        st = RolloutState.create(state, Path(profile), profile, inventory, plan_waves(names, canary, wave_size), opts)
        run_hosts = hosts
    ro = Rollout(run_hosts, profile, st, opts, log=lambda s: print(f"fleet apply: {s}", file=sys.stderr, flush=True))
    try:
        doc = ro.run()
    finally:
        lock.close()
    _emit(as_json, doc, rollout_table(doc))
    counts: dict[str, int] = {}
    for h in doc["hosts"].values():
        counts[h["state"]] = counts.get(h["state"], 0) + 1
    hint = {"incomplete": "; re-run the same command to retry the hosts not reached",
            "halted": f"; halted: {doc['halt_reason']}"}.get(doc["status"], "")
    print(f"fleet apply: {doc['status']}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + hint, file=sys.stderr)
    print(f"fleet apply: state in {state}", file=sys.stderr)
    if doc["status"] != "done":
        raise typer.Exit(1)


def _dry_run(profile: str, hosts: list[Any], waves: list[list[str]], opts: Any, as_json: bool) -> None:
    """Waves plus what each host would change (`metaltune apply --dry-run`); no state file."""
    from tuner.fleet.remote import Outcome, Remote, fan_out
    from tuner.fleet.summary import outcomes_table

    local = Path(profile) if Path(profile).is_file() else None
    wave_of = {n: i for i, w in enumerate(waves) for n in w}

    def step(h: Any) -> Outcome:
        r = Remote(h, opts.trust_new, opts.timeout_s)
        try:
            prof = r.upload_profile(local) if local else profile
            rc, data, err = r.metaltune_json(["apply", prof, "--dry-run", "--json"])
            if rc != 0 or not isinstance(data, dict):
                return Outcome(h.name, False, "failed", err[-200:], rc=rc)
            ch = data.get("changes") or {}
            denied = [it.get("knob") for it in data.get("plan", []) if str(it.get("policy", "")).startswith("denied")]
            detail = (", ".join(f"{k} -> {v}" for k, v in ch.items()) or "nothing to change") + (
                f"; DENIED by policy: {', '.join(denied)}" if denied else "")
            return Outcome(h.name, not denied, "ok" if not denied else "denied", detail, data=data, rc=rc)
        finally:
            r.close()

    res = fan_out(hosts, step, opts.parallel)
    cols = [("wave", lambda o: "canary" if wave_of[o.host] == 0 and opts.canary else wave_of[o.host])]
    _emit(as_json, {"waves": waves, "hosts": {n: o.as_dict() for n, o in res.items()}},
          outcomes_table(f"fleet apply {profile} --dry-run", res, cols))
    _exit(res)


@fleet.command("collect")
def collect_cmd(
    out: Path = typer.Option(..., "--out", help="Folder for each host's results."),
    inventory: Path = INV, limit: Optional[str] = LIMIT, parallel: int = PAR, trust_new: bool = TRUST,
    as_json: bool = JSON, timeout: float = TIMEOUT,
    bench: bool = typer.Option(False, "--bench", help="Also run the compare benchmark suite on each host."),
    quick: bool = typer.Option(False, "--quick", help="Small benchmark sizes."),
    repeats: int = typer.Option(5, "--repeats", min=2, help="Repeats per metric of --bench (the spread needs 2+)."),
) -> None:
    """Gather each host's status, facts (and benchmarks with --bench) into OUT/<host>/; with 2+
    benchmarked hosts, OUT/report/ compares them."""
    from tuner.fleet.remote import Outcome, Remote, fan_out
    from tuner.fleet.summary import outcomes_table

    out.mkdir(parents=True, exist_ok=True)
    args = ["--repeats", str(repeats)] + (["--quick"] if quick else []) + ([] if bench else ["--facts-only"])

    def step(h: Any) -> Outcome:
        r = Remote(h, trust_new, timeout)
        d = out / h.name
        d.mkdir(exist_ok=True)
        try:
            rc, status, err = r.metaltune_json(["status", "--json"])
            (d / "status.json").write_text(json.dumps({"rc": rc, "status": status, "stderr": err[-2000:]}, indent=1))
            run = r.compare_child(args)
            (d / "compare.json").write_text(json.dumps(run, indent=1, default=str))
            f = run.get("facts", {})
            return Outcome(h.name, True, "ok", f"{f.get('gpu_name')} {f.get('virtualisation')} "
                           f"{f.get('hypervisor') or ''}".strip(), data={"status_rc": rc, "run": run})
        finally:
            r.close()

    res = fan_out(_hosts(inventory, limit), step, parallel)
    runs = [(n, o.data["run"]) for n, o in res.items() if o.ok]
    if bench and len(runs) >= 2:
        from tuner.compare import report

        rep = report.build([r for _, r in runs], [n for n, _ in runs])
        report.write(rep, [r for _, r in runs], out / "report")
    _emit(as_json, {n: {k: v for k, v in o.as_dict().items() if k != "data"} for n, o in res.items()},
          outcomes_table("fleet collect", res))
    _exit(res)
