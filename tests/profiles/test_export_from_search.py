"""`profile export --from-search RUN` writes only what the search changed (not the host's every
knob), with the objective, the policy and the start and kept measurements in provenance; the
file applies; a run that is not there is one line, exit 2."""
from __future__ import annotations

import json

import yaml

from tests.simhelpers import SimCli


def test_export_from_search_has_only_the_changes_and_applies(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("search", "host", "--objective", "energy", "--budget", "10", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    run = res["run_id"]
    changed = {k: v for k, v in res["best_settings"].items() if v != res["start"].get(k)}
    assert changed, res  # the seeded search keeps something on the sim's throttled H200
    out = tmp_path / "mine.yaml"
    r = mt("profile", "export", "--from-search", run[-6:], "--name", "mine", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["name"] == "mine"
    assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in doc["knobs"].items()} == \
        {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in changed.items()}
    host_knobs = json.loads(mt("host", "--json").stdout)["knobs"]
    assert len(doc["knobs"]) < len(host_knobs)  # not --from-host's every knob
    prov = doc["provenance"]
    assert prov["run_id"] == run and prov["objective"] == "energy"
    assert prov["throughput_floor"] == 0.95
    assert prov["policy"].endswith("safety/policies/default.yaml")
    assert prov["measurements"]["start"]["tok_per_s"] > 0
    assert prov["measurements"]["kept"]["tok_per_j"] > prov["measurements"]["start"]["tok_per_j"]
    assert "simulated" in prov["measured_on"] and prov["values_from"] == "simulated"
    r = mt("apply", str(out), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = {it["knob"] for it in json.loads(r.stdout)["plan"]}
    assert set(changed) <= plan


def test_export_from_an_unknown_run_is_one_line(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("profile", "export", "--from-search", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no trial store yet" in r.stderr
    r = mt("profile", "export", "h200", "--from-search", "nope")
    assert r.returncode == 2 and "one of PROFILE, --from-host, --from-search" in r.stderr
