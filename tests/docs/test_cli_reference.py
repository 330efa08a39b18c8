"""docs/cli.md is the program's own help: regenerated from the typer app, it equals the committed
page, so an option added, renamed or re-described without regenerating the page fails here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_cli_reference_is_the_generated_one():
    r = subprocess.run([sys.executable, "-m", "tuner.cli.reference"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    committed = (ROOT / "docs/cli.md").read_text()
    assert r.stdout == committed, (
        "docs/cli.md is stale: run `python -m tuner.cli.reference > docs/cli.md`")


def test_the_reference_names_every_command():
    from tuner.cli import app
    import typer

    page = (ROOT / "docs/cli.md").read_text()
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        assert f"## `metaltune {name}`" in page
        for sub in getattr(cmd, "commands", {}):
            assert f"### `metaltune {name} {sub}`" in page
