"""`metaltune profile list|show|diff|export`, `verify`, `apply` (dry run, through the safety
transaction, policy refusals) and `host`, on simulated hosts made by `sim init`'s code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.simhelpers import PERMISSIVE, host_digest as tree_digest, run_cli as run
from tuner.sim.hostinit import init_host

pytestmark = pytest.mark.usefixtures("cli_env")


#: what the shipped h200 profile leaves out because the default policy never stages it (a reboot,
#: a driver reload): a local profile that includes h200 and stages them, under a policy allowing it
STAGED = ("include: [h200]\nknobs:\n  bios.WorkloadProfile: HighPerformanceCompute\n"
          "  driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode: 1\n")


@pytest.fixture
def staged(tmp_path):
    p = tmp_path / "h200-staged.yaml"
    p.write_text(STAGED)
    return str(p)


@pytest.fixture
def h200(tmp_path):
    root = init_host(tmp_path / "h200", "h200")
    # plus a switch and a NIC on the GPU's path, so NIC selectors have something to select
    from tuner.pci.config import build_config
    from tuner.sim.ostree import add_pci_device

    gpu = next(p.name for p in (root / "sys/bus/pci/devices").iterdir())
    add_pci_device(root, "0000:16:00.0", build_config(0x10B5, 0xC010, 0x060400, port_type=6),
                   parent="0000:15:00.0")
    add_pci_device(root, "0000:15:00.0", build_config(0x10B5, 0xC010, 0x060400, port_type=5),
                   parent="0000:00:01.0")
    (root / "sys/bus/pci/devices" / gpu / "parent").write_text("0000:16:00.0\n")
    add_pci_device(root, "0000:19:00.0", build_config(0x15B3, 0x1021, 0x020000),
                   parent="0000:16:00.0")
    return root






def test_profile_list_marks_what_matches(capsys, h200):
    rc, out, _ = run(capsys, "--sim-root", str(h200), "profile", "list", "--json")
    assert rc == 0
    ps = {p["name"]: p for p in json.loads(out)["profiles"]}
    assert ps["h200"]["matches_host"] is True
    assert ps["h100"]["matches_host"] is False and "H100" in ps["h100"]["mismatch"][0]
    assert ps["common"]["abstract"] is True


def test_show_and_export_round_trip(capsys, tmp_path):
    rc, out, _ = run(capsys, "profile", "show", "h200", "--json")
    assert rc == 0
    shown = json.loads(out)
    assert [Path(c).stem for c in shown["chain"]] == ["common", "datacenter", "h200"]
    rc, out, _ = run(capsys, "profile", "export", "h200", "--name", "h200-flat")
    doc = yaml.safe_load(out)
    assert doc["name"] == "h200-flat" and "include" not in doc
    f = tmp_path / "h200-flat.yaml"
    f.write_text(out)
    rc, out2, _ = run(capsys, "profile", "diff", "h200", str(f), "--json")
    assert rc == 0 and json.loads(out2)["same"] is True


def test_diff_between_profiles_exits_1(capsys):
    rc, out, _ = run(capsys, "profile", "diff", "h200", "rtx4090", "--json")
    assert rc == 1
    diffs = {d["knob"]: d for d in json.loads(out)["differences"]}
    assert diffs["gpu*.power_limit_w"]["h200"] == "default"
    assert diffs["gpu*.power_limit_w"]["rtx4090"] == 360
    assert diffs["cpu.boost"]["h200"] == "<unset>"


def test_verify_reports_each_status_and_exits_1_on_drift(capsys, h200, staged):
    rc, out, _ = run(capsys, "--sim-root", str(h200), "verify", staged, "--json")
    assert rc == 1
    res = json.loads(out)
    st = {it["knob"] or it["key"]: it["status"] for it in res["knobs"]}
    assert st["os.numa_balancing"] == "drifted"
    assert st["sysctl.vm.zone_reclaim_mode"] == "ok"
    assert st["bios.WorkloadProfile"] == "drifted"
    assert res["match"] == [] and res["host"]["gpus"] == ["NVIDIA H200"]
    assert all(it["status"] in ("ok", "drifted", "unsupported", "pending-reboot") for it in res["knobs"])


def test_dry_run_prints_the_plan_and_writes_nothing(capsys, h200, staged):
    before = tree_digest(h200)
    rc, out, _ = run(capsys, "--sim-root", str(h200), "apply", staged, "--dry-run", "--json",
                     "--policy", PERMISSIVE)
    assert rc == 0
    res = json.loads(out)
    assert res["dry_run"] and res["changes"]["os.numa_balancing"] == 0
    assert res["changes"]["bios.WorkloadProfile"] == "HighPerformanceCompute"
    assert all(it.get("policy") == "allowed" for it in res["plan"] if it["status"] == "drifted")
    assert tree_digest(h200) == before


def test_apply_through_the_transaction_then_verify(capsys, h200, staged):
    rc, out, err = run(capsys, "--sim-root", str(h200), "apply", staged, "--probation", "0.2",
                       "--policy", PERMISSIVE, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["result"] == "applied" and res["transaction"]
    assert set(res["pending_reboot"]) == {"bios.WorkloadProfile",
                                          "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"}
    rc, out, _ = run(capsys, "--sim-root", str(h200), "verify", staged, "--json")
    res = json.loads(out)
    assert rc == 0, [it for it in res["knobs"] if it["status"] in ("drifted", "error")]
    st = {it["knob"]: it["status"] for it in res["knobs"] if it["knob"]}
    assert st["bios.WorkloadProfile"] == "pending-reboot"
    assert st["driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"] == "pending-reboot"
    assert st["os.numa_balancing"] == "ok"
    nic = [n for n in st if n.startswith("pcie.0000:19:00.0")]
    assert st["pcie.0000:19:00.0.max_read_request_bytes"] == "ok" and nic
    # applying again changes nothing
    rc, out, _ = run(capsys, "--sim-root", str(h200), "apply", staged, "--probation", "0",
                     "--policy", PERMISSIVE, "--json")
    assert rc == 0 and json.loads(out)["result"] == "nothing to change"


def test_default_policy_refuses_and_nothing_is_written(capsys, h200, staged):
    before = tree_digest(h200)
    rc, _, err = run(capsys, "--sim-root", str(h200), "apply", staged, "--probation", "0")
    assert rc == 1
    assert "forbidden 'bios.*'" in err and "forbidden 'driver.*'" in err
    assert tree_digest(h200) == before


def test_match_failure_needs_force(capsys, h200):
    before = tree_digest(h200)
    rc, _, err = run(capsys, "--sim-root", str(h200), "apply", "rtx4090", "--probation", "0",
                     "--policy", PERMISSIVE)
    assert rc == 1 and "does not match this host" in err and "--force" in err
    assert tree_digest(h200) == before
    rc, out, _ = run(capsys, "--sim-root", str(h200), "apply", "rtx4090", "--dry-run")
    assert rc == 0 and "note: profile does not match this host" in out


@pytest.mark.parametrize("body, expect", [
    ("include: [h200]\nknobs:\n  cpu.govrnor: performance\n",
     r"bad\.yaml:3: field knobs\.cpu\.govrnor: not a knob"),
    ("include: [h200]\nknobs:\n  sysctl.vm.swappiness: 15\n",
     r"bad\.yaml:3: field knobs\.sysctl\.vm\.swappiness: .*15 is not on the 10 grid"),
    ("include: [h200]\nknobs:\n  pcie.@gpus.max_read_request_bytes: 8192\n",
     r"bad\.yaml:3: field knobs\.pcie\.@gpus\.max_read_request_bytes: .*8192.*expected \{128"),
    ("include: [bad]\n", r"include cycle"),
    ("knobs: {os.numa_balancing: 0\n", r"bad\.yaml: not valid YAML at line \d+"),
])
def test_bad_profile_exit_2_names_file_and_field_and_changes_nothing(capsys, h200, tmp_path, body, expect):
    import re

    prof = tmp_path / "bad.yaml"
    prof.write_text(body)
    before = tree_digest(h200)
    for cmd in (["apply", str(prof), "--probation", "0", "--policy", PERMISSIVE, "--force"],
                ["verify", str(prof)]):
        rc, out, err = run(capsys, "--sim-root", str(h200), *cmd)
        assert rc == 2, (cmd, out, err)
        assert re.search(expect, err), err
        assert err.count("\n") == 1  # one clear line
    assert tree_digest(h200) == before


def test_export_from_host_then_verify_is_clean(capsys, h200, tmp_path):
    rc, out, _ = run(capsys, "--sim-root", str(h200), "profile", "export", "--from-host",
                     "--name", "snap", "-o", str(tmp_path / "snap.yaml"))
    assert rc == 0
    doc = yaml.safe_load((tmp_path / "snap.yaml").read_text())
    assert doc["provenance"]["source"] == "exported from host"
    assert doc["knobs"]["cpu.governor"] == "powersave"
    rc, out, _ = run(capsys, "--sim-root", str(h200), "verify", str(tmp_path / "snap.yaml"), "--json")
    res = json.loads(out)
    assert rc == 0, [it for it in res["knobs"] if it["status"] != "ok"]


def test_host_command_shows_hardware_knobs_and_devctl(capsys, h200):
    rc, out, _ = run(capsys, "--sim-root", str(h200), "host", "--json")
    assert rc == 0
    res = json.loads(out)
    hw = res["hardware"]
    assert hw["gpus"][0]["name"] == "NVIDIA H200" and hw["driver_version"] == "580.159.04"
    assert hw["virtualization"]["is_vm"] is False
    gpu = next(d for d in hw["pcie"] if d["kind"] == "gpu")
    assert {"RlxdOrd", "MaxReadReq", "MaxPayload", "raw", "offset"} <= set(gpu["devctl"])
    names = {k["name"]: k for k in res["knobs"]}
    assert names["os.numa_balancing"]["effect"] == "now"
    assert names["bios.WorkloadProfile"]["effect"] == "reboot"
    rc, out, _ = run(capsys, "--sim-root", str(h200), "host")
    assert rc == 0 and "MaxReadReq" in out and "NVIDIA H200" in out


def test_vm_host_reports_vm_and_read_only_knobs(capsys, tmp_path):
    root = init_host(tmp_path / "vm", "h200", vm=True)
    rc, out, _ = run(capsys, "--sim-root", str(root), "host", "--json")
    res = json.loads(out)
    v = res["hardware"]["virtualization"]
    assert v["is_vm"] and v["hypervisor_flag"] and any("QEMU" in e for e in v["evidence"])
    rc, out, _ = run(capsys, "--sim-root", str(root), "verify", "h200", "--json")
    st = {it["knob"]: it["status"] for it in json.loads(out)["knobs"] if it["knob"]}
    assert st["os.numa_balancing"] == "unsupported" and st["cpu.governor"] == "unsupported"
    assert not any(n.startswith("bios.") for n in st)  # no BMC in a cloud VM


def test_at_least_keeps_a_larger_host_value(capsys, h200):
    mm = h200 / "proc/sys/vm/max_map_count"
    mm.write_text("8250410\n")  # what the lent H200 VM runs
    rc, out, _ = run(capsys, "--sim-root", str(h200), "verify", "h200", "--json")
    it = next(i for i in json.loads(out)["knobs"] if i["knob"] == "sysctl.vm.max_map_count")
    assert it["status"] == "ok" and it["wanted"] == 8250410 and it["bound"] == {"at_least": 1048576}
    mm.write_text("65530\n")
    rc, out, _ = run(capsys, "--sim-root", str(h200), "apply", "h200", "--probation", "0",
                     "--policy", PERMISSIVE, "--json")
    assert rc == 0 and json.loads(out)["changes"]["sysctl.vm.max_map_count"] == 1048576
    assert mm.read_text().strip() == "1048576"
