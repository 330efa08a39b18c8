"""`metaltune trials`: list the trial store."""
from __future__ import annotations

import json
from typing import Optional

import typer

from tuner.cli.common import invoke, settings
from tuner.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("trials")
    def trials_cmd(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        limit: int = typer.Option(50, "--limit", help="Newest N trials (0: all)."),
        run_id: Optional[str] = typer.Option(None, "--run", help="Only this run."),
        verdict: Optional[str] = typer.Option(None, "--verdict", help="kept|reverted|rejected|rolled_back"),
    ) -> None:
        """List evaluated trials: candidate, verdict, reason code, gain."""

        if limit < 0:
            raise BadInput("--limit: expected a number ≥ 0")
        if verdict and verdict not in ("kept", "reverted", "rejected", "rolled_back"):
            raise BadInput(f"--verdict: expected kept, reverted, rejected or rolled_back, got {verdict!r}")
        res = invoke(settings(ctx), "trials", limit=limit or None, run_id=run_id, verdict=verdict)
        if as_json:
            print(json.dumps(res, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"trials ({res['store']})")
        for col in ("#", "run", "verdict", "reason", "gain", "candidate"):
            t.add_column(col)
        for tr in res["trials"]:
            gain = f"{tr['gain']:+.2%}" if tr.get("gain") is not None else ""
            cand = tr["candidate"]
            desc = ", ".join(f"{k}={v}" for k, v in cand.get("knobs", {}).items())
            if cand.get("kernel"):
                k = cand["kernel"]
                desc = (desc + " " if desc else "") + f"kernel {k['family']}/{k.get('variant')} {k.get('config')}"
            if cand.get("runtime"):
                desc += f" runtime {cand['runtime']}"
            t.add_row(str(tr["number"]), tr["run_id"][-6:], tr["verdict"], tr["reason"], gain, desc)
        Console().print(t)
