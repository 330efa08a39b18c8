"""The user's own benchmark command as a workload: real subprocesses."""
import sys
import textwrap
import time

import pytest

from tuner.errors import BadInput, WorkloadFailed, WorkloadHang
from tuner.search.keep import decide_sizes
from tuner.workloads.command import CommandWorkload

BENCH = textwrap.dedent("""
    import json, os, sys
    rt = json.loads(os.environ["METALTUNE_RUNTIME"])
    slow = 0.5 if rt.get("cuda_graphs") is False else 1.0
    for ctx, tps in ((4096, 900.0), (32768, 500.0)):
        print(f"ctx={ctx} decode {tps * slow:.1f} tok/s")
    print("argv", sys.argv[1:])
""")


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "bench.py"
    p.write_text(BENCH)
    return p


def test_per_size_metrics_and_runtime_reach_the_command(script):
    wl = CommandWorkload([sys.executable, str(script), "--graphs={cuda_graphs}", "{untouched}"],
                         r"ctx=(?P<size>\d+) decode (?P<value>[\d.]+) tok/s", timeout_s=30, unit="tok/s")
    wl.configure({"cuda_graphs": True})
    on = wl.measure(repeats=2)
    assert on.per_size == {"4096": 900.0, "32768": 500.0}
    assert on.extra["command"][-2:] == ["--graphs={cuda_graphs}", "{untouched}"]
    assert wl._argv()[-2:] == ["--graphs=true", "{untouched}"]
    wl.configure({"cuda_graphs": False})
    off = wl.measure(repeats=2)
    assert off.per_size == {"4096": 450.0, "32768": 250.0}
    assert decide_sizes([on], [off])[:2] == ("reverted", "size_regressed")


def test_single_metric_last_match_and_lower_is_better(tmp_path):
    p = tmp_path / "lat.py"
    p.write_text("print('p50 latency: 9.0 ms')\nprint('p50 latency: 4.0 ms')\n")
    wl = CommandWorkload(f"{sys.executable} {p}", r"p50 latency: ([\d.]+) ms", unit="ms",
                         lower_is_better=True)
    m = wl.measure(repeats=1)
    assert m.value == pytest.approx(0.25) and m.unit == "1/ms" and m.per_size == {}


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    p = tmp_path / "hang.py"
    p.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(c.pid))
        time.sleep(60)
    """))
    wl = CommandWorkload([sys.executable, str(p)], r"(\d+)", timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(WorkloadHang, match="timeout"):
        wl.measure(repeats=1)
    assert time.monotonic() - t0 < 10
    import os
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the benchmark's child process outlived the timeout")


def test_failures_are_clear(tmp_path):
    p = tmp_path / "bad.py"
    p.write_text("print('no metric here'); import sys; sys.exit(3)")
    with pytest.raises(WorkloadFailed, match="exited 3"):
        CommandWorkload([sys.executable, str(p)], r"(\d+) tok/s").measure(1)
    p.write_text("print('no metric here')")
    with pytest.raises(WorkloadFailed, match="matched nothing"):
        CommandWorkload([sys.executable, str(p)], r"(\d+) tok/s").measure(1)
    with pytest.raises(BadInput, match="invalid"):
        CommandWorkload("x", r"(")
    with pytest.raises(BadInput, match="group named 'value'"):
        CommandWorkload("x", r"(\d+) (\d+)")
    with pytest.raises(WorkloadFailed, match="cannot start"):
        CommandWorkload([str(tmp_path / "missing")], r"(\d+)").measure(1)
