"""`metaltune recommend` names the shipped profile for this host with its evidence: the H200's
`h200` (vendor guidance, not measured end to end) with `h200-efficient` (only simulated) as the
energy alternative; a profile exported from a search here is "measured on this host"."""
from __future__ import annotations

import json

from tests.simhelpers import SimCli


def test_recommend_names_the_profile_and_its_evidence(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("recommend", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["recommended"]["name"] == "h200"
    assert res["recommended"]["evidence"]["kind"] == "not-measured"
    alts = {a["name"]: a for a in res["alternatives"]}
    assert alts["h200-efficient"]["objective"] == "energy"
    assert alts["h200-efficient"]["evidence"]["kind"] == "simulated"
    assert res["next"] == "metaltune apply h200 --dry-run"
    text = mt("recommend").stdout
    assert "recommended: h200 (throughput)" in text and "only simulated" in text

    # a profile from a search on this host, in the state dir's profiles: measured here
    (mt.state / "profiles").mkdir(parents=True)
    (mt.state / "profiles/mine.yaml").write_text(
        "description: mine\nmatch: {gpu_name: ['NVIDIA H200']}\nknobs: {gpu0.power_limit_w: 650}\n"
        "provenance: {source: metaltune search host, run_id: r1, objective: throughput}\n")
    res = json.loads(mt("recommend", "--json").stdout)
    mine = next(f for f in [res["recommended"], *res["alternatives"]] if f["name"] == "mine")
    assert mine["evidence"]["kind"] == "measured"  # r1 is not a run of this state dir


def test_recommend_on_a_consumer_card(tmp_path):
    mt = SimCli(tmp_path, "rtx4090")
    res = json.loads(mt("recommend", "--json").stdout)
    assert res["recommended"]["name"] == "rtx4090"


def test_evidence_kinds():
    from tuner.ops.recommend import evidence

    assert evidence({"source": "metaltune search host", "run_id": "r1", "measured_on": "NVIDIA H200",
                     "date": "2026-12-04"}, {"r1"})["kind"] == "here"
    assert evidence({"source": "metaltune search host", "run_id": "r1"}, set())["kind"] == "measured"
    assert evidence({"source": "measured", "measured_on": "NVIDIA H100 SXM"}, set())["text"] \
        .startswith("measured on NVIDIA H100 SXM")
    assert evidence({"source": "sim-measured"}, set())["kind"] == "simulated"
    assert evidence({"source": "metaltune search host", "run_id": "r2",
                     "measured_on": "NVIDIA H200 (simulated)"}, set())["kind"] == "simulated"
    assert evidence({"source": "vendor guidance"}, set())["kind"] == "not-measured"
    assert evidence({}, set())["text"] == "not measured end to end: no provenance"
