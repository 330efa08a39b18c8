"""`metaltune-boot-gate.service`: the gate after a trial boot, as systemd's boot assessment wants
it (systemd-bless-boot(8)): a oneshot ordered before `boot-complete.target` and required by it, so
the boot counts as complete (and systemd-bless-boot marks a counted entry good) only once the gate
passed; ordered before the daemon too, so one process decides a trial. `metaltune install` writes
it beside metaltune.service."""
from __future__ import annotations

from typing import Optional

UNIT_NAME = "metaltune-boot-gate.service"


def render(exec_start: list[str], env: Optional[list[str]] = None,
           state_dir: str = "/var/lib/metaltune") -> str:
    cmd = " ".join(exec_start + ["boot", "gate"])  # a demotion reboots into the old default
    return "\n".join([
        "[Unit]",
        "Description=metaltune: the gate after a trial boot (promote it, or fall back to the old default)",
        "Documentation=https://www.freedesktop.org/software/systemd/man/latest/systemd-bless-boot.service.html",
        "After=local-fs.target systemd-modules-load.service nvidia-persistenced.service",
        "Before=boot-complete.target metaltune.service",
        f"ConditionPathExists={state_dir}/journal.db",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        f"ExecStart={cmd}",
        *(env or []),
        "Environment=PYTHONUNBUFFERED=1",
        "User=root",
        "UMask=0077",
        "# the probation and the benchmark run here, before the boot counts as complete",
        "TimeoutStartSec=30min",
        "",
        "[Install]",
        "RequiredBy=boot-complete.target",
        "WantedBy=multi-user.target",
        "",
    ])
