"""Tables of knobs, as a person reads them (rich) or as a script reads them (`--csv`). Knob
names are never cut: users copy them into a policy, so the name column takes its full width and
the other columns wrap instead."""
from __future__ import annotations

import csv
import shutil
import sys
from typing import Any, Optional, Sequence

import typer

CSV_OPTION_HELP = "Print the table as CSV (a header row, then one row per line; no colours)."


def csv_option() -> Any:
    return typer.Option(False, "--csv", help=CSV_OPTION_HELP)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: Optional[str] = None,
                as_csv: bool = False, name_column: int = 0, fit: bool = False) -> None:
    """`rows`: cell texts (rich markup allowed; stripped for CSV); a cell may hold several lines
    (the name column is as wide as its longest line). `fit`: the terminal's width, however
    narrow, rather than at least 100 columns (the name column still whole)."""
    if as_csv:
        from rich.text import Text

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([Text.from_markup(str(c)).plain for c in r])
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    longest = max((len(line) for r in rows for line in str(r[name_column]).splitlines() or [""]),
                  default=4)
    for i, c in enumerate(columns):
        if i == name_column:
            t.add_column(c, no_wrap=True, min_width=max(longest, len(c)), overflow="ignore")
        else:
            t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(c) for c in r])
    # a pipe or a narrow terminal: rich would squeeze the columns; give it the room the names need
    term = shutil.get_terminal_size((160, 24)).columns
    width = max(term, longest + 20) if fit else max(term, 100, longest + 60)
    Console(width=width).print(t)
