"""Any exception from a candidate is a trial verdict (issue 33, item 10): a stored source the
judge accepted that raises on an input it meets only in the model (a rank the judge did not
draw before issue 33; here a width) makes the model process answer with a ValueError. Through
the real CLI (its judge stubbed to accept the source), `search mixed` records the trial as
rejected (`measure_failed`, naming the exception) and ends normally; it used to end in that
ValueError's traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.search.test_mixed_model_process import GOOD, _table
from tests.search.test_mixed_search import POLICY
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host

# raises in the model process (the simulated Llama's calls are [rows, 64]), as a kernel does
# on an input the judge never sent it
RAISES = GOOD["source"].replace("    n_cols = x.shape[-1]\n", "    n_cols = x.shape[-1]\n"
                                "    if n_cols == 64:\n"
                                "        raise ValueError(\"this kernel takes no 64 columns\")\n")

# the CLI with the judge's verdict on every choice forced to "accepted" (the judge that let
# such a source through; it judges in its own child, so it is stubbed here, in the search)
WRAPPER = """
import runpy, sys
from tuner.search.mixed import evaluator
evaluator.MixedEvaluator.judge = lambda self, k, shape, dtype: {
    "code": "accepted", "stage": "timing", "checks": ["judge stubbed by the test"]}
sys.argv = ["metaltune"] + sys.argv[1:]
runpy.run_module("tuner", run_name="__main__", alter_sys=True)
"""


def test_a_candidate_raising_in_the_model_process_is_a_rejected_trial(tmp_path):
    from kernelsearch.store import SourceStore, environment
    from tuner.search.store import TrialStore

    state = tmp_path / "state"
    sha = SourceStore(state / "kernels" / "sources").put(
        "rmsnorm", RAISES, GOOD["config"], {"verdict": "accepted", "code": "accepted"},
        env=environment("cpu")).sha256
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_STATE_DIR": str(state),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("METALTUNE_BACKEND", None)
    r = subprocess.run(
        [sys.executable, "-c", WRAPPER, "--sim-root", str(root), "search", "mixed", "--knob",
         "none", "--family", "rmsnorm", "--no-runtime", "--budget", "1", "--max-choices", "2",
         "--policy", POLICY, "--json",
         "--suggest-table", _table(tmp_path / "suggest.json", sha, GOOD["config"])],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    res = json.loads(r.stdout)
    with TrialStore.in_state_dir(state) as st:
        (trial,) = st.list(run_id=res["run_id"])
    assert (trial.verdict, trial.reason) == ("rejected", "measure_failed"), trial.gates
    assert RAISES != GOOD["source"]
    assert any("ValueError" in (g.detail or "") and "no 64 columns" in (g.detail or "")
               for g in trial.gates), trial.gates
