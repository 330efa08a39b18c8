"""Command-line conventions a user of other Unix tools expects, checked over every command of the
real app: `--version`, flags shown as flags, positionals as NAME, help on every option, one meaning
per option name, and bad arguments refused before any progress bar is drawn."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest
import typer

from tests.simhelpers import REPO, run_cli
from tuner import __version__
from tuner.cli import app


def _commands():
    def walk(c, path):
        subs = getattr(c, "commands", None)
        if subs:
            for n, sub in sorted(subs.items()):
                yield from walk(sub, [*path, n])
        else:
            yield path, c

    return list(walk(typer.main.get_command(app), []))


COMMANDS = _commands()


def test_version(capsys):
    rc, out, _ = run_cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"metaltune {__version__}"


def test_every_option_and_argument_has_help():
    missing = [(" ".join(path), p.name) for path, c in COMMANDS for p in c.params
               if not (getattr(p, "help", None) or "").strip()]
    assert missing == []


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_help_shows_flags_as_flags_and_positionals_by_name(capsys, path):
    rc, out, err = run_cli(capsys, *path, "--help")
    assert rc == 0, err
    assert "<bool>" not in out, out
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage
    words = usage.split("[OPTIONS]", 1)[-1].split()
    assert all(w.strip("[].").isupper() for w in words), usage


def test_one_meaning_per_option_name():
    """`--repeats` is how often a measurement repeats, wherever it appears; A/B pairs per trial
    are `--rounds` (search host and search mixed alike)."""
    helps: dict[str, set[str]] = {}
    for path, c in COMMANDS:
        for p in c.params:
            for o in getattr(p, "opts", []):
                if o in ("--repeats", "--rounds"):
                    helps.setdefault(o, set()).add(f"{' '.join(path)}: {p.help}")
    assert helps["--repeats"] and all("A/B" not in h for h in helps["--repeats"]), helps
    assert all("A/B pairs" in h for h in helps["--rounds"]), helps
    assert any(h.startswith("search host:") for h in helps["--rounds"])


def _on_a_terminal(*args: str) -> tuple[int, str]:
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=REPO, stdin=slave,
                         stdout=slave, stderr=slave, close_fds=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    os.close(slave)
    buf = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    p.wait(timeout=60)
    os.close(master)
    return p.returncode, buf.decode(errors="replace")


@pytest.mark.parametrize("args, expect", [
    (["demo", "--trials", "3", "--proposer", "nope"], "--proposer: unknown proposer 'nope'; expected one of"),
    (["demo", "--trials", "3", "--workdir", "/etc/hostname"], "--workdir: /etc/hostname: expected a folder"),
])
def test_bad_arguments_are_refused_before_a_progress_bar(args, expect):
    rc, text = _on_a_terminal(*args)
    assert rc == 2, text
    assert expect in text and "━" not in text and "Traceback" not in text, text
    assert len([ln for ln in text.splitlines() if ln.strip()]) == 1, text
