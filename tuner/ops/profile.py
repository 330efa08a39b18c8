"""Operations on host profiles: "apply", "verify", "profile_list", "profile_show",
"profile_diff", "profile_export" (CLI and daemon socket share them, see tuner.ops).

verify: per knob `ok` / `drifted` / `unsupported` / `pending-reboot` (a staged BIOS or driver
change waits for a reboot or driver reload) / `error`, like `tuned-adm verify` but machine-readable.
apply: everything is checked first (profile shape, knob names, values against the device's own
domains, the policy); only then does a safety Transaction write, with probation and rollback.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput, MetaltuneError, OperationFailed, OutOfDomain
from tuner.ops.registry import operation

PENDING = "pending-reboot"


def _dirs(settings: Any) -> list[Path]:
    return [Path(settings.state_dir) / "profiles", Path("/etc/metaltune/profiles")]


def _load(settings: Any, name: str) -> Any:
    from tuner import profiles

    return profiles.load(name, _dirs(settings))


def _host_knobs(settings: Any, dry_run: bool = False) -> tuple[Any, dict[str, Any], Any]:
    from tuner.host import hardware as hw
    from tuner.knobs import registry

    host = settings.host(dry_run=dry_run)
    return host, registry.discover(host, state_dir=settings.state_dir), hw.detect(host)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def plan(profile: Any, knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per setting that applies on this host, values checked against the device's
    domain (an out-of-domain value is BadInput naming the file, line and field)."""
    from tuner import profiles
    from tuner.knobs.base import Unsupported, values_equal

    resolved, unmatched = profiles.resolve(profile, knobs)
    items: list[dict[str, Any]] = []
    for name, ks in resolved.items():
        k = knobs[name]
        it: dict[str, Any] = {"knob": name, "key": ks.key, "file": ks.file, "line": ks.line,
                              "effect": k.effect.value, "wanted": _jsonable(ks.value)}
        try:
            dom = k.limits()
        except MetaltuneError as e:
            items.append({**it, "status": "unsupported", "reason": str(e)})
            continue
        if isinstance(dom, Unsupported):
            items.append({**it, "status": "unsupported", "reason": dom.reason})
            continue
        value = ks.value
        bound = profiles.bound_of(value)
        if bound is not None:
            value = bound[1]
        if value == "default":
            value = k.default()
            if value is None:
                raise BadInput(f"{ks.where()}: field knobs.{ks.key}: {name} reports no default "
                               "value; give one explicitly")
        try:
            value = k.validate(value)
        except OutOfDomain as e:
            raise BadInput(f"{ks.where()}: field knobs.{ks.key}: {e} "
                           f"(expected {dom.describe()})") from None
        it["wanted"] = _jsonable(value)
        it["domain"] = dom.describe()
        try:
            cur = k.read()
            pend = k.pending() if hasattr(k, "pending") else None
        except MetaltuneError as e:
            items.append({**it, "status": "error", "reason": str(e)})
            continue
        if bound is not None and isinstance(cur, (int, float)) and not isinstance(cur, bool) and (
                cur >= value if bound[0] == "at_least" else cur <= value):
            value = cur  # the host already satisfies the bound: keep its value
            it["wanted"] = _jsonable(cur)
            it["bound"] = {bound[0]: bound[1]}
        it["current"], it["pending"] = _jsonable(cur), _jsonable(pend)
        if pend is not None and values_equal(pend, value):
            it["status"] = PENDING
        elif pend is None and (values_equal(cur, value) or k.readback_matches(value, cur)):
            it["status"] = "ok"
        else:
            it["status"] = "drifted"
        items.append(it)
    for ks in unmatched:
        items.append({"knob": None, "key": ks.key, "file": ks.file, "line": ks.line,
                      "wanted": _jsonable(ks.value), "status": "unsupported",
                      "reason": "no such knob on this host"})
    return items


def _summary(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in items:
        out[it["status"]] = out.get(it["status"], 0) + 1
    return out


def _hw_brief(hw: Any) -> dict[str, Any]:
    return {"gpus": [g.name for g in hw.gpus], "driver": hw.driver_version,
            "virtualization": "vm" if hw.virtualization.is_vm else "bare_metal",
            "evidence": hw.virtualization.evidence}


@operation("verify", reads=True)
def verify(settings: Any, profile: str) -> dict[str, Any]:
    from tuner import profiles

    prof = _load(settings, profile)
    host, knobs, hw = _host_knobs(settings, dry_run=True)
    try:
        items = plan(prof, knobs)
    finally:
        host.close()
    summ = _summary(items)
    return {"profile": prof.name, "path": prof.path, "host": _hw_brief(hw),
            "match": profiles.match_host(prof, hw), "ok": not summ.get("drifted") and not summ.get("error"),
            "summary": summ, "knobs": items}


def _load_policy(policy: Optional[str]) -> Any:
    from safety import policy as pol
    from safety.errors import PolicyError

    try:
        if policy:
            return pol.load(policy)
        etc = Path("/etc/metaltune/policy.yaml")
        return pol.load(etc) if etc.exists() else pol.load_default()
    except PolicyError as e:
        raise BadInput(str(e)) from None


@operation("apply")
def apply(settings: Any, profile: str, dry_run: bool = False, probation_s: Optional[float] = None,
          force: bool = False, policy: Optional[str] = None, no_wait: bool = False) -> dict[str, Any]:
    """`no_wait`: return once the change is in probation; the probation goes on in the
    background (confirmed when it passes, rolled back on an incident; `metaltune confirm` ends
    it early)."""
    from tuner import profiles
    from tuner.ops import hints, refusals

    if probation_s is not None:  # the CLI's --probation and a socket request's probation_s
        probation_s = _probation(probation_s)
    prof = _load(settings, profile)
    if prof.abstract:
        raise BadInput(f"{prof.path}: field abstract: profile {prof.name} is a base for include:, "
                       "not meant to be applied on its own")
    host, knobs, hw = _host_knobs(settings, dry_run=dry_run)
    try:
        items = plan(prof, knobs)
        why = profiles.match_host(prof, hw)
        if why and not force and not dry_run:  # a dry run shows the plan and says why
            raise OperationFailed(f"profile {prof.name} does not match this host: "
                                  + "; ".join(why) + " (--force applies it anyway)")
        pol = _load_policy(policy)
        changes = {it["knob"]: it["wanted"] for it in items if it["status"] == "drifted"}
        denied = []
        for it in items:
            if it["status"] == "drifted":
                r = pol.check(knobs[it["knob"]], it.get("current"), it["wanted"])
                it["policy"] = "allowed" if r is None else f"denied: {r.rule}: {r.failed}"
                if r is not None:
                    denied.append(r)
        quarantine = _quarantined(settings, changes) if changes else None
        if quarantine is not None:
            for it in items:
                if it.get("policy") == "allowed":
                    it["policy"] = f"quarantined: #{quarantine['id']} {quarantine['reason']}"
        from tuner.ops import profile_kernels

        kplan = profile_kernels.check(prof, Path(settings.state_dir))  # digests, before any write
        if kplan is not None and not dry_run:  # judged here, whatever the bundle's record says
            profile_kernels.judge(prof, Path(settings.state_dir), kplan)
        res: dict[str, Any] = {"profile": prof.name, "path": prof.path, "host": _hw_brief(hw),
                               "match": why, "dry_run": dry_run, "policy": pol.source,
                               "changes": changes, "plan": items, "summary": _summary(items),
                               "policy_summary": _policy_summary(items)}
        if denied:
            res["refused"] = refusals.policy_message(prof.name, denied, pol, knobs)
        elif quarantine is not None:
            res["refused"] = refusals.quarantine_message(prof.name, quarantine)
        if res.get("refused") and not dry_run:  # before any write, and before a probation starts
            raise OperationFailed(res["refused"])
        if kplan is not None:
            res["kernels"] = {k: v for k, v in kplan.items() if k != "table"}
            # the table is a change like a knob's: policy, journal, probation, rollback
            table = profile_kernels.change(prof, kplan, knobs)
            if table is not None:
                changes = dict(changes, **{profile_kernels.KNOB: table})
        if dry_run or not changes:
            res["result"] = "dry run: nothing written" if dry_run else "nothing to change"
            if not dry_run:  # the profile is in force all the same: `status` names it
                res["note"] = _record_in_force(settings, hints.label_name(prof, _dirs(settings)))
        else:
            if kplan is not None:  # sources first: the table only names what the store has
                res["kernels"] = profile_kernels.install(prof, settings.ensure_state_dir(), kplan)
            res.update(_transaction(settings, prof, knobs, changes, pol, probation_s, host,
                                    no_wait=no_wait))
        return res
    finally:
        host.close()


def _probation(value: Any) -> float:
    from safety.bounds import probation_seconds
    from safety.errors import OutOfBounds

    try:
        return probation_seconds(value, "--probation")
    except OutOfBounds as e:
        raise BadInput(str(e)) from None


def _policy_summary(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in items:
        if it.get("policy"):
            k = it["policy"].split(":")[0]
            out[k] = out.get(k, 0) + 1
    return out


def _quarantined(settings: Any, changes: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The quarantine entry of exactly this change set (what the transaction would refuse)."""
    from safety.transaction import candidate_key
    from tuner.ops.safety import journal_to_read

    j = journal_to_read(settings)
    if j is None:
        return None
    try:
        return j.is_quarantined(candidate_key(changes))
    finally:
        j.close()


def _record_in_force(settings: Any, name: str) -> str:
    """Journal that the profile is in force; "" or why it could not be (the apply changed
    nothing, so a state dir it cannot write does not fail it)."""
    from safety.errors import SafetyError
    from tuner.ops.safety import APPLY_LABEL, journal_for

    try:
        j = journal_for(settings)
        try:
            j.record(f"{APPLY_LABEL}{name}", "nothing to change: the host already had every value")
        finally:
            j.close()
    except (MetaltuneError, SafetyError, OSError) as e:
        return f"not journalled as the active profile: {e}"
    return ""


def _transaction(settings: Any, prof: Any, knobs: dict[str, Any], changes: dict[str, Any],
                 pol: Any, probation_s: Optional[float], host: Any,
                 no_wait: bool = False) -> dict[str, Any]:
    from safety import Journal, Transaction
    from safety.errors import SafetyError
    from tuner.ops import apply_errors, hints, probation
    from tuner.ops.safety import APPLY_LABEL

    state = settings.ensure_state_dir()
    journal = Journal.in_state_dir(state)
    monitors = _monitors(host, knobs, state)
    watch = float(probation_s) if probation_s is not None else float(pol.probation_for(list(changes)))
    txn = Transaction(journal, knobs, changes, policy=pol, monitors=monitors,
                      probation_s=watch + probation.grace(watch), label=APPLY_LABEL + hints.label_name(prof, _dirs(settings)))

    def body(started: Optional[probation.Started]) -> str:
        try:
            txn.begin()
            if started is not None:
                started({"result": "in probation", "transaction": txn.id, "probation_s": watch,
                         "confirm_by": time.time() + watch})
            return probation.wait(txn, watch, f"profile {prof.name}: {watch:g}s probation passed")
        except (SafetyError, KeyboardInterrupt) as e:  # refusals, incidents, Ctrl-C: said in full
            raise apply_errors.translate(prof.name, e, txn, pol, knobs) from None
        finally:
            journal.close()

    if no_wait:
        try:
            started = probation.detach(body)
        finally:
            journal.close()  # this thread's connection; the background opens its own
        return {**started, "after": {}, "pending_reboot": [],
                "note": f"probation goes on in the background for {watch:g}s: kept when it "
                        "passes, rolled back on an incident; `metaltune confirm` keeps it now, "
                        "`metaltune rollback` undoes it, `metaltune status` shows it"}
    how = body(None)
    after = {}
    for n in changes:
        k = knobs[n]
        try:
            after[n] = {"value": _jsonable(k.read()),
                        "pending": _jsonable(k.pending()) if hasattr(k, "pending") else None,
                        "effect": k.effect.value}
        except MetaltuneError as e:
            after[n] = {"error": str(e)}
    pend = [n for n, a in after.items() if a.get("pending") is not None]
    return {"result": "applied", "transaction": txn.id, "after": after, "confirmed": how,
            "pending_reboot": pend,
            "note": ("staged until the next reboot/driver reload: " + ", ".join(pend)) if pend else ""}


def _monitors(host: Any, knobs: dict[str, Any], state_dir: Any = None) -> list[Any]:
    from safety import monitors as mon

    from kernelsearch.canary_reader import KernelCanaryMonitor

    try:
        nv = host.nvml if host.has_nvml() else None
    except Exception:  # no NVML here (or no fake one yet): kernel-log and AER monitors only
        nv = None
    bdfs = sorted({n[len("pcie."):].rsplit(".", 1)[0] for n in knobs if n.startswith("pcie.")}) or None
    try:
        ms = mon.standard(nvml=nv, root=str(host.path("/")), bdfs=bdfs)
    except Exception:
        ms = []
    # a model process's kernel computing wrong during the probation rolls the profile back
    return ms + ([KernelCanaryMonitor(state_dir)] if state_dir is not None else [])


@operation("profile_list", reads=True)
def profile_list(settings: Any, match: bool = True) -> dict[str, Any]:
    from tuner import profiles

    items = profiles.list_profiles(_dirs(settings))
    hw = None
    if match:
        try:
            from tuner.host import hardware as hwmod

            with settings.host(dry_run=True) as host:
                hw = hwmod.detect(host)
        except MetaltuneError:
            hw = None
    if hw is not None:
        for it in items:
            if "error" in it:
                continue
            try:
                why = profiles.match_host(profiles.load(it["path"], _dirs(settings)), hw)
            except BadInput as e:
                why = [str(e)]
            it["matches_host"] = not why
            it["mismatch"] = why
    return {"profiles": items, "host": _hw_brief(hw) if hw is not None else None}


@operation("profile_show", reads=True)
def profile_show(settings: Any, profile: str) -> dict[str, Any]:
    prof = _load(settings, profile)
    d = prof.model_dump(mode="json")
    return d


@operation("profile_diff", reads=True)
def profile_diff(settings: Any, a: str, b: Optional[str] = None) -> dict[str, Any]:
    """Knob-by-knob difference between two profiles (after includes), or between a profile
    and what this host has now when `b` is omitted."""
    from tuner.knobs.base import values_equal

    pa = _load(settings, a)
    va = pa.values()
    if b is not None:
        pb = _load(settings, b)
        vb, bname = pb.values(), pb.name
    else:  # against this host: what verify would report as not ok, with resolved values
        host, knobs, _ = _host_knobs(settings, dry_run=True)
        try:
            items = plan(pa, knobs)
        finally:
            host.close()
        rows = [{"knob": it["knob"] or it["key"], pa.name: it["wanted"],
                 "host": it.get("current", "<" + it.get("reason", it["status"]) + ">"),
                 "status": it["status"]} for it in items if it["status"] != "ok"]
        return {"a": pa.name, "b": "host", "differences": rows, "same": not rows}
    keys = sorted(set(va) | set(vb))
    rows = []
    for k in keys:
        x, y = va.get(k, "<unset>"), vb.get(k, "<unset>")
        same = values_equal(x, y)
        if not same:
            rows.append({"knob": k, pa.name: _jsonable(x), bname: _jsonable(y)})
    return {"a": pa.name, "b": bname, "differences": rows, "same": not rows}


@operation("profile_export", reads=True)
def profile_export(settings: Any, profile: Optional[str] = None, from_host: bool = False,
                   new_name: Optional[str] = None, kernels: Optional[str] = None) -> dict[str, Any]:
    """A self-contained YAML profile: a profile with its includes flattened, or (from_host) the
    values this host has now, with provenance saying where and when they were read. `kernels`:
    a dispatch table (JSON) to carry as the profile's `kernels:`. Every stored source the
    kernels name is bundled under `kernel_sources:` (tuner.ops.profile_kernels)."""
    import yaml

    from tuner.ops import profile_kernels

    _Dumper = _dumper()

    if from_host:
        from tuner.knobs.base import Unsupported

        host, knobs, hw = _host_knobs(settings, dry_run=True)
        try:
            vals = {}
            for n, k in sorted(knobs.items()):
                if n == profile_kernels.KNOB:  # a profile carries its table as `kernels:`
                    continue
                try:
                    if isinstance(k.limits(), Unsupported):
                        continue
                    vals[n] = _jsonable(k.read())
                except MetaltuneError:
                    continue
        finally:
            host.close()
        doc = {"name": new_name or "exported",
               "description": "values read from a host by `metaltune profile export --from-host`",
               "match": {"gpu_name": sorted({g.name for g in hw.gpus})} if hw.gpus else {},
               "knobs": vals,
               "provenance": {"source": "exported from host",
                              "measured_on": ", ".join(sorted({g.name for g in hw.gpus})) or None,
                              "driver": hw.driver_version,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        if not doc["match"]:
            doc.pop("match")
    else:
        if not profile:
            raise BadInput("profile export: give a PROFILE or --from-host")
        prof = _load(settings, profile)
        doc = prof.to_yaml_dict()
        if new_name:
            doc["name"] = new_name
    if kernels:
        from kernelsearch.table import DispatchTable, TableError

        try:
            doc["kernels"] = DispatchTable.load(kernels).to_dict()
        except TableError as e:
            raise BadInput(f"--kernels: {e}") from None
        doc.pop("kernel_sources", None)
        doc = {k: doc[k] for k in doc if k != "provenance"} | {"provenance": doc.get("provenance", {})}
    doc = profile_kernels.bundle(doc, Path(settings.state_dir))
    return {"yaml": yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None),
            "profile": doc}


def _block_str(dumper: Any, s: str) -> Any:
    """Multi-line strings (bundled kernel sources) as literal blocks: readable, and yaml
    round-trips them byte for byte, so their digests still verify on the importing host."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


def _dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, _block_str)
    return Dumper


@operation("host")
def host_info(settings: Any) -> dict[str, Any]:
    """Detected hardware and every knob (value, domain, effect), read-only."""
    from tuner.host import hardware as hwmod
    from tuner.knobs import registry

    with settings.host(dry_run=True) as host:
        info = hwmod.detect(host)
        knobs = registry.discover(host)
        rows = [k.describe() for _, k in sorted(knobs.items())]
    return {"hardware": info.model_dump(mode="json"), "knobs": rows}
