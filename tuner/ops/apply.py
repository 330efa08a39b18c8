"""The "apply" operation: a host profile written through a safety Transaction, in named steps.

Everything is checked before anything is written (`check`: the profile's shape, its knobs'
values against the device's own domains, the host match, the policy, the quarantine, the kernel
bundle's digests and judge); the result is reported (`report`) and a refusal raised (`refuse`)
before any write or probation; the kernel table joins the change set like a knob (`with_table`);
then either nothing is written (`nothing_to_write`: a dry run, or the host already has every
value) or the sources are installed and the change goes through a Transaction (`write`): its
probation is waited for (`wait`) or goes on in the background (`detach`), and the values now in
force are read back (`after`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput, MetaltuneError, OperationFailed
from tuner.ops.profile import (_dirs, _host_knobs, _hw_brief, _jsonable, _load, _summary, plan,
                               refuse_missing)
from tuner.ops.registry import operation


@operation("apply")
def apply(settings: Any, profile: str, dry_run: bool = False, probation_s: Optional[float] = None,
          force: bool = False, policy: Optional[str] = None, no_wait: bool = False) -> dict[str, Any]:
    """`no_wait`: return once the change is in probation; the probation goes on in the
    background (confirmed when it passes, rolled back on an incident; `metaltune confirm` ends
    it early)."""
    if probation_s is not None:  # the CLI's --probation and a socket request's probation_s
        probation_s = _probation(probation_s)
    prof = applicable(settings, profile)
    host, knobs, hw = _host_knobs(settings, dry_run=dry_run)
    try:
        p = check(settings, prof, knobs, hw, policy, force, dry_run)
        res = report(p, dry_run)
        res["warnings"] = provenance_warnings(prof)
        refuse(res, dry_run)
        changes = with_table(p, res)
        if dry_run or not changes:
            return nothing_to_write(settings, prof, res, dry_run)
        return write(settings, p, changes, res, probation_s, host, no_wait)
    finally:
        host.close()


def provenance_warnings(prof: Any) -> list[str]:
    """What a user should know of where the values come from before they land (issue 42 item
    13: `h200-efficient` applied with no sign it was only simulated)."""
    if prof.provenance.values_from == "simulated":
        return [f"profile {prof.name}: its values were found on a simulated host only "
                "(provenance values_from: simulated), never measured on real hardware; "
                "`metaltune search host` measures your own"]
    return []


@dataclass
class Checked:
    """What `check` found: the plan per setting and what the policy and quarantine say of it."""
    prof: Any
    knobs: dict[str, Any]
    hw: Any
    items: list[dict[str, Any]]
    match: list[str]  # why the profile does not match this host ([] : it does)
    pol: Any
    changes: dict[str, Any]  # knob -> value, the drifted ones
    denied: list[Any]  # the policy's refusals
    quarantine: Optional[dict[str, Any]]  # the journal's entry for exactly this change set
    kplan: Optional[dict[str, Any]]  # the profile's kernels, checked (tuner.ops.profile_kernels)


def applicable(settings: Any, profile: str) -> Any:
    """The profile, refused when it is only a base for `include:`."""
    prof = _load(settings, profile)
    if prof.abstract:
        raise BadInput(f"{prof.path}: field abstract: profile {prof.name} is a base for include:, "
                       "not meant to be applied on its own")
    return prof


def check(settings: Any, prof: Any, knobs: dict[str, Any], hw: Any, policy: Optional[str],
          force: bool, dry_run: bool) -> Checked:
    """Everything checked, nothing written: the plan, the host match (refused unless forced; a
    dry run shows the plan and says why), the policy and quarantine per change, the kernels."""
    from tuner import profiles
    from tuner.ops import profile_kernels

    items = plan(prof, knobs)
    refuse_missing(items)
    why = profiles.match_host(prof, hw)
    if why and not force and not dry_run:
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
    kplan = profile_kernels.check(prof, Path(settings.state_dir))  # digests, before any write
    if kplan is not None and not dry_run:  # judged here, whatever the bundle's record says
        profile_kernels.judge(prof, Path(settings.state_dir), kplan)
    return Checked(prof, knobs, hw, items, why, pol, changes, denied, quarantine, kplan)


def report(p: Checked, dry_run: bool) -> dict[str, Any]:
    """The result as the plan stands, with why it is refused (policy first, then quarantine)."""
    from tuner.ops import refusals

    res: dict[str, Any] = {"profile": p.prof.name, "path": p.prof.path, "host": _hw_brief(p.hw),
                           "match": p.match, "dry_run": dry_run, "policy": p.pol.source,
                           "changes": p.changes, "plan": p.items, "summary": _summary(p.items),
                           "policy_summary": _policy_summary(p.items)}
    if p.denied:
        res["refused"] = refusals.policy_message(p.prof.name, p.denied, p.pol, p.knobs)
    elif p.quarantine is not None:
        res["refused"] = refusals.quarantine_message(p.prof.name, p.quarantine)
    return res


def refuse(res: dict[str, Any], dry_run: bool) -> None:
    """A refusal fails the apply before any write, and before a probation starts (a dry run
    only reports it)."""
    if res.get("refused") and not dry_run:
        raise OperationFailed(res["refused"])


def with_table(p: Checked, res: dict[str, Any]) -> dict[str, Any]:
    """The change set with the profile's kernel table in it: the table is a change like a knob's
    (policy, journal, probation, rollback)."""
    from tuner.ops import profile_kernels

    changes = p.changes
    if p.kplan is not None:
        res["kernels"] = {k: v for k, v in p.kplan.items() if k != "table"}
        table = profile_kernels.change(p.prof, p.kplan, p.knobs)
        if table is not None:
            changes = dict(changes, **{profile_kernels.KNOB: table})
    return changes


def nothing_to_write(settings: Any, prof: Any, res: dict[str, Any],
                     dry_run: bool) -> dict[str, Any]:
    from tuner.ops import hints

    res["result"] = "dry run: nothing written" if dry_run else "nothing to change"
    if not dry_run:  # the profile is in force all the same: `status` names it
        res["note"] = _record_in_force(settings, hints.label_name(prof, _dirs(settings)))
    return res


def write(settings: Any, p: Checked, changes: dict[str, Any], res: dict[str, Any],
          probation_s: Optional[float], host: Any, no_wait: bool) -> dict[str, Any]:
    """The kernel sources installed (the table only names what the store has), then the
    change through a Transaction."""
    from tuner.ops import profile_kernels

    if p.kplan is not None:
        res["kernels"] = profile_kernels.install(p.prof, settings.ensure_state_dir(), p.kplan)
    res.update(transaction(settings, p.prof, p.knobs, changes, p.pol, probation_s, host,
                            no_wait=no_wait))
    return res


def transaction(settings: Any, prof: Any, knobs: dict[str, Any], changes: dict[str, Any],
                pol: Any, probation_s: Optional[float], host: Any,
                no_wait: bool = False, label: Optional[str] = None) -> dict[str, Any]:
    """The change through a safety Transaction, journalled as `label` (default: the profile's
    apply label, which makes it the host's active profile); waits out the probation unless
    `no_wait`."""
    from safety import Journal, Transaction
    from tuner.ops import hints, probation
    from tuner.ops.safety import APPLY_LABEL
    from tuner.search.safety_context import host_monitors

    state = settings.ensure_state_dir()
    journal = Journal.in_state_dir(state)
    bdfs = sorted({n[len("pcie."):].rsplit(".", 1)[0] for n in knobs if n.startswith("pcie.")}) or None
    # a model process's kernel computing wrong during the probation rolls the profile back
    monitors = host_monitors(host, state_dir=state, bdfs=bdfs)
    watch = float(probation_s) if probation_s is not None else float(pol.probation_for(list(changes)))
    txn = Transaction(journal, knobs, changes, policy=pol, monitors=monitors,
                      probation_s=watch + probation.grace(watch),
                      label=label or APPLY_LABEL + hints.label_name(prof, _dirs(settings)))
    if no_wait:
        return detach(txn, journal, prof, knobs, pol, watch)
    how = wait(txn, journal, prof, knobs, pol, watch, None)
    return after(txn, knobs, changes, how)


def wait(txn: Any, journal: Any, prof: Any, knobs: dict[str, Any], pol: Any, watch: float,
         started: Any) -> str:
    """Begin the transaction and wait out its probation (`started`, when given, hears once it
    is in probation); a refusal, an incident or Ctrl-C is said in full (tuner.ops.apply_errors)."""
    from safety.errors import SafetyError
    from tuner.ops import apply_errors, probation

    try:
        with probation.ctrl_c_remembered():  # a Ctrl-C Python drops still ends the wait
            txn.begin()
            if started is not None:
                started({"result": "in probation", "transaction": txn.id, "probation_s": watch,
                         "confirm_by": time.time() + watch})
            return probation.wait(txn, watch, f"profile {prof.name}: {watch:g}s probation passed")
    except (SafetyError, KeyboardInterrupt) as e:
        raise apply_errors.translate(prof.name, e, txn, pol, knobs) from None
    finally:
        journal.close()


def detach(txn: Any, journal: Any, prof: Any, knobs: dict[str, Any], pol: Any,
           watch: float) -> dict[str, Any]:
    """`--no-wait`: back once the change is in probation, which goes on in the background."""
    from tuner.ops import probation

    try:
        started = probation.detach(lambda s: wait(txn, journal, prof, knobs, pol, watch, s))
    finally:
        journal.close()  # this thread's connection; the background opens its own
    return {**started, "after": {}, "pending_reboot": [],
            "note": f"probation goes on in the background for {watch:g}s: kept when it "
                    "passes, rolled back on an incident; `metaltune confirm` keeps it now, "
                    "`metaltune rollback` undoes it, `metaltune status` shows it"}


def after(txn: Any, knobs: dict[str, Any], changes: dict[str, Any], how: str) -> dict[str, Any]:
    """The values now in force, read back, and what waits for a reboot or driver reload."""
    out = {}
    for n in changes:
        k = knobs[n]
        try:
            out[n] = {"value": _jsonable(k.read()),
                      "pending": _jsonable(k.pending()) if hasattr(k, "pending") else None,
                      "effect": k.effect.value}
        except MetaltuneError as e:
            out[n] = {"error": str(e)}
    pend = [n for n, a in out.items() if a.get("pending") is not None]
    return {"result": "applied", "transaction": txn.id, "after": out, "confirmed": how,
            "pending_reboot": pend,
            "note": ("staged until the next reboot/driver reload: " + ", ".join(pend)) if pend else ""}


# -- helpers ----------------------------------------------------------------------------------

def _load_policy(policy: Optional[str]) -> Any:
    from safety import policy as pol
    from safety.errors import PolicyError

    policy = policy or os.environ.get("METALTUNE_POLICY")  # a fleet inventory's per-host env
    try:
        if policy:
            return pol.load(policy)
        etc = Path("/etc/metaltune/policy.yaml")
        return pol.load(etc) if etc.exists() else pol.load_default()
    except PolicyError as e:
        raise BadInput(str(e)) from None


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
