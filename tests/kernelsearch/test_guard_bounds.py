"""Sources the guard must refuse before it parses them, through the real CLI (issue 33, items
8 and 9): a 1000-deep attribute chain or 100,000 unary minus signs get a guard verdict with a
named rule from `metaltune kernel check`, never a RecursionError or MemoryError traceback; a
Gluon candidate that also breaks the guard gets the guard's verdict on a CPU, as the judge
would give it, not only "needs an sm_90 GPU"."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelsearch.harness import guard

ROOT = Path(__file__).resolve().parents[2]
HONEST = (Path(__file__).parent / "redteam" / "honest.py").read_text()

DEEP = {
    # ~2 KB: forward reads a 1000-deep attribute chain
    "attribute_chain": HONEST + "\n\ndef _unused(x):\n    return x" + ".T" * 1000 + "\n",
    "unary_minus": HONEST + "\n\nSCALE = " + "-" * 100_000 + "1\n",
    "binary_chain": HONEST + "\n\nSCALE = " + "+".join(["1"] * 20_000) + "\n",
    "brackets": HONEST + "\n\nSCALE = " + "(" * 150 + "1" + ")" * 150 + "\n",
}


def _cli(*args: str, state: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1",
               KERNELSEARCH_SANDBOX_USER="none")
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(state), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("kind", ["attribute_chain", "unary_minus"])
def test_kernel_check_of_a_deep_source_prints_a_guard_verdict(tmp_path, kind):
    cand = tmp_path / "deep.py"
    cand.write_text(DEEP[kind])
    assert kind != "attribute_chain" or len(cand.read_bytes()) < 4096
    p = _cli("kernel", "check", "--family", "softmax", "--candidate", str(cand), "--device",
             "cpu", "--json", state=tmp_path / "st")
    assert "Traceback" not in p.stderr and "RecursionError" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 1, (p.stdout, p.stderr[-2000:])
    d = json.loads(p.stdout)
    assert (d["verdict"], d["stage"], d["code"], d["rule"]) == \
        ("rejected", "guard", "guard_failed", "nesting_too_deep"), d
    # and the plain output names the rule too
    p = _cli("kernel", "check", "--family", "softmax", "--candidate", str(cand), "--device",
             "cpu", state=tmp_path / "st")
    assert p.returncode == 1 and "rule=nesting_too_deep" in p.stdout and not p.stderr.strip()


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_the_guard_refuses_deep_sources_by_a_named_rule(kind):
    (v,) = guard.check_source(DEEP[kind])
    assert v.rule == "nesting_too_deep" and "[guard:nesting_too_deep]" in str(v)
    assert guard.uses_gluon(DEEP[kind]) is False


def test_the_guard_refuses_a_source_too_large_and_passes_every_shipped_one():
    from kernelsearch.harness import guard_bounds

    (v,) = guard.check_source(HONEST + "#" * guard_bounds.MAX_SOURCE)
    assert v.rule == "source_too_large"
    shipped = [p for p in (ROOT / "kernelsearch" / "families").rglob("*.py")
               if p.name != "__init__.py" and "def forward" in p.read_text()]
    assert len(shipped) > 20
    for p in shipped:
        guard_bounds.parse(p.read_text())  # no shipped variant is near a bound


def test_kernel_check_of_a_gluon_candidate_that_breaks_the_guard_gives_the_guard_verdict(
        tmp_path):
    src = (ROOT / "kernelsearch/families/mla_decode/gluon_pingpong.py").read_text()
    cand = tmp_path / "gluon_bad.py"
    cand.write_text(src + "\n\nimport os\n")
    p = _cli("kernel", "check", "--family", "mla_decode", "--candidate", str(cand), "--device",
             "cpu", "--json", state=tmp_path / "st")
    assert p.returncode == 1, (p.stdout, p.stderr[-2000:])
    d = json.loads(p.stdout)
    assert (d["stage"], d["code"], d["rule"]) == ("guard", "guard_failed", "import"), d
    # the judge says the same of it
    from kernelsearch.harness.judge import guard_stage

    v = guard_stage(cand.read_text())
    assert (v.code, v.rule) == (d["code"], d["rule"])


def test_a_deep_stored_source_in_search_mixed_is_a_rejected_trial_not_an_abort(tmp_path):
    """The suggested table of `metaltune search mixed` names a stored source with a 1000-deep
    attribute chain (put in the store as if accepted): the search ends normally, its trial
    rejected by the guard's named rule."""
    from kernelsearch.store import SourceStore, environment
    from tests.search.test_mixed_model_process import GOOD, _table
    from tests.search.test_mixed_search import POLICY
    from tuner.search.store import TrialStore
    from tuner.sim.hostinit import init_host

    state = tmp_path / "state"
    deep = GOOD["source"] + "\n\ndef _unused(x):\n    return x" + ".T" * 1000 + "\n"
    sha = SourceStore(state / "kernels" / "sources").put(
        "rmsnorm", deep, GOOD["config"], {"verdict": "accepted", "code": "accepted"},
        env=environment("cpu")).sha256
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METALTUNE_STATE_DIR": str(state),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("METALTUNE_BACKEND", None)
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "--sim-root", str(root), "search", "mixed", "--knob",
         "none", "--family", "rmsnorm", "--no-runtime", "--budget", "1", "--max-choices", "2",
         "--policy", POLICY, "--json",
         "--suggest-table", _table(tmp_path / "suggest.json", sha, GOOD["config"])],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    res = json.loads(r.stdout)
    with TrialStore.in_state_dir(state) as st:
        (trial,) = st.list(run_id=res["run_id"])
    assert (trial.verdict, trial.reason) == ("rejected", "guard_failed"), trial.gates
    assert any("nesting_too_deep" in (g.detail or "") for g in trial.gates), trial.gates
