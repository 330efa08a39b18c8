"""Usage errors through the real `metaltune` entry point (the console script a fresh install
gets), against the installed typer: one line on stderr, exit 2, never a traceback. typer vendors
its own click, so the same must hold where the `click` package is not installed at all."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "metaltune"

# (argv, what the one line must say): each kind of usage error on several commands
CASES = [
    (["status", "--bogus"], r"No such option: --bogus.*'metaltune status --help'"),
    (["bogus"], r"No such command 'bogus'.*'metaltune --help'"),
    (["profile", "bogus"], r"No such command 'bogus'.*'metaltune profile --help'"),
    (["apply"], r"Missing argument 'PROFILE'.*'metaltune apply --help'"),
    (["sim", "inject"], r"Missing argument 'DIR'"),
    (["kernel", "check", "--family", "softmax"], r"Missing option '--candidate'"),
    (["fleet", "apply", "p.yaml"], r"Missing option '--inventory'"),
    (["trials", "--limit", "x"], r"Invalid value for '--limit'.*valid integer"),
    (["search", "host", "--budget", "1.5"], r"Invalid value for '--budget'.*valid integer"),
    (["apply", "p.yaml", "--probation", "soon"], r"Invalid value for '--probation'.*valid number"),
    (["trials", "--limit"], r"Option '--limit' requires an argument"),
    (["status", "--json", "extra"], r"unexpected extra argument"),
]


def metaltune(args: list[str], tmp_path: Path, extra_path: str | None = None) -> subprocess.CompletedProcess[str]:
    assert ENTRY.exists(), f"{ENTRY}: the console script is missing (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)
    env["METALTUNE_STATE_DIR"] = str(tmp_path / "state")
    env["METALTUNE_RUN_DIR"] = str(tmp_path / "run")
    return subprocess.run([str(ENTRY), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)


def assert_one_line(r: subprocess.CompletedProcess[str], pattern: str, code: int = 2) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("metaltune: error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("args, pattern", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, pattern):
    assert_one_line(metaltune(args, tmp_path), pattern)
    assert not (tmp_path / "state").exists()        # nothing was created or changed


def test_a_group_without_its_command_prints_help_and_exits_2(tmp_path):
    r = metaltune(["fleet"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "apply" in r.stdout + r.stderr and "Usage" in r.stdout + r.stderr
    r = metaltune(["--help"], tmp_path)
    assert r.returncode == 0 and "Usage" in r.stdout


def test_typer_range_is_pinned_to_the_tested_version():
    """pyproject pins typer to a range whose lower end is the version these tests ran against."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"typer>=([0-9.]+),<([0-9.]+)"', text)
    assert m, "typer must be pinned with an upper bound in pyproject.toml"
    lo, hi = (tuple(int(x) for x in v.split(".")) for v in m.groups())
    have = tuple(int(x) for x in metadata.version("typer").split(".")[:3])
    assert lo <= have < hi, (lo, have, hi)


def _typer_needs_click() -> bool:
    reqs = metadata.requires("typer") or []
    return any(re.match(r"click\b", r) and "extra ==" not in r for r in reqs)


def test_no_module_imports_click_directly():
    """typer is the only command-line layer: code that imports click breaks where click is absent
    (typer no longer installs it) and catches exceptions typer never raises."""
    found = []
    for pkg in ("tuner", "safety", "kernelsearch", "host_profiles"):
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == "click" or n.startswith("click.") for n in names):
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_without_the_click_package_errors_still_end_in_one_line(tmp_path):
    """typer >= 0.29 vendors click and does not depend on it; a host without click (a fresh
    install where nothing else pulled it in) still gets one-line errors, safety errors included."""
    if _typer_needs_click():
        pytest.skip("this typer depends on click: the no-direct-import test covers it")
    block = tmp_path / "noclick"
    block.mkdir()
    (block / "click.py").write_text('raise ModuleNotFoundError("No module named \'click\'", name="click")\n')
    r = subprocess.run([sys.executable, "-c", "import click"], env={**os.environ, "PYTHONPATH": str(block)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "No module named 'click'" in r.stderr   # the block works
    for args, pattern in CASES[:4]:
        assert_one_line(metaltune(args, tmp_path, str(block)), pattern)
    # a safety error (a policy file that is not a policy) and a tuner error (a missing profile)
    bad = tmp_path / "policy.yaml"
    bad.write_text("- not\n- a mapping\n")
    sim = tmp_path / "sim"
    r = metaltune(["sim", "init", str(sim)], tmp_path, str(block))
    assert r.returncode == 0, r.stderr
    r = metaltune(["--backend", "sim", "--sim-root", str(sim), "apply", str(tmp_path / "p.yaml"),
                   "--policy", str(bad)], tmp_path, str(block))
    assert_one_line(r, r"p\.yaml|policy\.yaml")
    prof = tmp_path / "p.yaml"
    prof.write_text("name: p\nknobs:\n  gpu0.power_limit_w: 650\n")
    r = metaltune(["--backend", "sim", "--sim-root", str(sim), "apply", str(prof), "--probation", "0",
                   "--policy", str(bad)], tmp_path, str(block))
    assert_one_line(r, r"policy\.yaml")
