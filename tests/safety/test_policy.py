"""Policy: deny by default, each check names its rule; shipped policies; malformed files give one
clear error naming file and field and change nothing (hypothesis fuzz)."""
from __future__ import annotations

import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safety import Journal, PolicyDenied, PolicyError, Transaction
from safety import policy as pol
from tests.safety import _knobs


@pytest.fixture
def knobs(tmp_path):
    _knobs.init(tmp_path / "h", {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": 0,
                                 "cpu.governor_level": 0, "bios.Profile": 0})
    return _knobs.make(str(tmp_path / "h"))


def P(d, src="p.yaml"):
    return pol.Policy.from_dict(d, src)


def test_deny_by_default_and_forbidden_wins(knobs):
    p = P({"rules": [{"knob": "gpu*"}], "forbidden": ["gpu0.locked*"]})
    r = p.check(knobs["cpu.governor_level"], 0, 1)
    assert r.rule == "no rule" and "deny by default" in str(r) and "p.yaml" in str(r)
    r = p.check(knobs["gpu0.locked_clocks_mhz"], 0, 1500)
    assert r.rule == "forbidden 'gpu0.locked*'"
    assert p.check(knobs["gpu0.power_limit_w"], 700, 600) is None


def test_first_matching_rule_decides_and_is_named(knobs):
    p = P({"rules": [{"knob": "cpu.*"}, {"knob": "gpu0.power*", "range": [300, 650]},
                     {"knob": "gpu*"}]})
    r = p.check(knobs["gpu0.power_limit_w"], 700, 680)
    assert r.rule == "rule #1 (knob 'gpu0.power*')" and "above the range maximum 650" in r.failed
    r = p.check(knobs["gpu0.power_limit_w"], 700, 200)
    assert "below the range minimum 300" in r.failed


def test_values_step_floor_domain_and_null(knobs):
    k = knobs["gpu0.power_limit_w"]
    assert "not one of the allowed values" in P({"rules": [{"knob": "*", "values": [500, 600]}]}) \
        .check(k, 700, 550).failed
    assert "max_step 100" in P({"rules": [{"knob": "*", "max_step": 100}]}).check(k, 700, 550).failed
    r = P({"rules": [{"knob": "*", "min_fraction_of_default": 0.75}]}).check(k, 700, 500)
    assert "floor 0.75 x default 700 = 525" in r.failed
    assert P({"rules": [{"knob": "*", "min_fraction_of_default": 0.75}]}).check(k, 700, 530) is None
    r = P({"rules": [{"knob": "*"}]}).check(k, 700, 5000)
    assert "outside the device's domain" in r.failed
    assert P({"rules": [{"knob": "*", "allow_null": False}]}).check(k, 700, None) is not None
    clocks = P({"rules": [{"knob": "*", "range": [0, 1800], "within_device_limits": False}]})
    assert "above the range maximum" in clocks.check(knobs["gpu0.locked_clocks_mhz"], [1500, 1500],
                                                      [1500, 1900]).failed


def test_reboot_effect_needs_permission(knobs):
    b = knobs["bios.Profile"]
    r = P({"rules": [{"knob": "bios.*"}]}).check(b, 0, 3)
    assert "takes effect on reboot" in r.failed and "allow_reboot_effect" in r.failed
    assert P({"rules": [{"knob": "bios.*", "allow_reboot_effect": True}]}).check(b, 0, 3) is None


def test_rate_limit_counts_the_journal_across_restarts(knobs, tmp_path):
    p = P({"rules": [{"knob": "gpu0.power_limit_w", "max_changes_per_hour": 2}]})
    j = Journal(tmp_path / "s" / "journal.db")
    for v in (650, 600):
        with Transaction(j, knobs, {"gpu0.power_limit_w": v}, policy=p, probation_s=30) as t:
            t.confirm()
    j2 = Journal(tmp_path / "s" / "journal.db")  # a new process sees the same count
    with pytest.raises(PolicyDenied, match="rate limit: 2 changes in the last hour"):
        Transaction(j2, knobs, {"gpu0.power_limit_w": 550}, policy=p).begin()
    assert p.check(knobs["gpu0.power_limit_w"], 600, 550, j2, now=time.time() + 3601) is None


def test_default_policy_is_conservative(knobs):
    p = pol.load_default()
    assert p.source.endswith("safety/policies/default.yaml")
    pl = knobs["gpu0.power_limit_w"]
    assert p.check(pl, 700, 600) is None
    assert "floor" in p.check(pl, 700, 500).failed  # < 75% of the 700 W default
    for name in ("bios.WorkloadProfile", "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode",
                 "pcie.0000:17:00.0.relaxed_ordering", "gpu0.persistence_mode"):
        assert p.forbidden_by(name) is not None, name
    for name in ("gpu0.gpc_clock_offset_mhz", "gpu1.mem_clock_offset_mhz"):  # only back to 0
        assert p.rule_for(name)[1].values == [0], name
    assert p.rule_for("gpu3.locked_clocks_mhz") is not None
    assert p.rule_for("sysctl.vm.swappiness")[1].range == (1, 100)  # what the shipped profiles set
    assert p.rule_for("sysctl.vm.dirty_ratio") is None  # deny by default
    assert p.probation_for(["gpu0.power_limit_w"]) == 120


def test_permissive_policy_allows_offsets_and_bios_with_reboot(knobs):
    p = pol.load_permissive()
    assert p.check(knobs["bios.Profile"], 0, 3) is None
    assert p.rule_for("gpu0.gpc_clock_offset_mhz")[1].max_step == 200
    assert p.model.forbidden == []


@pytest.mark.parametrize("text,field", [
    ("rules:\n  - knob: 'gpu*'\n    max_step: -5\n", "rules[0].max_step"),
    ("rules:\n  - knob: 'gpu*'\n    colour: red\n", "rules[0].colour"),
    ("rules:\n  - {knob: 'a', range: [10, 5]}\n", "rules[0].range"),
    ("rules: {knob: a}\n", "rules"),
    ("version: 7\n", "version"),
    ("forbidden: ['']\n", "forbidden"),
    ("defaults: {probation_s: soon}\n", "defaults.probation_s"),
])
def test_malformed_policy_names_file_and_field(tmp_path, text, field):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(PolicyError) as e:
        pol.load(f)
    msg = str(e.value)
    assert msg.startswith(f"policy {f}: field {field}:"), msg
    assert e.value.exit_code == 2


def test_yaml_syntax_error_gives_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("rules:\n  - knob: [unclosed\n")
    with pytest.raises(PolicyError, match=rf"policy {f}: not valid YAML at line \d+, column \d+"):
        pol.load(f)
    with pytest.raises(PolicyError, match="cannot read"):
        pol.load(tmp_path / "missing.yaml")
    f.write_text("- just\n- a list\n")
    with pytest.raises(PolicyError, match="expected a mapping"):
        pol.load(f)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_junk = st.recursive(_scalar, lambda c: st.lists(c, max_size=3) |
                     st.dictionaries(st.sampled_from(
                         ["knob", "rules", "range", "values", "max_step", "forbidden", "defaults",
                          "probation_s", "version", "x"]), c, max_size=4), max_leaves=12)
_rule = st.fixed_dictionaries({"knob": st.one_of(st.just("gpu0.*"), _junk)},
                              optional={"range": _junk, "max_step": _junk, "values": _junk,
                                        "max_changes_per_hour": _junk, "allow_reboot_effect": _junk,
                                        "min_fraction_of_default": _junk, "bogus": _junk})
_doc = st.one_of(_junk, st.fixed_dictionaries({"rules": st.lists(_rule, max_size=3)},
                                              optional={"forbidden": _junk, "defaults": _junk,
                                                        "version": _junk}))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=_doc, raw=st.booleans(), garbage=st.text(max_size=40))
def test_fuzz_malformed_policy_clear_error_nothing_changed(tmp_path, knobs, doc, raw, garbage):
    f = tmp_path / "fuzz.yaml"
    f.write_text(garbage if raw else yaml.safe_dump(doc))
    root = knobs["gpu0.power_limit_w"].root
    before = _knobs.snapshot(root)
    j = Journal(tmp_path / "fuzz-state" / "journal.db")
    n_txns = len(j.txns(1000))
    try:
        p = pol.load(f)
    except PolicyError as e:
        msg = str(e)
        assert msg.startswith(f"policy {f}:") and "\n" not in msg
        # a transaction handed the broken file refuses before anything is written
        with pytest.raises(PolicyError):
            Transaction(j, knobs, {"gpu0.power_limit_w": 650}, policy=f).begin()
        assert _knobs.snapshot(root) == before and len(j.txns(1000)) == n_txns
        return
    # a file that loads is a real policy: every decision is allowed or a named refusal
    r = p.check(knobs["gpu0.power_limit_w"], 700, 650)
    assert r is None or (r.rule and r.failed and str(f) in str(r))
