"""The shipped profiles and the shipped default policy agree: each profile applies, as a new user
would run it (`sim init`, then `apply NAME`), with the defaults; and when a policy does refuse,
the refusal names each rule once with the way out, and `--dry-run` counts it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from safety import policy as pol
from tests.simhelpers import REPO, SimCli, host_digest

PROFILES = REPO / "host_profiles"
SHIPPED = sorted(p.stem for p in PROFILES.glob("*.yaml")
                 if not (yaml.safe_load(p.read_text()) or {}).get("abstract"))
#: the profiles whose GPU has a simulated SKU; the others (A100, H100, L40S) run on the simulated
#: H200 with --force: what the policy decides depends on the knob names and values, not the GPU
SKU_OF = {"h200": "h200", "rtx4090": "rtx4090", "h200-efficient": "h200"}


def test_every_shipped_profile_is_covered():
    assert {"h200", "h100", "a100", "l40s", "rtx4090"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_applies_under_the_default_policy(tmp_path, name):
    mt = SimCli(tmp_path, SKU_OF.get(name, "h200"))
    force = [] if name in SKU_OF else ["--force"]
    dry = mt("apply", name, "--dry-run", "--json", *force)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert "refused" not in plan and "denied" not in plan["policy_summary"], plan.get("refused")
    # every knob the profile sets is one the default policy has a rule for, drifted here or not
    # (a real host whose value differs must not be refused either)
    default = pol.load_default()
    for it in plan["plan"]:
        if it["knob"] and it["status"] != "unsupported":
            assert default.forbidden_by(it["knob"]) is None and default.rule_for(it["knob"]), it
    r = mt("apply", name, "--probation", "0", *force)
    assert r.returncode == 0, r.stderr
    assert "applied (transaction" in r.stdout or "nothing to change" in r.stdout
    v = mt("verify", name, "--json")
    assert v.returncode == 0, [k for k in json.loads(v.stdout)["knobs"] if k["status"] != "ok"]


def test_newcomer_path_h200_with_the_defaults(tmp_path):
    """README: sim init, apply h200, status, verify, confirm: each says what to do next."""
    mt = SimCli(tmp_path, "h200")
    r = mt("apply", "h200", "--probation", "1")
    assert r.returncode == 0, r.stderr
    assert "applied (transaction 1)" in r.stdout and "metaltune status" in r.stdout
    assert "transaction 1: confirmed" in r.stderr  # the one line per state change (no TTY)
    s = mt("status")
    assert s.returncode == 0 and "active profile: h200" in s.stdout, s.stdout
    assert mt("verify", "h200").returncode == 0
    c = mt("confirm")
    assert c.returncode == 1 and "nothing is pending confirmation" in c.stderr


STAGED = """include: [h200]
knobs:
  bios.WorkloadProfile: HighPerformanceCompute
  driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode: 1
  sysctl.vm.dirty_ratio: 30
  gpu*.power_limit_w: 400
"""


def test_refusal_names_each_rule_once_with_the_way_out(tmp_path):
    mt = SimCli(tmp_path, "h200")
    prof = tmp_path / "staged.yaml"
    prof.write_text(STAGED)
    before = host_digest(mt.root)
    r = mt("apply", str(prof), "--probation", "0")
    assert r.returncode == 1
    err = r.stderr
    source = str(pol.POLICY_DIR / "default.yaml")
    assert err.count(source) <= 2 and err.count("default.yaml:") == 0, err  # no path per row
    lines = err.splitlines()
    for rule in ("forbidden 'bios.*'", "forbidden 'driver.*'", "no rule", "rule #0"):
        assert [ln.lstrip().startswith(rule) for ln in lines].count(True) == 1, (rule, err)
    assert "bios.WorkloadProfile = 'HighPerformanceCompute'" in err
    assert "sysctl.vm.dirty_ratio = 30" in err and "gpu0.power_limit_w = 400" in err
    assert "/etc/metaltune/policy.yaml" in err and "--policy FILE" in err
    assert "4 change(s)" in err
    assert host_digest(mt.root) == before and not (mt.state / "journal.db").exists()

    d = mt("apply", str(prof), "--dry-run")
    assert d.returncode == 0
    summary = next(line for line in d.stdout.splitlines() if line.startswith("summary:"))
    assert "denied 4" in summary and "allowed" in summary
    assert "apply would be refused" in d.stdout and "way out" in d.stdout
    j = json.loads(mt("apply", str(prof), "--dry-run", "--json").stdout)
    assert j["policy_summary"]["denied"] == 4 and j["refused"].count("forbidden 'bios.*'") == 1


def test_own_policy_refusal_says_which_file_to_edit(tmp_path):
    mt = SimCli(tmp_path, "h200")
    own = tmp_path / "mine.yaml"
    own.write_text('version: 1\nrules:\n  - knob: "gpu*"\n')
    r = mt("apply", "h200", "--policy", str(own), "--probation", "0")
    assert r.returncode == 1
    assert f"edit {own}" in r.stderr and "no rule" in r.stderr
    assert len(r.stderr.splitlines()) <= 4  # one line per rule, not per knob
