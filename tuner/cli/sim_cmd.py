"""`metaltune sim init|inject|show`: create, disturb and inspect a simulated host folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from tuner.errors import BadInput

sim_app = typer.Typer(help="Simulated GPU hosts (tests, CI, the demo).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


@sim_app.command("init")
def init(
    root: Path = typer.Argument(..., metavar="DIR", help="Folder for the simulated host (new or empty)."),
    sku: str = typer.Option("h200", "--sku", help="h200 or rtx4090."),
    vm: bool = typer.Option(False, "--vm", help="A cloud VM: host settings read-only."),
    gpus: int = typer.Option(1, "--gpus", help="Number of GPUs (1..8)."),
    seed: int = typer.Option(0, "--seed", help="Seeds UUIDs, chip margins and measurement noise."),
    boot_loader: str = typer.Option("grub", "--boot-loader",
                                    help="grub or systemd-boot (the loader `boot try` uses)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create a simulated host in DIR."""
    from tuner.sim.hostinit import init_host

    if boot_loader not in ("grub", "systemd-boot"):
        raise BadInput(f"--boot-loader: expected grub or systemd-boot, got {boot_loader!r}")
    r = init_host(root, sku, vm=vm, gpus=gpus, seed=seed, boot_loader=boot_loader)
    info = json.loads((r / "host.json").read_text())
    if as_json:
        print(json.dumps({"root": str(r), **info}))
    else:
        print(f"simulated {info['marketing_name']} host x{gpus}{' (vm)' if vm else ''} in {r}")
        prof = {"h200": "h200", "rtx4090": "rtx4090"}.get(sku, sku)
        print(f"next: export METALTUNE_BACKEND=sim METALTUNE_SIM_ROOT={r.resolve()} (and "
              f"METALTUNE_STATE_DIR=DIR unless you are root), then `metaltune apply {prof} --dry-run`")


@sim_app.command("inject")
def inject(
    root: Path = typer.Argument(..., metavar="DIR", help="A simulated host folder."),
    event: str = typer.Argument(..., help="xid N, ecc-sbe [N], ecc-dbe [N], thermal, power-brake, "
                                          "hang, pcie-replay N, aer-correctable|aer-nonfatal|"
                                          "aer-fatal [N], busy [PID], idle, clear"),
    args: Optional[list[str]] = typer.Argument(None, help="The event's arguments, e.g. `xid 79`."),
    gpu: int = typer.Option(0, "--gpu", help="GPU index."),
) -> None:
    """Inject a hardware event into a simulated host (e.g. `xid 79`, `ecc-dbe`, `thermal`, `hang`)."""
    from tuner.sim.inject import inject as do_inject

    _require_host(root)
    r = do_inject(root, event, args or [], gpu=gpu)
    print(f"injected {r['event']}{' ' + str(r['count']) if r['count'] else ''} on gpu{r['gpu']} "
          f"({r['bdf']})")


@sim_app.command("reboot")
def reboot(
    root: Path = typer.Argument(..., metavar="DIR", help="A simulated host folder."),
    hang: bool = typer.Option(False, "--hang", help="The first boot hangs; the hardware watchdog "
                                                    "resets it."),
    panic: bool = typer.Option(False, "--panic", help="The first boot panics; panic= resets it."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Reboot a simulated host: the boot loader picks the entry (a one-shot first), a new boot ID,
    /proc/cmdline and module parameters from it, pending BIOS settings applied. Stop the daemon
    first, as on a real host."""
    from tuner.sim import boot

    _require_host(root)
    if hang and panic:
        raise BadInput("sim reboot: --hang and --panic exclude each other")
    if not (Path(root) / "proc/cmdline").exists():
        raise BadInput(f"{root}: this simulated host has no boot loader (a --vm host)")
    r = boot.reboot(root, "hang" if hang else "panic" if panic else None)
    if as_json:
        print(json.dumps(r))
        return
    for b in r["boots"]:
        print(f"booted {b['entry']}: {b['outcome']}"
              + (f" (reset by the {b['reset_by']})" if b.get("reset_by") else ""))
    print(f"cmdline: {r['cmdline']}")


@sim_app.command("show")
def show(
    root: Path = typer.Argument(..., help="A simulated host folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a simulated host's device state, sensors, counters and the model's view of it."""
    _require_host(root)
    data = _summary(root)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"[bold]{data['marketing_name']}[/] x{len(data['gpus'])} "
            f"{'VM (read-only host settings)' if data['vm'] else 'bare metal'} · seed {data['seed']} "
            f"· driver {data['driver']} · {data['root']}")
    t = Table("gpu", "settings", "last run", "counters / injected")
    for g in data["gpus"]:
        lr = g["last_run"]
        ecc = g["ecc"]["volatile"]
        t.add_row(
            f"{g['index']} {g['bdf']}",
            f"{g['power_limit_w']:g} W, clocks {g['locked_clocks_mhz']}, mem "
            f"{g['locked_mem_clocks_mhz']}, offsets {g['gpc_offset_mhz']}/{g['mem_offset_mhz']}",
            (f"{lr['clock_mhz']} MHz, {lr['power_w']} W, {lr['temp_c']} °C, {lr['regime']}"
             if lr else "-"),
            f"ecc {ecc['corrected']}/{ecc['uncorrected']}, replay {g['pcie_replay']}; "
            + (", ".join(k for k, v in g["injected"].items() if v) or "-"),
        )
    c.print(t)
    c.print(f"model (noise-free) throughput now: {data['true_throughput']:.1f} {data['unit']}; "
            f"events queued: {data['events']}")


def _require_host(root: Path) -> None:
    if not (Path(root) / "host.json").is_file():
        raise BadInput(f"{root}: not a simulated host (no host.json); "
                       f"create one with `metaltune sim init {root}`")


def _summary(root: Path) -> dict[str, Any]:
    from tuner.sim import model
    from tuner.sim.skus import get_sku
    from tuner.sim.state import SimState

    st = SimState(root)
    s = st.read()
    sku = get_sku(s["sku"])
    gpus = []
    for g in s["gpus"]:
        gpus.append({
            "index": g["index"], "uuid": g["uuid"], "bdf": g["bdf"],
            "power_limit_w": g["power_limit_mw"] / 1000, "locked_clocks_mhz": g["locked_gr"],
            "locked_mem_clocks_mhz": g["locked_mem"],
            "app_clocks_mhz": [g["app_gr"], g["app_mem"]] if g.get("app_gr") else None,
            "gpc_offset_mhz": g["gpc_offset"], "mem_offset_mhz": g["mem_offset"],
            "persistence_mode": g["persistence"], "ecc": g["ecc"], "remapped_rows": g["remapped"],
            "pcie_replay": g["pcie_replay"], "injected": g.get("injected", {}),
            "last_run": g.get("last_run"), "model_now": model.evaluate(sku, g).__dict__,
        })
    events = len(st.read_events(0))
    return {"root": str(Path(root).resolve()), "sku": sku.name, "marketing_name": sku.marketing_name,
            "vm": s["vm"], "seed": s["seed"], "driver": s["driver"], "gpus": gpus,
            "true_throughput": model.true_throughput(s), "unit": sku.unit, "events": events,
            "measurements": s.get("counter", 0)}
