"""`metaltune boot try`: arm a boot-time candidate for the next boot only.

Order, each step journalled (safety.boot_journal) before it is taken:
  1. checks: each value in its knob's domain (bad input: exit 2), the policy (a reboot-effect
     knob needs `allow_reboot_effect`), the quarantine, no other trial open, the boot loader;
  2. the benchmark before the reboot (the measurement the gate compares with);
  3. `intent` (the boot ID and command line now, the default entry, every value before);
  4. the trial entry written (the default's copy with the candidate's command line; driver
     options as `nvidia.NVreg_X=V` tokens, so they are one-shot too), BIOS attributes staged;
  5. the entry armed for the next boot only -> `armed`;
  6. `systemctl reboot` (unless --no-reboot), then `rebooting`.
`--dry-run` runs the checks and returns the entry and the commands, writing nothing.
"""
from __future__ import annotations

import socket
from typing import Any, Optional

from tuner.boot import cmdline
from tuner.boot.commands import Actions
from tuner.boot.host import (BIOS, CMDLINE, DRIVER, MARK, boot_id, entry_id, mark_of,
                             running_cmdline, token_changes)
from tuner.boot.loader import open_loader
from tuner.errors import BadInput, OperationFailed

REPEATS = 6


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`KNOB=VALUE` words: VALUE an integer, true/false, null (removes a parameter), else the
    string as the kernel spells it (`on` stays "on", not YAML's true)."""
    out: dict[str, Any] = {}
    for it in items:
        name, eq, raw = it.partition("=")
        if not eq or not name:
            raise BadInput(f"{it!r}: expected KNOB=VALUE, e.g. boot.cmdline.iommu=pt")
        if raw in ("", "null"):
            out[name] = None
        elif raw in ("true", "false"):
            out[name] = raw == "true"
        elif raw.lstrip("-").isdigit():
            out[name] = int(raw)
        else:
            out[name] = raw
    return out


def _checked(host: Any, changes: dict[str, Any], pol: Any, journal: Any) -> dict[str, Any]:
    from safety.errors import PolicyDenied
    from tuner.knobs.registry import discover, get

    if not changes:
        raise BadInput("boot try: no KNOB=VALUE given")
    knobs = discover(host)
    sel = {}
    for name, v in changes.items():
        if not name.startswith((CMDLINE, DRIVER, BIOS)):
            raise BadInput(f"{name}: not a boot-time knob (boot.cmdline.*, driver.nvidia.*, bios.*); "
                           f"runtime settings go through `metaltune apply`")
        k = get(knobs, name)
        changes[name] = k.validate(v)
        sel[name] = k
    before = {}
    for n, k in sel.items():
        try:
            before[n] = k.read()
        except Exception as e:
            raise OperationFailed(f"{n}: cannot read the value in force ({e})") from None
    try:
        pol.enforce(sel, changes, before, journal)
    except PolicyDenied as e:
        raise OperationFailed(f"refused by the policy ({pol.source}): {e}") from None
    return {"knobs": sel, "before": before, "policy": pol.source}


def measure(host: Any, workload: Optional[str], repeats: int) -> Any:
    from tuner.workloads.factory import make_workload

    w = make_workload(host, workload, None, 600.0)
    try:
        return w.measure(repeats=repeats)
    finally:
        close = getattr(w, "close", None)
        close and close()


def try_boot(host: Any, journal: Any, pol: Any, changes: dict[str, Any], *,
             loader: Optional[str] = None, dry_run: bool = False, workload: Optional[str] = None,
             repeats: int = REPEATS, reboot: bool = True) -> dict[str, Any]:
    """`journal` None only for a dry run on a host without one."""
    from safety import _crash
    from safety.boot_journal import BootTrials
    from safety.transaction import candidate_key

    trials = BootTrials(journal) if journal is not None else None
    chk = _checked(host, dict(changes), pol, journal)
    changes = {n: chk["knobs"][n].validate(v) for n, v in changes.items()}
    key = candidate_key(changes)
    if journal is not None:
        q = journal.is_quarantined(key)
        if q:
            raise OperationFailed(f"this candidate is quarantined ({q['reason']}); "
                                  f"`metaltune quarantine` lists it")
        pending = trials.open()
        if pending:
            raise OperationFailed(f"boot trial #{pending['id']} is still {pending['state']}: "
                                  f"reboot and let the gate decide it first (`metaltune boot status`)")
    act = Actions(host, dry_run=dry_run)
    bl = open_loader(host, loader, act)
    bl.check()
    default = bl.default()
    base = cmdline.parse(bl.options_of(default) or bl.default_entry().get("options", ""))
    no = (trials.all(1)[0]["id"] + 1) if trials and trials.all(1) else 1
    entry = entry_id(no)
    options = cmdline.join(cmdline.with_changes(
        base, {**token_changes(changes), MARK: mark_of(entry)}))
    res: dict[str, Any] = {"loader": bl.kind, "entry": entry, "options": options,
                           "default": default, "changes": changes, "before": chk["before"],
                           "policy": chk["policy"], "host": socket.gethostname()}
    bios = {n: v for n, v in changes.items() if n.startswith(BIOS)}
    if dry_run:
        bl.write_trial(entry, options, f"metaltune trial {no}")
        bl.arm_once(entry)
        for n, v in bios.items():
            act.done.append({"stage": n, "value": v})
        if reboot:
            act.run(["systemctl", "reboot"])
        res.update(result="dry run: nothing written", plan=act.done)
        return res
    base_m = measure(host, workload, repeats)
    _crash.point("boot.measured")
    tid = trials.intent(candidate_key=key, loader=bl.kind, entry=entry, changes=changes,
                        boot_id=boot_id(host), cmdline=running_cmdline(host),
                        default_before=default, before_values=chk["before"])
    trials.move(tid, "intent", "benchmark before the reboot", baseline=base_m.model_dump())
    _crash.point("boot.intent")
    bl.write_trial(entry, options, f"metaltune trial {no}")
    _crash.point("boot.entry_written")
    for n, v in bios.items():
        chk["knobs"][n].apply(v)
    bl.arm_once(entry)
    _crash.point("boot.armed")
    trials.move(tid, "armed", f"{entry} armed for the next boot only")
    _crash.point("boot.armed_journalled")
    res.update(trial=tid, baseline=base_m.value, unit=base_m.unit)
    if reboot:
        try:
            act.run(["systemctl", "reboot"])
        except OperationFailed as e:
            from tuner.boot.host import abort

            abort(host, trials, trials.get(tid), bl, f"the reboot failed: {e}")
            raise
        # after the request: `armed` in the same boot means no reboot was asked for (abort it)
        trials.move(tid, "rebooting", "reboot requested")
        _crash.point("boot.rebooting")
        res["result"] = "rebooting into the trial entry"
    else:
        res["result"] = "armed: the next boot tries it (reboot when ready)"
    res["plan"] = act.done
    return res
