"""The boot-time part of `search host --reboots N`: candidates tried one per reboot, in order,
each through a trial boot (its own benchmark before, its gate after), across as many reboots as
the budget allows. The queue lives in STATE_DIR/boot-search.json so the daemon's gate after each
boot arms the next one; the budget counts every reboot, the return to the old default after a
demotion included (that one is always made, even past the budget). When the budget is spent the
untried candidates are journalled and reported, never dropped silently."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.knobs._files import atomic_write

FILE = "boot-search.json"
FINAL = ("promoted", "rolled_back", "lost", "aborted")


def path(state_dir: Path) -> Path:
    return Path(state_dir) / FILE


def plan(knobs: dict[str, Any], allowed: Callable[[str, Any, Any], bool]) -> list[dict[str, Any]]:
    """One candidate per (boot-time knob, value) the policy allows, the value in force left out:
    one reboot tries one candidate; a promoted one is in the default entry the next copies."""
    out = []
    for name in sorted(knobs):
        k = knobs[name]
        cur = k.read()
        for v in k.limits().search_values():
            if v is None or k.readback_matches(v, cur) or not allowed(name, cur, v):
                continue
            out.append({name: v})
    return out


def load(state_dir: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path(state_dir).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # a torn file cannot happen (atomic writes); a hand-edited one stops it


def save(state_dir: Path, q: dict[str, Any]) -> None:
    from safety.securefs import secure_dir

    secure_dir(Path(state_dir))
    atomic_write(path(state_dir), json.dumps(q, indent=1, default=str) + "\n", mode=0o600)


def drop(state_dir: Path) -> None:
    path(state_dir).unlink(missing_ok=True)


def start(state_dir: Path, candidates: list[dict[str, Any]], reboots: int, **how: Any) -> dict[str, Any]:
    q = {"candidates": candidates, "reboots": reboots, "reboots_used": 0, "tried": [], **how}
    save(state_dir, q)
    return q


def arm_next(state_dir: Path, q: dict[str, Any], arm: Callable[[dict[str, Any]], dict[str, Any]],
             journal: Any) -> dict[str, Any]:
    """Arm the next candidate (one reboot) while the budget lasts; a candidate refused now (the
    quarantine, a rate limit) is skipped with its reason. Else end the search, saying what was
    left untried."""
    from tuner.errors import MetaltuneError

    skipped = q.setdefault("skipped", [])
    while q["candidates"] and q["reboots"] - q["reboots_used"] >= 1:
        cand = q["candidates"].pop(0)
        q["reboots_used"] += 1
        q["tried"].append(cand)
        save(state_dir, q)  # before the reboot is asked for: a candidate is never tried twice
        try:
            res = arm(cand)
        except MetaltuneError as e:
            q["reboots_used"] -= 1
            q["tried"].pop()
            skipped.append({"candidate": cand, "reason": str(e)})
            save(state_dir, q)
            continue
        return {"boot_search": "armed", "candidate": cand, "trial": res.get("trial"),
                "reboots_left": q["reboots"] - q["reboots_used"], "skipped": skipped,
                "result": res.get("result")}
    untried = q["candidates"]
    why = f"boot-time search done: {len(q['tried'])} candidates tried in {q['reboots_used']} reboots"
    if untried:
        why += (f"; reboot budget ({q['reboots']}) spent, {len(untried)} not tried: "
                + ", ".join(json.dumps(c) for c in untried))
    if skipped:
        why += "; skipped: " + "; ".join(f"{json.dumps(s['candidate'])} ({s['reason']})"
                                         for s in skipped)
    journal.record("boot search", why)
    drop(state_dir)
    return {"boot_search": "done", "reason": why, "untried": untried, "skipped": skipped}


def after_gate(state_dir: Path, gate_result: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The queue after the gate decided a trial: a demotion's reboot back counts too. None when
    no boot-time search is running or the trial is not final yet."""
    q = load(state_dir)
    if q is None:
        return None
    if gate_result.get("state") == "demoted" and gate_result.get("next"):
        q["reboots_used"] += 1
        save(state_dir, q)
        return None
    if gate_result.get("state") not in FINAL:
        return None
    return q
