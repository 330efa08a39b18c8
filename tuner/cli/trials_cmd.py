"""`metaltune trials`: list the trial store."""
from __future__ import annotations

import json
from typing import Optional

import typer

from tuner.cli.common import invoke, settings
from tuner.cli.tables import csv_option
from tuner.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("trials")
    def trials_cmd(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        limit: int = typer.Option(50, "--limit", help="Newest N trials (0: all)."),
        run_id: Optional[str] = typer.Option(None, "--run", help="Only this run."),
        verdict: Optional[str] = typer.Option(None, "--verdict", help="kept|reverted|rejected|rolled_back"),
        show_stats: bool = typer.Option(False, "--stats", help="Per proposer: outcome shares, spend per kept change, gain over time; also a PNG chart when matplotlib (the reports extra) is installed."),
        chart: Optional[str] = typer.Option(None, "--chart", help="Write a PNG chart here (needs the reports extra): tokens/s against tokens/J, one point a trial; with --stats the outcome and gain charts (default STATE_DIR/reports/trials-<run|all>.png)."),
        as_csv: bool = csv_option(),
        wide: bool = typer.Option(False, "--wide", help="Every column in full (long lines); by default the candidate column is cut to fit the terminal."),
    ) -> None:
        """List evaluated trials: candidate, verdict, reason code, gain. With --stats: how each
        proposer's trials ended (guard, incorrect by rule, too_fast, timeout, lost, kept, ...),
        tokens and dollars per kept change and the gain over time, as a table and a chart."""

        if show_stats:
            return _stats(ctx, run_id, chart, as_json)
        if chart is not None:
            return _tradeoff(ctx, run_id, chart, as_json)

        if limit < 0:
            raise BadInput("--limit: expected a number ≥ 0")
        if verdict and verdict not in ("kept", "reverted", "rejected", "rolled_back"):
            raise BadInput(f"--verdict: expected kept, reverted, rejected or rolled_back, got {verdict!r}")
        res = invoke(settings(ctx), "trials", limit=limit or None, run_id=run_id, verdict=verdict)
        if as_json:
            print(json.dumps(res, indent=2))
            return
        from tuner.cli import trials_view
        from tuner.cli.tables import print_table

        cols, rows = trials_view.rows(res)
        if as_csv:
            return print_table(cols, rows, as_csv=True)
        trials_view.print_rows(cols, rows, f"trials ({res['store']})", wide)


def _tradeoff(ctx: typer.Context, run_id: Optional[str], chart: str, as_json: bool) -> None:
    from pathlib import Path

    from tuner.cli import trials_view

    res = invoke(settings(ctx), "trials", limit=None, run_id=run_id, verdict=None)
    points = trials_view.tradeoff_points(res)
    if not points:
        raise BadInput(f"--chart: no trial {'of run ' + run_id + ' ' if run_id else ''}measured "
                       "both tokens/s and tokens/J (an energy measurement is needed)")
    out = Path(chart)
    try:
        trials_view.tradeoff_chart(points, out, f"tokens/s against tokens/J ({'run ' + run_id if run_id else 'all runs'})",
                                   starts=trials_view.run_starts(res))
    except OSError as e:
        raise BadInput(f"--chart {out}: cannot write ({e.strerror or e})") from None
    if as_json:
        print(json.dumps({"chart": str(out), "points": points,
                          "starts": trials_view.run_starts(res)}, indent=2))
    else:
        print(f"chart -> {out} ({len(points)} trials)")


def _stats(ctx: typer.Context, run_id: Optional[str], chart: Optional[str], as_json: bool) -> None:
    from pathlib import Path

    from tuner.search import trial_stats

    s = settings(ctx)
    res = invoke(s, "trial_stats", run_id=run_id)
    res["chart"] = None
    if res["proposers"]:  # drawn here, by the caller: the daemon writes no file for a reader
        out = Path(chart) if chart else Path(s.state_dir) / "reports" / f"trials-{run_id or 'all'}.png"
        try:
            res["chart"] = str(trial_stats.chart(res["proposers"], out,
                                                 title=f"run {run_id}" if run_id else "all runs"))
        except ImportError as e:  # only an asked-for chart needs the reports extra
            if chart is not None:
                raise
            res["chart_skipped"] = (f"no chart: matplotlib does not import ({e}): "
                                    "pip install 'metaltune[reports]' for the PNG")
        except OSError as e:
            raise BadInput(f"--chart {out}: cannot write ({e.strerror or e})") from None
    if as_json:
        print(json.dumps(res, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"trials by outcome ({'run ' + run_id if run_id else 'all runs'})")
    for col in ("proposer", "outcome", "trials", "share"):
        t.add_column(col, justify="right" if col in ("trials", "share") else "left")
    for name, p in res["proposers"].items():
        for cat, n in p["counts"].items():
            t.add_row(name, cat, str(n), f"{p['shares'][cat]:.1%}")
        t.add_row(name, "[bold]all[/]", f"[bold]{p['trials']}[/]", "100.0%", end_section=True)
    con.print(t)
    s = Table(title="spend and gain")
    for col in ("proposer", "kept", "tokens", "tokens/kept", "$", "$/kept", "best gain"):
        s.add_column(col, justify="left" if col == "proposer" else "right")
    for name, p in res["proposers"].items():
        s.add_row(name, str(p["kept"]), f"{p['tokens']:.0f}",
                  f"{p['tokens_per_kept']:.0f}" if p["tokens_per_kept"] else "-",
                  f"{p['usd']:.4f}" if p["usd"] is not None else "-",
                  f"{p['usd_per_kept']:.4f}" if p["usd_per_kept"] else "-",
                  f"{p['best_gain']:+.1%}")
    con.print(s)
    if res["chart"]:
        con.print(f"chart -> {res['chart']}")
    elif res.get("chart_skipped"):
        print(res["chart_skipped"])  # plain: rich would read [reports] as markup

