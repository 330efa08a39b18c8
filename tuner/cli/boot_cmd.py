"""`metaltune boot try | gate | status`: boot-time settings tried by a one-shot boot
(docs/boot-trials.md)."""
from __future__ import annotations

import json
from typing import Any, Optional

import typer

from tuner.cli.common import invoke, settings

boot_app = typer.Typer(help="Boot-time settings (kernel command line, driver options, BIOS) tried "
                            "by a one-shot boot and kept only after a gate.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(boot_app, name="boot")


def _plan(plan: list[dict[str, Any]]) -> None:
    for step in plan:
        if "write" in step:
            print(f"write {step['write']}:")
            for line in step["text"].rstrip("\n").splitlines():
                print(f"    {line}")
        elif "run" in step:
            print("run   " + " ".join(step["run"]))
        elif "rename" in step:
            print(f"rename {step['rename'][0]} -> {step['rename'][1]}")
        elif "remove" in step:
            print(f"remove {step['remove']}")
        elif "stage" in step:
            print(f"stage {step['stage']} = {step['value']!r} at the BMC")


@boot_app.command("try")
def try_cmd(
    ctx: typer.Context,
    changes: list[str] = typer.Argument(..., metavar="KNOB=VALUE...",
                                        help="e.g. boot.cmdline.iommu=pt (null removes a "
                                             "parameter), driver.nvidia.NVreg_X=1, bios.Attr=V."),
    loader: Optional[str] = typer.Option(None, "--loader", help="grub or systemd-boot "
                                                                  "(default: the host's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the entry and the commands; "
                                                          "write nothing."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Policy file (needs "
                                                                "allow_reboot_effect)."),
    workload: Optional[str] = typer.Option(None, "--workload", help="What the gate measures "
                                                                    "(default: sim or llama)."),
    repeats: int = typer.Option(6, "--repeats", help="Benchmark repeats before and after."),
    no_reboot: bool = typer.Option(False, "--no-reboot", help="Arm the entry; reboot yourself."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Arm a boot-time candidate for the next boot only (benchmark first), then reboot."""
    res = invoke(settings(ctx), "boot_try", changes=changes, loader=loader, dry_run=dry_run,
                 policy=policy, workload=workload, repeats=repeats, reboot=not no_reboot)
    if as_json:
        print(json.dumps(res, indent=1, default=str))
        return
    print(f"{res['loader']}: trial entry {res['entry']} (default now: {res['default'] or 'first entry'})")
    print(f"options: {res['options']}")
    if res.get("baseline") is not None:
        print(f"benchmark before the reboot: {res['baseline']:g} {res.get('unit', '')}")
    _plan(res.get("plan") or [])
    print(res["result"])


@boot_app.command("gate")
def gate_cmd(
    ctx: typer.Context,
    probation: Optional[float] = typer.Option(None, "--probation", help="Seconds of health "
                                                                        "watching (default 60)."),
    workload: Optional[str] = typer.Option(None, "--workload", help="What the gate measures."),
    repeats: int = typer.Option(6, "--repeats", help="Benchmark repeats."),
    no_reboot: bool = typer.Option(False, "--no-reboot", help="After a demotion, do not reboot."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Decide the open boot trial for this boot (the daemon runs this at every start)."""
    res = invoke(settings(ctx), "boot_gate", probation=probation, workload=workload,
                 repeats=repeats, reboot=not no_reboot, local=True)
    if as_json:
        print(json.dumps(res, indent=1, default=str))
        return
    if res["trial"] is None:
        print(res["reason"])
        return
    print(f"boot trial #{res['trial']}: {res['state']}: {res['reason']}"
          + (f"; {res['next']}" if res.get("next") else ""))
    b = res.get("boot_search")
    if b and b["boot_search"] == "armed":
        print(f"boot-time search: trial #{b['trial']} armed with {json.dumps(b['candidate'])} "
              f"({b['reboots_left']} reboots left after this one); {b['result']}")
    elif b:
        print(b["reason"])


@boot_app.command("status")
def status_cmd(
    ctx: typer.Context,
    limit: int = typer.Option(10, "--limit", min=0, help="Trials to list."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The boot loader's state (default, armed one-shot, entries) and the last boot trials."""
    res = invoke(settings(ctx), "boot_status", limit=limit)
    if as_json:
        print(json.dumps(res, indent=1, default=str))
        return
    lo = res["loader"]
    if lo.get("loader"):
        armed = lo.get("next_entry") or lo.get("oneshot")
        print(f"{lo['loader']}: default {lo['default'] or 'first entry'}; armed for the next boot: "
              f"{armed or 'nothing'}")
    else:
        print(f"boot loader: {lo.get('error')}")
    if not res["trials"]:
        print("no boot trials")
    for t in res["trials"]:
        b = (t.get("result") or {}).get("benchmark")
        nums = f" ({b['baseline']:g} -> {b['after']:g} {b['unit']})" if b else ""
        print(f"#{t['id']} {t['state']}: {t['entry']} {json.dumps(t['changes'])}{nums}: "
              f"{t['reason']}")
