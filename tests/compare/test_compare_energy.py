"""`metaltune compare` has a `decode_tok_per_j` metric: on simulated hosts it follows the sim's
power model, so a host set for efficiency compares better per joule (and in the report charts)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mt(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_decode_tokens_per_joule_compares_an_efficient_host_with_a_stock_one(tmp_path):
    from tuner.sim.state import SimState

    for name in ("stock", "efficient"):
        r = mt("sim", "init", str(tmp_path / name), "--sku", "h200")
        assert r.returncode == 0, r.stderr
    with SimState(tmp_path / "efficient").edit() as st:  # what the energy search keeps (sim)
        st["gpus"][0].update(power_limit_mw=550_000, locked_gr=[1335, 1335])
    rep = tmp_path / "report"
    r = mt("compare", f"sim://{tmp_path / 'stock'}", f"sim://{tmp_path / 'efficient'}",
           "--seed", "3", "--report", str(rep), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {m["name"]: m for m in doc["metrics"]}
    tpj = by["decode_tok_per_j"]
    assert tpj["unit"] == "tok/J"
    c = tpj["comparisons"][0]
    assert c["low"] > 1.3 and c["verdict"].startswith("better"), c
    # throughput stays close: the efficient host is not simply slower
    assert by["decode_tok_s"]["comparisons"][0]["ratio"] > 0.95
    assert "decode_tok_per_j" in (rep / "report.md").read_text()
    assert (rep / "metrics.png").stat().st_size > 0
