"""Profiles say where their values come from (issue 42, item 13): `h200-efficient` (values
found on the simulated H200 only) applied with no sign of it, beside `h200` in `profile list`
with nothing to choose between them. Now `provenance.values_from` (measured / simulated /
guidance) is a column of `profile list`, and `apply` of a simulated-only profile warns in one
line."""
from __future__ import annotations

import json

from tests.simhelpers import REPO, SimCli
from tuner import profiles


def test_every_shipped_profile_says_where_its_values_come_from():
    for p in sorted((REPO / "host_profiles").glob("*.yaml")):
        prof = profiles.load(str(p))
        assert prof.provenance.values_from in ("measured", "simulated", "guidance"), p.name
    assert profiles.load(str(REPO / "host_profiles/h200-efficient.yaml")).provenance.values_from \
        == "simulated"


def test_profile_list_shows_it_and_apply_of_a_simulated_profile_warns(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("profile", "list", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    rows = {l.split("│")[1].strip(): l for l in r.stdout.splitlines() if l.count("│") > 3}
    assert "simulated" in rows["h200-efficient"] and "guidance" in rows["h200"], r.stdout
    res = json.loads(mt("profile", "list", "--json").stdout)
    by = {p["name"]: p for p in res["profiles"]}
    assert by["h200-efficient"]["values_from"] == "simulated"
    r = mt("apply", "h200-efficient", "--dry-run")
    warn = [l for l in r.stderr.splitlines() if "warning" in l]
    assert len(warn) == 1 and "found on a simulated host only" in warn[0], r.stderr
    r = mt("apply", "h200", "--dry-run")
    assert "simulated" not in r.stderr, r.stderr
    # a profile exported from a simulated host says so
    out = tmp_path / "mine.yaml"
    r = mt("profile", "export", "--from-host", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert profiles.load(str(out)).provenance.values_from == "simulated"
