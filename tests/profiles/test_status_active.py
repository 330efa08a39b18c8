"""`status` names the active profile (as `tuned-adm active` does) and the values staged for a
reboot or a driver reload, through the real CLI on a `sim init` host."""
from __future__ import annotations

import json

from tests.simhelpers import PERMISSIVE, SimCli

STAGED = ("include: [h200]\nknobs:\n  bios.WorkloadProfile: HighPerformanceCompute\n"
          "  driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode: 1\n")


def test_status_names_the_active_profile_until_a_rollback(tmp_path):
    mt = SimCli(tmp_path, "h200")
    s = mt("status")
    assert s.returncode == 0 and "active profile: none" in s.stdout
    assert mt("apply", "h200", "--probation", "0").returncode == 0
    s = mt("status")
    assert "active profile: h200 (transaction 1;" in s.stdout and "verify h200" in s.stdout
    j = json.loads(mt("status", "--json").stdout)
    assert j["active_profile"]["name"] == "h200" and j["active_profile"]["txn"] == 1
    assert mt("rollback").returncode == 0
    assert json.loads(mt("status", "--json").stdout)["active_profile"] is None


def test_an_apply_with_nothing_to_change_is_active_too(tmp_path):
    mt = SimCli(tmp_path, "h200")
    assert mt("apply", "h200", "--probation", "0").returncode == 0
    assert mt("rollback").returncode == 0
    own = tmp_path / "already.yaml"
    own.write_text("knobs:\n  gpu*.power_limit_w: default\n")  # what the host has
    r = mt("apply", str(own), "--probation", "0")
    assert r.returncode == 0 and "nothing to change" in r.stdout
    assert json.loads(mt("status", "--json").stdout)["active_profile"]["name"] == "already"


def test_status_lists_values_staged_for_a_reboot(tmp_path):
    mt = SimCli(tmp_path, "h200")
    prof = tmp_path / "staged.yaml"
    prof.write_text(STAGED)
    r = mt("apply", str(prof), "--probation", "0", "--policy", PERMISSIVE)
    assert r.returncode == 0, r.stderr
    j = json.loads(mt("status", "--json").stdout)
    staged = {s["knob"]: s for s in j["staged"]}
    assert staged["bios.WorkloadProfile"]["staged"] == "HighPerformanceCompute"
    assert staged["bios.WorkloadProfile"]["current"] == "Balanced"
    assert staged["bios.WorkloadProfile"]["takes_effect"] == "reboot"
    assert staged["driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"]["staged"] == 1
    text = mt("status").stdout
    assert ("staged: bios.WorkloadProfile = HighPerformanceCompute (now Balanced; takes effect on "
            "the next reboot)") in text
    assert "staged: driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode = 1" in text
    assert "active profile: staged" in text


def test_status_table_never_cuts_a_knob_name_and_has_csv(tmp_path):
    mt = SimCli(tmp_path, "h200")
    name = "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"
    for cols in ("60", "80"):
        out = mt("status", env={"COLUMNS": cols}).stdout
        assert name in out, out
    rows = mt("status", "--csv").stdout.splitlines()
    assert rows[0] == "knob,baseline,current"
    assert f"{name},,0" in rows and "gpu0.power_limit_w,,700" in rows
    v = mt("verify", "h200", "--csv").stdout.splitlines()
    assert v[0] == "knob,status,current,wanted,effect,from"
    assert any(line.startswith("os.numa_balancing,drifted,1,0,now,") for line in v)


def test_host_and_profile_show_print_whole_knob_names_and_csv(tmp_path):
    mt = SimCli(tmp_path, "h200")
    name = "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"
    assert name in mt("host", env={"COLUMNS": "60"}).stdout
    rows = mt("host", "--csv").stdout.splitlines()
    assert rows[0] == "knob,value,domain,effect" and any(r.startswith(f"{name},0,") for r in rows)
    show = mt("profile", "show", "h200", env={"COLUMNS": "60"}).stdout
    assert "sysctl.kernel.sched_autogroup_enabled" in show
    rows = mt("profile", "show", "h200", "--csv").stdout.splitlines()
    assert rows[0] == "knob,value,from"
    assert any(r.startswith("gpu*.power_limit_w,default,host_profiles/h200.yaml:") for r in rows)
