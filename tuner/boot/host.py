"""What a boot trial reads of the host (the boot ID, the running command line, the tokens a
candidate puts on it) and how it is undone: the entry never bootable, BIOS restaged."""
from __future__ import annotations

from typing import Any

from tuner.errors import OperationFailed
from tuner.knobs.boot import PREFIX as CMDLINE

DRIVER = "driver.nvidia."
BIOS = "bios."
BOOT_ID = "/proc/sys/kernel/random/boot_id"


#: on every trial entry's command line, so the boot after says whether the trial entry booted
#: (a dotted parameter of a module that does not exist: the kernel ignores it)
MARK = "metaltune.trial"


def entry_id(trial_no: int) -> str:
    return f"metaltune-trial-{trial_no}"


def mark_of(entry: str) -> str:
    return entry.rsplit("-", 1)[-1]


def booted_entry(host: Any, entry: str) -> bool:
    """Whether the running kernel was booted from this trial entry."""
    from tuner.boot import cmdline

    return cmdline.value_of(cmdline.parse(running_cmdline(host)), MARK) == mark_of(entry)


def boot_id(host: Any) -> str:
    try:
        return host.path(BOOT_ID).read_text().strip()
    except OSError:
        raise OperationFailed(f"{BOOT_ID}: cannot read the boot ID") from None


def running_cmdline(host: Any) -> str:
    try:
        return host.path("/proc/cmdline").read_text().strip()
    except OSError:
        raise OperationFailed("/proc/cmdline: cannot read the running command line") from None


def token_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """The command-line tokens a candidate puts in its entry (driver options included)."""
    out = {}
    for name, v in changes.items():
        if name.startswith(CMDLINE):
            out[name[len(CMDLINE):]] = v
        elif name.startswith(DRIVER):
            out["nvidia." + name[len(DRIVER):]] = v
    return out


def abort(host: Any, trials: Any, t: dict[str, Any], bl: Any, why: str) -> dict[str, Any]:
    undo(host, t, bl)
    trials.move(t["id"], "aborted", why)
    return {"trial": t["id"], "state": "aborted", "reason": why}


def undo(host: Any, t: dict[str, Any], bl: Any) -> None:
    """The host as before the trial: entry not armed and never bootable, BIOS restaged."""
    bl.demote(t["entry"])
    bios = {n: v for n, v in t["changes"].items() if n.startswith(BIOS)}
    if bios:
        from tuner.knobs.registry import discover

        knobs = discover(host, providers=["bios"])
        for n in bios:
            k = knobs.get(n)
            if k is not None and t["before_values"].get(n) is not None:
                k.apply(t["before_values"][n])
