"""benchmarks/bench_mla_ablate.py --kernels FILE:KEY=INT (how the GPU session times the seesaw's
variants): a malformed entry is one line and exit 2 before anything is imported or written."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_mla_ablate.py"
SEESAW = "benchmarks/experiments/gluon_seesaw.py"


@pytest.mark.parametrize("kernels", [f"{SEESAW}:LEAN", f"{SEESAW}:LEAN=x", "no/such.py",
                                     f"{SEESAW}:LEAN=0:=1"])
def test_a_malformed_kernels_entry_is_one_line_and_exit_2(tmp_path, kernels):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(BENCH), "--out", str(out), "--kernels", kernels],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"--kernels {kernels}: expected FILE or FILE:KEY=INT" in last
    assert "Traceback" not in r.stderr and not out.exists()
