"""The boot-trial operations: `boot_try` (arm a one-shot boot), `boot_gate` (decide the open trial
after the boot; the daemon runs it at every start) and `boot_status`. See docs/boot-trials.md."""
from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import Field

from tuner.ops.args import Count
from tuner.ops.registry import operation
from tuner.ops.safety import journal_for, journal_to_read, translate

Repeats = Annotated[int, Field(ge=3, le=100)]
Probation = Annotated[float, Field(ge=0, le=86400)]


@operation("boot_try")
def boot_try(settings: Any, changes: list[str], loader: Optional[str] = None,
             dry_run: bool = False, policy: Optional[str] = None, workload: Optional[str] = None,
             repeats: Repeats = 6, reboot: bool = True) -> dict[str, Any]:
    from tuner.boot.trial import parse_assignments, try_boot
    from tuner.ops.apply import _load_policy

    values = parse_assignments(changes)
    pol = _load_policy(policy)
    host = settings.host(dry_run=dry_run)
    with translate():
        journal = journal_to_read(settings) if dry_run else journal_for(settings)
        return try_boot(host, journal, pol, values, loader=loader, dry_run=dry_run,
                        workload=workload, repeats=repeats, reboot=reboot)


@operation("boot_gate")
def boot_gate(settings: Any, probation: Optional[Probation] = None,
              workload: Optional[str] = None, repeats: Repeats = 6,
              reboot: bool = True) -> dict[str, Any]:
    """The open trial decided (or recovered) for this boot; the daemon's start runs it."""
    from safety import monitors as mon
    from tuner.boot import gate
    from tuner.boot.trial import measure

    host = settings.host()
    j = journal_for(settings, create=False)
    if j is None:
        return {"trial": None, "state": None, "reason": "no journal: no boot trial"}
    try:
        nvml = host.nvml if host.has_nvml() else None
    except Exception:
        nvml = None
    monitors = mon.standard(nvml=nvml, root=host.path("/"))
    with translate():
        res = gate.resume(host, j, monitors=monitors,
                          measure=lambda: measure(host, workload, repeats),
                          probation_s=gate.PROBATION_S if probation is None else probation,
                          reboot=reboot)
        if reboot:
            nxt = continue_search(settings, host, j, res)
            if nxt is not None:
                res["boot_search"] = nxt
        return res


def continue_search(settings: Any, host: Any, journal: Any,
                    gate_result: dict[str, Any]) -> Optional[dict[str, Any]]:
    """`search host --reboots N`: once a trial is decided, the next boot-time candidate."""
    from tuner.boot import queue
    from tuner.boot.trial import try_boot
    from tuner.ops.apply import _load_policy

    q = queue.after_gate(settings.state_dir, gate_result)
    if q is None:
        return None
    if gate_result["state"] == "aborted":  # no reboot came: a person stopped it, or a crash
        queue.drop(settings.state_dir)
        why = f"boot-time search stopped: trial #{gate_result['trial']} was aborted"
        journal.record("boot search", why)
        return {"boot_search": "stopped", "reason": why}
    pol = _load_policy(q.get("policy"))
    return queue.arm_next(settings.state_dir, q, lambda cand: try_boot(
        host, journal, pol, dict(cand), loader=q.get("loader"), workload=q.get("workload"),
        repeats=q.get("repeats", 6)), journal)


@operation("boot_status", reads=True)
def boot_status(settings: Any, limit: Count = 10) -> dict[str, Any]:
    from safety.boot_journal import BootTrials
    from tuner.boot.loader import open_loader

    host = settings.host()
    try:
        loader = open_loader(host).state()
    except Exception as e:  # no boot loader here (a VM, a container): still show the trials
        loader = {"loader": None, "error": str(e)}
    j = journal_to_read(settings)
    trials = BootTrials(j).all(limit) if j is not None else []
    return {"loader": loader, "trials": trials,
            "open": next((t for t in trials if t["state"] not in
                          ("promoted", "rolled_back", "lost", "aborted")), None)}
