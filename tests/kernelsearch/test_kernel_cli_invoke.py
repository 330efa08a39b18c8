"""`metaltune search kernel` runs the "search_kernel" operation through the shared invoke path
(tuner.cli.common.invoke): to the daemon when one runs, else in this process, its arguments
checked by the operation's options model either way, the objective with them."""
from __future__ import annotations

import json
import re

import pytest

from tests.simhelpers import run_cli


@pytest.mark.usefixtures("cli_env")
def test_search_kernel_asks_the_daemon_when_one_runs(capsys, monkeypatch):
    from tuner.daemon import client

    asked = []
    answer = {"run_id": "r1", "buckets": [], "entries": 0, "table": "t.json"}

    def try_call(name, args):
        asked.append((name, args))
        return answer

    monkeypatch.setattr(client, "try_call", try_call)
    rc, out, err = run_cli(capsys, "search", "kernel", "--family", "softmax", "--budget", "1",
                           "--proposer", "random", "--device", "cpu", "--shape", "3x17",
                           "--objective", "energy", "--json")
    assert rc == 0, err
    assert json.loads(out) == answer
    (name, args), = asked
    assert name == "search_kernel"
    assert (args["family"], args["shapes"], args["objective"]) == ("softmax", [[3, 17]], "energy")


def test_the_operation_records_the_objective_it_is_given(tmp_path):
    """As the daemon's search child runs it (the operation, not the CLI's own call): the run
    and its table record the objective; one the CPU cannot measure (energy: no NVML) is refused
    before any trial."""
    from tuner.cli.common import invoke
    from tuner.errors import BadInput
    from tuner.ops.settings import Settings
    from tuner.search.store import TrialStore

    settings = Settings(tmp_path / "state", None, None)
    with pytest.raises(BadInput, match="--objective energy: a kernel search on cpu measures no energy"):
        invoke(settings, "search_kernel", local=True, family="swiglu", budget=1,
               proposer="random", device="cpu", shapes=[[3, 17]], objective="energy")
    res = invoke(settings, "search_kernel", local=True, family="swiglu", budget=1,
                 proposer="random", device="cpu", shapes=[[3, 17]])
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        (run,) = st.runs()  # the refused search left no run
    assert run["id"] == res["run_id"] and run["meta"]["objective"] == "throughput", run["meta"]
    assert json.loads(open(res["table"]).read())["meta"]["objective"] == "throughput"


@pytest.mark.usefixtures("cli_env")
def test_search_kernel_prints_one_line_per_trial_then_the_buckets(capsys):
    """The plain output (not --json) names every trial as it did when the CLI ran the search
    itself: bucket, number, variant, config, verdict/reason and time; then each bucket."""
    rc, out, err = run_cli(capsys, "search", "kernel", "--family", "swiglu", "--budget", "2",
                           "--proposer", "random", "--device", "cpu", "--shape", "3x17")
    assert rc == 0, err
    lines = out.splitlines()
    trials = [ln for ln in lines if ln.startswith("  [")]
    assert len(trials) >= 2, out  # 2 measured (and any rejected asks)
    for ln in trials:
        assert re.fullmatch(r"  \[\S+\] #\d+ \w+ \{.*\}: \w+/\w+ (\d+\.\d\d us|-)", ln), ln
    assert any(re.search(r"kept/\w+ \d+\.\d\d us$", ln) for ln in trials), trials
    (bucket,) = [ln for ln in lines if ln.startswith("swiglu 3x17: ")]
    assert lines.index(bucket) > lines.index(trials[-1])
    assert "2 measured" in bucket and lines[-1].startswith("run ")
    # the summary: the objective's kernel cost, the bucket's first measured config -> kept
    (summ,) = [ln for ln in lines if ln.startswith("  time a call: ")]
    assert re.fullmatch(r"  time a call: [\d.e+-]+ -> [\d.e+-]+ us \(first measured -> kept; "
                        r"objective throughput\)", summ), summ
    assert lines.index(summ) == lines.index(bucket) + 1
