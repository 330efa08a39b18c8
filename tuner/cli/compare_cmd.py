"""`metaltune compare TARGET... [--report DIR] [--json]`: the same benchmark suite on each target
(local, ssh://user@host[:port], sim://DIR), side by side with ratios and confidence intervals."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.numbers import finite
from tuner.errors import BadInput, OperationFailed


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        targets: list[str] = typer.Argument(..., help="local, ssh://user@host[:port][?python=PY&cwd=DIR&sim=DIR], sim://DIR"),
        report: Optional[Path] = typer.Option(None, "--report", help="Write report.{json,md,html} and PNG charts here."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        as_csv: bool = typer.Option(False, "--csv", help="Print the metrics table as CSV (a header row, then one metric per line; the host facts are in --json)."),
        repeats: int = typer.Option(7, "--repeats", min=2, help="Repeats per metric (the spread needs 2+)."),
        quick: bool = typer.Option(False, "--quick", help="Small sizes: a smoke run, not numbers to quote."),
        only: Optional[str] = typer.Option(None, "--only", help="Comma-separated metric names ('serving': the --serving rows alone)."),
        serving: Optional[str] = typer.Option(None, "--serving", help="Also measure a serving engine on each target: vllm:<serve.toml|yaml> or vllm:model=DIR[,key=value...] (docs/serving.md)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Noise seed for simulated hosts (reproducible runs)."),
        identity: Optional[Path] = typer.Option(None, "--identity", "-i", help="SSH private key file."),
        known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)."),
        trust_new: bool = typer.Option(False, "--trust-new", help="Trust an unknown SSH host key on first use and record it."),
        timeout: float = typer.Option(900.0, "--timeout", callback=finite(1, 86400), help="Seconds per target."),
        confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.999, callback=finite(0.5, 0.999),
                                          help="Confidence level of each comparison's interval."),
    ) -> None:
        """Run the benchmark suite on each TARGET and compare them (the first is the baseline)."""
        from tuner.compare import report as rep_mod
        from tuner.compare import suite, targets as tmod

        parsed = [tmod.parse(t) for t in targets]
        labels = [t.label for t in parsed]
        if len(set(labels)) != len(labels):
            raise BadInput(f"TARGET: each target must be different, got {labels}")
        only_l = [s.strip() for s in only.split(",") if s.strip()] if only else None
        bad = sorted(set(only_l or []) - set(suite.METRICS) - ({"serving"} if serving else set()))
        if bad:
            raise BadInput(f"--only: unknown metric(s) {bad}; expected some of {list(suite.METRICS)}")
        serving_args = None
        if serving is not None:
            from tuner.workloads.serving.config import load

            name, _, serving_args = serving.partition(":")
            if name != "vllm":
                raise BadInput(f"--serving: expected vllm:<config>, got {serving!r}")
            load(serving_args)  # BadInput (exit 2, one line) before any target runs
        args = tmod.child_args(repeats, quick, only_l, seed, serving_args)
        ssh_opts = {"key": identity, "known_hosts": known_hosts, "trust_new": trust_new}
        results, ok_labels, failures = [], [], []
        for t in parsed:
            print(f"compare: running the suite on {t.label} ...", file=sys.stderr, flush=True)
            try:
                results.append(tmod.run(t, args, timeout, ssh_opts))
                ok_labels.append(t.label)
            except OperationFailed as e:  # includes SSH errors: report, keep the others
                failures.append({"target": t.label, "error": str(e), "kind": getattr(e, "kind", "failed")})
                print(f"compare: {e}", file=sys.stderr)
        if not results:
            raise OperationFailed("no target could be measured: " + "; ".join(f["error"] for f in failures))
        doc = rep_mod.build(results, ok_labels, confidence)
        doc["failed_targets"] = failures
        if report is not None:
            files = rep_mod.write(doc, results, report)
            print("compare: wrote " + ", ".join(str(p) for p in files.values()), file=sys.stderr)
        if as_json:
            json.dump(doc, sys.stdout, indent=1, default=str)
            sys.stdout.write("\n")
        elif as_csv:
            _csv(doc)
        else:
            _table(doc)
        if failures:
            raise typer.Exit(1)


def _csv(doc: dict) -> None:
    from tuner.cli.tables import print_table
    from tuner.compare.report import _cell, _cmp_cell

    labels = doc["targets"]
    cols = ["metric", "unit", *labels, *[f"ratio {lab} [CI]" for lab in labels[1:]]]
    rows = [[m["name"], m["unit"], *[_cell(x) for x in m["targets"]],
             *[_cmp_cell(c) for c in m["comparisons"]]] for m in doc["metrics"]]
    print_table(cols, rows, as_csv=True)


def _table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from tuner.compare.report import _cell, _cmp_cell, _fmt

    labels = doc["targets"]
    t = Table(title=f"metaltune compare (baseline {doc['baseline']})")
    t.add_column("metric")
    t.add_column("unit")
    for lab in labels:
        t.add_column(lab)
    for lab in labels[1:]:
        t.add_column(f"ratio {lab} [CI]")
    for m in doc["metrics"]:
        t.add_row(m["name"], m["unit"] + (" ↑" if m["higher_is_better"] else " ↓"),
                  *[_cell(x) for x in m["targets"]], *[_cmp_cell(c) for c in m["comparisons"]])
    import shutil

    c = Console(width=max(shutil.get_terminal_size((180, 24)).columns, 160))
    c.print(t)
    f = Table(title="host facts")
    f.add_column("fact")
    for lab in labels:
        f.add_column(lab)
    for row in doc["facts"]:
        style = "bold yellow" if row["differs"] else None
        f.add_row(row["fact"], *[_fmt(v) for v in row["values"]], style=style)
    c.print(f)
    for fl in doc.get("failed_targets", []):
        c.print(f"[red]failed[/red] {fl['target']}: {fl['error']}")
