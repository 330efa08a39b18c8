"""One bad record in the kernel store (a wrong field type, 100,000-deep nesting) no longer breaks
`kernel list` and `kernel show` for every kernel: it is skipped and named; an unsafe store (mode
0777 under root) is named with exit 1, never shown as an empty list. Through the real CLI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelsearch.store import SourceStore

ROOT = Path(__file__).resolve().parents[2]
GOOD = "def forward(x):\n    return x\n"
ACCEPTED = {"verdict": "accepted", "code": "accepted", "checks": ["guard"]}
ENV = {"gpu": "cpu (triton interpreter)", "driver": "", "torch": "t", "triton": "t"}


def cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(state), "kernel",
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def state(tmp_path):
    st = SourceStore(tmp_path / "kernels" / "sources")
    good = st.put("softmax", GOOD, {}, ACCEPTED, env=ENV)
    typed = st.put("softmax", GOOD + "# 2\n", {}, ACCEPTED, env=ENV)
    deep = st.put("softmax", GOOD + "# 3\n", {}, ACCEPTED, env=ENV)
    p = st.root / f"{typed.sha256}.json"
    p.write_text(json.dumps(dict(json.loads(p.read_text()), env="x")))
    (st.root / f"{deep.sha256}.json").write_text("[" * 100_000 + "]" * 100_000)
    return tmp_path, good.sha256, typed.sha256, deep.sha256


def test_bad_records_are_skipped_and_named(state):
    d, good, typed, deep = state
    p = cli(d, "list", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["sha256"] for r in out["kernels"]] == [good]
    why = {Path(u["file"]).stem: u["error"] for u in out["unreadable"]}
    assert set(why) == {typed, deep}
    assert "field env: expected a dict, got str" in why[typed]
    assert "nested too deeply" in why[deep]
    assert "Traceback" not in p.stderr and p.stderr.count("skipped unreadable record") == 2
    p = cli(d, "list")  # the table form too
    assert p.returncode == 0 and "softmax" in p.stdout and "Traceback" not in p.stderr
    p = cli(d, "show", good[:12])
    assert p.returncode == 0 and f"src:{good}" in p.stdout, p.stderr
    p = cli(d, "show", typed[:12])
    assert p.returncode == 1 and "field env" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a root process refuses a writable store")
def test_an_unsafe_store_is_named_not_empty(state):
    d = state[0]
    (d / "kernels" / "sources").chmod(0o777)
    for args in (("list",), ("list", "--json"), ("show", state[1][:12])):
        p = cli(d, *args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "unsafe" in p.stderr and "group/world-writable" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""
