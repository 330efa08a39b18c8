"""The gate after a trial boot, and the recovery of a trial from any step (docs/boot-trials.md).

`resume` is what the daemon runs at every start (and `metaltune boot gate` by hand). It reads the
open trial from the journal and, by its state and whether the boot ID changed:

- same boot, `intent` or `armed`: the reboot never came; the entry is removed and disarmed
  (`aborted`). Same boot, `rebooting`: the reboot is under way; nothing to do yet.
- new boot, `armed`/`rebooting`, not booted from the trial entry (its `metaltune.trial=N` mark
  is not on /proc/cmdline): the trial boot never came back (a panic, a hang reset by the
  watchdog; the one-shot was spent, so the old default booted): `lost`, the candidate
  quarantined (with BIOS settings, which any reset applies: restaged and demoted, one more
  reboot).
- new boot, in force: `gating`: every requested value read back where it took effect, the health
  monitors for the probation, the benchmark against the one taken before the reboot. Passed:
  `promoting` -> the entry made the default (or blessed) -> `promoted`. Failed: `demoting` -> the
  entry removed (or marked bad), BIOS restaged, quarantined -> `demoted`, reboot to the default.
- a start that finds `gating` in the same trial boot: the gate was interrupted (the daemon
  crashed): demoted, never promoted on half a gate; in another boot: the trial boot died during
  its gate: `lost`. `promoting`/`demoting`: finished (both are idempotent).
- `demoted`, new boot on the old command line: `rolled_back`; same boot: the reboot is asked again.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from safety import _crash
from tuner.boot.commands import Actions
from tuner.boot.host import BIOS, abort, boot_id, booted_entry, undo
from tuner.boot.loader import open_loader

PROBATION_S = 60.0
POLL_S = 1.0


def not_in_force(host: Any, t: dict[str, Any]) -> dict[str, Any]:
    """{knob: value read} for each requested value the booted host does not have."""
    from tuner.knobs.registry import discover

    knobs = discover(host, providers=["driver", "bios", "boot"])
    out = {}
    for name, want in t["changes"].items():
        k = knobs.get(name)
        if k is None:
            out[name] = "<knob not found>"
            continue
        try:
            got = k.read()
        except Exception as e:
            out[name] = f"<unreadable: {e}>"
            continue
        if not k.readback_matches(want, got):
            out[name] = got
    return out


def resume(host: Any, journal: Any, *, monitors: Optional[list[Any]] = None,
           measure: Optional[Callable[[], Any]] = None, probation_s: float = PROBATION_S,
           reboot: bool = True, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    from safety.boot_journal import BootTrials

    trials = BootTrials(journal)
    t = trials.open()
    if t is None:
        return {"trial": None, "state": None, "reason": "no boot trial open"}
    act = Actions(host)
    bl = open_loader(host, t["loader"], act)
    bid = boot_id(host)
    same = bid == t["boot_id_before"]
    st, tid = t["state"], t["id"]
    res = (t.get("result") or {})
    if st in ("intent", "armed") and same:
        return abort(host, trials, t, bl, f"the reboot never came (the trial stopped at {st!r})")
    if st == "intent":  # rebooted before the entry was armed: it cannot have booted
        return abort(host, trials, t, bl, "the host rebooted before the trial was armed")
    if st == "rebooting" and same:
        return {"trial": tid, "state": st, "reason": "waiting for the reboot into the trial"}
    if st in ("armed", "rebooting"):
        if not booted_entry(host, t["entry"]):
            return _lost(host, journal, trials, t, bl, bid,
                         "the trial boot never came back (a panic or a hang reset by the "
                         "watchdog); the host is on the old default", reboot)
        trials.move(tid, "gating", "booted into the trial; the gate starts",
                    result={"boot_id_trial": bid})
        _crash.point("gate.gating")
        return _gate(host, journal, trials, trials.get(tid), bl, monitors, measure,
                     probation_s, reboot, log)
    if st == "gating":
        if res.get("boot_id_trial") == bid:
            return _demote(host, journal, trials, t, bl, "the gate was interrupted (the daemon "
                           "stopped); a half-run gate never promotes", reboot)
        return _lost(host, journal, trials, t, bl, bid,
                     "the trial boot died during its gate (a panic or a hang reset by the "
                     "watchdog); the host is on the old default", reboot)
    if st == "promoting":
        return _promote(journal, trials, t, bl, "promotion finished after a restart")
    if st == "demoting":
        return _demote(host, journal, trials, t, bl, t["reason"] or "demotion finished", reboot)
    if st == "demoted":
        if res.get("boot_id_trial") != bid and not booted_entry(host, t["entry"]):
            trials.move(tid, "rolled_back", "rebooted into the old default; the candidate "
                        "stays quarantined")
            return {"trial": tid, "state": "rolled_back", "reason": t["reason"]}
        if reboot:
            act.run(["systemctl", "reboot"])
        return {"trial": tid, "state": "demoted", "reason": "still in the trial boot: "
                "rebooting into the old default"}
    return {"trial": tid, "state": st, "reason": t["reason"]}


def _lost(host: Any, journal: Any, trials: Any, t: dict[str, Any], bl: Any, bid: str,
          why: str, reboot: bool) -> dict[str, Any]:
    if any(n.startswith(BIOS) for n in t["changes"]):
        # BIOS settings are not one-shot: in force after any reset. Restaged, and one more
        # reboot brings the old values back
        trials.move(t["id"], "gating", why, result={"boot_id_trial": bid})
        return _demote(host, journal, trials, t, bl, why + "; BIOS settings restaged", reboot)
    undo(host, t, bl)
    journal.quarantine(t["candidate_key"], f"boot trial #{t['id']}: {why}")
    trials.move(t["id"], "lost", why, result={"boot_id_after": bid})
    journal.record(f"boot trial #{t['id']} lost", why)
    return {"trial": t["id"], "state": "lost", "reason": why}


def _gate(host: Any, journal: Any, trials: Any, t: dict[str, Any], bl: Any,
          monitors: Optional[list[Any]], measure: Optional[Callable[[], Any]],
          probation_s: float, reboot: bool, log: Callable[[str], None]) -> dict[str, Any]:
    tid = t["id"]
    missing = not_in_force(host, t)
    if missing:
        return _demote(host, journal, trials, t, bl, "not in force after the boot: " + ", ".join(
            f"{k} is {v!r}, wanted {t['changes'][k]!r}" for k, v in missing.items()), reboot)
    log(f"boot trial #{tid}: every value in force; probation {probation_s:g} s")
    for m in monitors or []:
        m.arm()
    end = time.monotonic() + probation_s
    while True:
        for m in monitors or []:
            found = [i for i in m.poll() if i.fatal]
            if found:
                inc = found[0]
                journal.add_incident(inc)
                return _demote(host, journal, trials, t, bl,
                               f"{inc.reason} during the probation: {inc}", reboot)
        if time.monotonic() >= end:
            break
        time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
    if measure is not None and t.get("baseline"):
        from tuner.search.keep import decide_sizes
        from tuner.trial import Measurement

        base = Measurement.model_validate(t["baseline"])
        after = measure()
        _crash.point("gate.measured")
        verdict, reason, stats = decide_sizes([base], [after])
        nums = {"baseline": base.value, "after": after.value, "unit": after.unit,
                "gain": stats.get("gain"), "reason": reason}
        trials.move(tid, "gating", f"benchmark: {reason}", result={"benchmark": nums})
        if verdict != "kept":
            return _demote(host, journal, trials, t, bl,
                           f"lost the benchmark ({reason}: {after.value:g} vs {base.value:g} "
                           f"{after.unit} before the reboot)", reboot)
    return _promote(journal, trials, t, bl, "the gate passed")


def _promote(journal: Any, trials: Any, t: dict[str, Any], bl: Any, why: str) -> dict[str, Any]:
    trials.move(t["id"], "promoting", why)
    _crash.point("gate.promoting")
    bl.promote(t["entry"])
    _crash.point("gate.promoted_entry")
    trials.move(t["id"], "promoted", why)
    journal.record(f"boot trial #{t['id']} promoted", f"{t['entry']} is the default boot entry")
    return {"trial": t["id"], "state": "promoted", "reason": why}


def _demote(host: Any, journal: Any, trials: Any, t: dict[str, Any], bl: Any, why: str,
            reboot: bool) -> dict[str, Any]:
    trials.move(t["id"], "demoting", why)
    _crash.point("gate.demoting")
    undo(host, t, bl)
    _crash.point("gate.undone")
    journal.quarantine(t["candidate_key"], f"boot trial #{t['id']}: {why}")
    trials.move(t["id"], "demoted", why)
    _crash.point("gate.demoted")
    journal.record(f"boot trial #{t['id']} demoted", why)
    out = {"trial": t["id"], "state": "demoted", "reason": why}
    if reboot:
        Actions(host).run(["systemctl", "reboot"])
        out["next"] = "rebooting into the old default"
    return out
