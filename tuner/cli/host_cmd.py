"""`metaltune host [--json]`: detected hardware and every knob with its value, domain and effect,
including the PCIe Device Control fields. Read-only (the host is opened as a dry run)."""
from __future__ import annotations

import json

import typer

from tuner.cli.common import invoke, settings
from tuner.cli.tables import csv_option, print_table


def register(app: typer.Typer) -> None:
    @app.command("host")
    def host_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                 as_csv: bool = csv_option()) -> None:
        """Hardware (GPUs, driver, PCIe, virtualisation) and every knob; changes nothing."""

        res = invoke(settings(ctx), "host")
        from kernelsearch import libraries  # found here, not in the daemon: nothing imported

        res["libraries"] = [libraries.probe(n) for n in libraries.LIBRARIES]
        if as_json:
            print(json.dumps(res, indent=2, default=str))
            return
        from rich.console import Console

        import shutil

        rows = []
        for k in res["knobs"]:
            val = json.dumps(k["value"]) if k["value"] is not None else "?"
            if k.get("pending") is not None:
                val += f" (pending {json.dumps(k['pending'])})"
            rows.append([k["name"], val, k["domain_text"], k["effect"]])
        if as_csv:  # the knobs only: the hardware lines are not a table
            return print_table(["knob", "value", "domain", "effect"], rows, as_csv=True)
        hw = res["hardware"]
        c = Console(width=max(shutil.get_terminal_size((160, 24)).columns, 140))
        v = hw["virtualization"]
        c.print(f"[bold]backend[/] {hw['backend']}   [bold]driver[/] {hw['driver_version']}   "
                f"[bold]virtualisation[/] {'VM' if v['is_vm'] else 'bare metal'}"
                + (f" ({'; '.join(v['evidence'])})" if v["evidence"] else ""))
        for g in hw["gpus"]:
            c.print(f"gpu{g['index']}: {g['name']} {g.get('uuid') or ''} pci {g.get('pci_bus_id')} "
                    f"nvml-virt {g.get('virtualization_mode')}")
        for d in hw["pcie"]:
            dc = d.get("devctl")
            fields = (f"RlxdOrd{'+' if dc['RlxdOrd'] else '-'} MaxPayload {dc['MaxPayload']} "
                      f"MaxReadReq {dc['MaxReadReq']} (DevCtl {dc['raw']} at {dc['offset']})"
                      if dc else d.get("devctl_error", ""))
            c.print(f"pci {d['bdf']} {d['kind']} {d['vendor']}:{d['device']} "
                    f"link {d.get('current_link_speed', '?')} x{d.get('current_link_width', '?')}: {fields}")
        for e in hw["errors"]:
            c.print(f"[dim]note: {e}[/]")
        c.print("kernel libraries: " + "; ".join(
            f"{x['name']} {x['status']}" + (f" {x['version']}" if x.get("version") else "")
            for x in res["libraries"]))
        print_table(["knob", "value", "domain", "effect"], rows, title="knobs")
