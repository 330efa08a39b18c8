"""Bad input on the GPU knobs and the search commands: one clear error, exit 2, nothing changed."""
from __future__ import annotations


import pytest

from tests.simhelpers import PERMISSIVE, host_digest as digest, run_cli as run
from tuner.sim.hostinit import init_host

pytestmark = pytest.mark.usefixtures("cli_env")


@pytest.fixture
def h200(tmp_path):
    return init_host(tmp_path / "h200", "h200")






@pytest.mark.parametrize("knobs, expect", [
    ("gpu0.power_limit_w: 900", r"gpu0\.power_limit_w.*900.*outside"),
    ("gpu0.locked_clocks_mhz: [1000, 1001]", r"gpu0\.locked_clocks_mhz.*not a supported clock"),
    ("gpu0.locked_clocks_mhz: [1980, 345]", r"gpu0\.locked_clocks_mhz.*above max"),
    ("gpu0.turbo_mode: 1", r"gpu0\.turbo_mode"),
])
def test_gpu_profile_values_outside_the_device_domain_are_refused(capsys, h200, tmp_path, knobs, expect):
    import re

    prof = tmp_path / "bad.yaml"
    prof.write_text(f"name: bad\nknobs:\n  {knobs}\n")
    before = digest(h200)
    rc, out, err = run(capsys, "--sim-root", str(h200), "apply", str(prof), "--probation", "0",
                       "--policy", PERMISSIVE, "--force")
    assert rc == 2, (out, err)
    assert re.search(expect, err), err
    assert "bad.yaml" in err and err.count("\n") == 1
    assert digest(h200) == before


def test_settings_this_host_cannot_take_are_reported_unsupported_not_written(capsys, h200, tmp_path):
    # a shared profile may name what one host lacks (offsets on an H200); a GPU it does not have
    # is refused (issue 42 item 12: "nothing to change" called such a profile in force)
    prof = tmp_path / "p.yaml"
    prof.write_text("name: p\nknobs:\n  gpu0.gpc_clock_offset_mhz: 100\n")
    before = digest(h200)
    rc, out, err = run(capsys, "--sim-root", str(h200), "apply", str(prof), "--probation", "0",
                       "--policy", PERMISSIVE, "--force")
    assert rc == 0 and "unsupported 1" in out and "nothing to change" in out
    prof.write_text("name: p\nknobs:\n  gpu0.gpc_clock_offset_mhz: 100\n  gpu7.power_limit_w: 500\n")
    rc, out, err = run(capsys, "--sim-root", str(h200), "apply", str(prof), "--probation", "0",
                       "--policy", PERMISSIVE, "--force")
    assert rc == 2 and "knobs.gpu7.power_limit_w: this host has no gpu7" in err, (out, err)
    assert digest(h200) == before


def test_search_with_an_unknown_knob_is_bad_input(capsys, h200):
    before = digest(h200)
    rc, _, err = run(capsys, "--sim-root", str(h200), "search", "host", "--knob", "gpu0.warp_drive",
                     "--budget", "2")
    assert rc == 2 and "unknown knob 'gpu0.warp_drive'" in err
    assert digest(h200) == before


@pytest.mark.parametrize("args, expect", [
    (["demo", "--trials", "0"], "--trials"),
    (["demo", "--sku", "a100"], "--sku"),
    (["demo", "--proposer", "annealing", "--trials", "1"], "unknown proposer"),
    (["--backend", "cloud", "trials"], "--backend"),
    (["trials", "--verdict", "maybe"], "--verdict"),
])
def test_bad_options_exit_2_with_one_message(capsys, args, expect):
    rc, _, err = run(capsys, *args)
    assert rc == 2 and expect in err


def test_malformed_policy_is_bad_input_and_nothing_changes(capsys, h200, tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text("version: 1\nrules:\n  - knob: 'gpu*.power_limit_w'\n    range: [700, 300]\n")
    before = digest(h200)
    rc, _, err = run(capsys, "--sim-root", str(h200), "search", "host", "--budget", "2",
                     "--policy", str(pol))
    assert rc == 2 and "policy.yaml" in err
    assert digest(h200) == before
