"""`metaltune kernel check` and `metaltune search kernel` through the real CLI entry point."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RED = Path(__file__).parent / "redteam"


def cli(*args, state):
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(state), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_check_accepts_honest_json(tmp_path):
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--device", "cpu", "--json", state=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["verdict"], d["code"], d["stage"]) == ("accepted", "accepted", "timing")
    assert d["timings"] and all(t["median_us"] > 0 for t in d["timings"].values())
    # a CPU verdict says so, and lists what it checked, left to the GPU and timed
    assert d["device"] == "cpu-interpreter" and "toy shape" in d["summary"]["timing"]
    assert [257, 17] in d["checked_shapes"] and [3, 8193] in d["checked_shapes"]
    assert [65537, 17] in d["skipped_shapes"] and d["timed_shapes"] == [[3, 17]]


def test_check_times_at_the_shape_asked_for(tmp_path):
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--device", "cpu", "--shape", "4x40", "--dtype", "float32", "--json", state=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["timed_shapes"] == [[4, 40]] and list(d["timings"]) == ["4x40:float32"]
    assert [4, 40] in d["checked_shapes"]


def test_check_rejects_with_reason_code_and_exit_1(tmp_path):
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "torch_op.py"),
            "--device", "cpu", "--json", state=tmp_path)
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert (d["code"], d["rule"], d["stage"]) == ("guard_failed", "torch_compute", "guard")


def test_bad_input_exit_2_and_one_clear_line(tmp_path):
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(tmp_path / "none.py"),
            state=tmp_path)
    assert p.returncode == 2 and "--candidate" in p.stderr and "no such file" in p.stderr
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--config", "[1]", state=tmp_path)
    assert p.returncode == 2 and "--config" in p.stderr
    p = cli("search", "kernel", "--family", "conv", state=tmp_path)
    assert p.returncode == 2 and "unknown kernel family" in p.stderr
    p = cli("search", "kernel", "--family", "softmax", "--shape", "3x", "--device", "cpu",
            state=tmp_path)
    assert p.returncode == 2 and "rowsxcols" in p.stderr


def test_cli_start_does_not_import_torch():
    code = ("import sys; import tuner.cli; assert 'torch' not in sys.modules and "
            "'triton' not in sys.modules, [m for m in sys.modules if m.startswith(('torch', 'triton'))][:3]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_search_kernel_runs_and_writes_a_table(tmp_path):
    table = tmp_path / "t.json"
    p = cli("search", "kernel", "--family", "swiglu", "--budget", "2", "--proposer", "random",
            "--device", "cpu", "--shape", "3x17", "--table", str(table), "--json", state=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["buckets"][0]["evaluations"] == 2 and d["buckets"][0]["best"]
    assert json.loads(table.read_text())["version"] == 1
    p = cli("trials", "--json", state=tmp_path)
    if p.returncode == 0:  # the trials command (another issue) lists the search's trials
        assert "swiglu" in p.stdout
