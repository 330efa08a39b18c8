"""`metaltune diagnose`: where the holistic workload's time goes (compute, memory, launch)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.common import settings
from tuner.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose_cmd(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        model: Optional[str] = typer.Option(None, "--model", help="Preset: tiny, llama3-8b-4l, "
                                            "llama3-8b, llama3-70b-4l, or a transformers model "
                                            "hf:<config>[:layers=N] (default: tiny on CPU, "
                                            "llama3-8b-4l on a GPU)."),
        phase: str = typer.Option("decode", "--phase", help="decode or prefill."),
        batch: Optional[int] = typer.Option(None, "--batch", min=1, help="Batch size."),
        context: Optional[int] = typer.Option(None, "--ctx", min=1, help="Context length."),
        steps: int = typer.Option(5, "--steps", min=1, help="Profiled steps."),
        device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda if present)."),
        ceilings: Optional[Path] = typer.Option(None, "--ceilings", help="JSON with flops_per_s and "
                                                "bytes_per_s (or a facts baseline file); default: measure now."),
        chart: Optional[Path] = typer.Option(None, "--chart", help="Write the chart here "
                                             "(default: STATE_DIR/diagnose.png)."),
        no_chart: bool = typer.Option(False, "--no-chart", help="Do not draw the chart."),
        no_dispatch: bool = typer.Option(False, "--no-dispatch", help="Plain torch ops only."),
    ) -> None:
        """Profile the holistic workload and classify each operation: compute-bound,
        memory-bound (against measured ceilings) or launch overhead (gaps, tiny kernels)."""
        from tuner.workloads import diagnose as D
        from tuner.workloads.llama import PRESETS

        if phase not in ("decode", "prefill"):
            raise BadInput(f"--phase: expected decode or prefill, got {phase!r}")
        if device not in (None, "cpu", "cuda"):
            raise BadInput(f"--device: expected cpu or cuda, got {device!r}")
        import torch

        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev == "cuda" and not torch.cuda.is_available():
            raise BadInput("--device cuda: no CUDA device is visible")
        name = model or ("llama3-8b-4l" if dev == "cuda" else "tiny")
        if name.startswith("hf:"):
            from tuner.workloads.hf import parse_spec

            try:
                parse_spec(name)
            except ValueError as e:
                raise BadInput(str(e).replace("--workload", "--model")) from None
        elif name not in PRESETS:
            raise BadInput(f"--model: unknown preset {name!r}; expected one of {', '.join(PRESETS)}"
                           " or hf:<config>[:layers=N]")
        ceil = D.load_ceilings(ceilings) if ceilings else None
        d = D.diagnose(name, phase, batch, context, steps, dev, ceil, use_dispatch=not no_dispatch)
        if not no_chart:
            path = chart or settings(ctx).ensure_state_dir() / "diagnose.png"
            d["chart"] = str(D.chart(d, path))
        if as_json:
            print(json.dumps(d, indent=2, default=str))
            return
        from rich.console import Console
        from rich.table import Table

        con = Console()
        w = d["workload"]
        t = Table(title=f"{d['device']}: {w['phase']} batch {w['batch']} ctx {w['ctx']} "
                        f"({w['model']}, {w['dtype']})")
        for col in ("op", "shapes", "us/step", "share", "class", "TFLOP/s", "GB/s", "% FLOP", "% BW"):
            t.add_column(col, overflow="fold")
        for r in d["ops"]:
            t.add_row(r["op"].replace("aten::", ""), r["shapes"][:40], f"{r['time_us_per_step']:.1f}",
                      f"{r['share']:.0%}", r["class"], f"{r['tflops_per_s']:.2f}", f"{r['gb_per_s']:.1f}",
                      f"{r['flops_frac']:.0%}", f"{r['bytes_frac']:.0%}")
        con.print(t)
        c = d["ceilings"]
        con.print(f"ceilings: {c['flops_per_s'] / 1e12:.2f} TFLOP/s, {c['bytes_per_s'] / 1e9:.0f} GB/s "
                  f"({c['source']})")
        for f in d["findings"]:
            con.print(f"- {f}")
        if "chart" in d:
            con.print(f"chart: {d['chart']}")
