"""A host search against the policy's hourly change limits (issue 42, item 11): searches ran
into `max_changes_per_hour` and spent the rest of their budget on refused trials, exiting 0
with no word. Now the budget is planned against the limits up front and said, the search stops
where they are reached (saying the limit), a search with nothing left is refused, and
`--wait-for-policy` waits for the window instead."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time

from tests.simhelpers import REPO, SimCli

SEARCH = ("search", "host", "--objective", "energy", "--workload", "sim", "--timeout", "0.5",
          "--seed", "1", "--knob", "gpu0.power_limit_w")


def small_policy(tmp_path, per_hour: int = 3):
    text = (REPO / "safety/policies/default.yaml").read_text()
    p = tmp_path / "policy.yaml"
    p.write_text(re.sub(r"max_changes_per_hour: \d+", f"max_changes_per_hour: {per_hour}", text))
    return p


def test_a_search_plans_its_budget_against_the_hourly_limit_and_stops_there(tmp_path):
    sim = SimCli(tmp_path, "h200", "--gpus", "1", "--seed", "1")
    pol = small_policy(tmp_path)
    r = sim(*SEARCH, "--budget", "8", "--policy", str(pol))
    assert r.returncode == 0, r.stderr
    plan = f"policy {pol} allows changes/hour: gpu0.power_limit_w 3 (3 left); 8 trials need " \
           "about 3 h; the search will stop at about trial 3"
    assert plan in r.stderr.splitlines()[0], r.stderr  # said before anything ran
    assert plan in r.stdout  # and in the summary
    m = re.search(r"stopped: search stopped after trial (\d+) of 8: the policy's hourly change "
                  r"limit is reached \(gpu0.power_limit_w 3/hour", r.stdout)
    assert m, r.stdout
    ran = int(re.search(r": (\d+) trials in", r.stdout).group(1))
    assert ran == int(m.group(1)) < 8 and "policy_denied" not in r.stdout, r.stdout
    # a second search within the hour: refused up front, nothing measured (exit 1, one line)
    r = sim(*SEARCH, "--budget", "4", "--policy", str(pol), "--json")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert "search stopped after trial 0 of 4" in r.stderr and "--wait-for-policy" in r.stderr
    # --wait-for-policy: waits for the window, saying how long, instead of stopping
    p = subprocess.Popen(sim.cmd(*SEARCH, "--budget", "4", "--policy", str(pol),
                                 "--wait-for-policy"),
                         cwd=REPO, env=sim.env, stderr=subprocess.PIPE, text=True)
    try:
        first, line = p.stderr.readline(), p.stderr.readline()
        assert "(0 left)" in first and "the search waits for the hourly window" in first, first
        assert "policy rate limit reached (gpu0.power_limit_w 3/hour): waiting" in line, line
        assert "s for the hourly window (--wait-for-policy)" in line
        time.sleep(0.5)
        assert p.poll() is None  # still waiting
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def test_search_host_help_names_the_hourly_limit():
    r = subprocess.run([__import__("sys").executable, "-m", "tuner", "search", "host", "--help"],
                       cwd=REPO, capture_output=True, text=True, env={
                           **__import__("os").environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    assert r.returncode == 0
    assert "--wait-for-policy" in r.stdout and "hourly change limits" in r.stdout, r.stdout
    assert "proposals stay inside it." not in r.stdout


def test_the_plan_is_in_the_json_result(tmp_path):
    sim = SimCli(tmp_path, "h200", "--gpus", "1", "--seed", "1")
    r = sim(*SEARCH, "--budget", "2", "--policy", str(small_policy(tmp_path, 5)), "--json")
    res = json.loads(r.stdout)
    assert res["policy_plan"] is None and res["stopped"] is None and res["trials"] == 2


def test_a_mixed_search_plans_against_the_hourly_limit_and_stops_there(tmp_path):
    """search mixed changes host knobs through the same policy: the same plan, stop and refusal."""
    sim = SimCli(tmp_path, "h200", "--gpus", "1", "--seed", "1")
    pol = small_policy(tmp_path, 2)
    mixed = ("search", "mixed", "--workload", "sim", "--knob", "gpu0.power_limit_w", "--timeout",
             "0.5", "--seed", "1", "--rounds", "1", "--policy", str(pol))
    r = sim(*mixed, "--budget", "6")
    assert r.returncode == 0, r.stderr
    assert "allows changes/hour: gpu0.power_limit_w 2 (2 left); 6 trials need" in r.stderr
    assert "the search will stop at about trial 2" in r.stdout, r.stdout
    m = re.search(r"stopped: search stopped after trial (\d+) of 6", r.stdout)
    assert m and int(m.group(1)) < 6, r.stdout
    r = sim(*mixed, "--budget", "3", "--json")  # nothing left this hour: refused, nothing run
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert "search stopped after trial 0 of 3" in r.stderr
