"""Vendor BIOS CLIs (racadm, ilorest, SUM, OneCLI): the command lines metaltune builds, run through
host.run against recording executables in the sim host's bin/ that log argv and keep a tiny
state (current and pending values) like the real tools."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tests.profiles import simhost
from tuner.errors import OperationFailed
from tuner.knobs import registry

COMMON = textwrap.dedent("""
    import json, os, sys
    root = os.environ["METALTUNE_SIM_ROOT"]
    with open(os.path.join(root, "calls.jsonl"), "a") as f:
        f.write(json.dumps(sys.argv) + "\\n")
    sp = os.path.join(root, "vendor_state.json")
    st = json.load(open(sp)) if os.path.exists(sp) else {"cur": CUR, "pend": {}}
    def save():
        json.dump(st, open(sp, "w"))
    args = sys.argv[1:]
""")

TOOLS = {
    "racadm": """
while args and args[0] in ("-r", "-u", "-p"):
    args = args[2:]
if args and args[0] == "--nocertwarn":
    args = args[1:]
if args[0] == "get":
    grp, attr = args[1].split(".")[1:]
    print(f"[Key=BIOS.Setup.1-1#{grp}]")
    p = st["pend"].get(args[1])
    print(f"{attr}={st['cur'][args[1]]}" + (f" (Pending Value={p})" if p else ""))
elif args[0] == "set":
    if args[2] == "Bogus":
        print("ERROR: RAC1017: invalid value", file=sys.stderr); sys.exit(3)
    st["pend"][args[1]] = args[2]; save(); print("Object value modified successfully")
elif args[:2] == ["jobqueue", "create"]:
    print("Commit JID = JID_123456789012")
elif args[:2] == ["jobqueue", "view"]:
    print("[Job ID=JID_123456789012]\\nJob Name=Configure: BIOS.Setup.1-1\\nStatus=Scheduled")
elif args[:2] == ["jobqueue", "delete"]:
    st["pend"] = {}; save()
""",
    "ilorest": """
while args and args[0] in ("--url", "-u", "-p"):
    args = args[2:]
if args[0] == "get":
    print(json.dumps({args[1]: st["cur"][args[1]]}))
elif args[0] == "set":
    for kv in args[1:]:
        if "=" in kv:
            k, v = kv.split("=", 1)
            if st["cur"].get(k) == v:
                st["pend"].pop(k, None)
            else:
                st["pend"][k] = v
    save()
elif args[0] == "pending":
    print(json.dumps({"Bios": {"Attributes": st["pend"]}}))
""",
    "sum": """
while args and args[0] in ("-i", "-u", "-p"):
    args = args[2:]
cmd, fname = args[1], args[3]
if cmd == "GetCurrentBiosCfg":
    with open(fname, "w") as f:
        f.write('<?xml version="1.0"?><BiosCfg><Menu name="Advanced"><Menu name="CPU">'
                + "".join(f'<Setting name="{k}" selectedOption="{v}" type="Option"/>' for k, v in st["cur"].items())
                + '</Menu></Menu></BiosCfg>')
elif cmd == "ChangeBiosCfg":
    import xml.etree.ElementTree as ET
    for s in ET.parse(fname).getroot().iter("Setting"):
        if s.get("selectedOption") != st["cur"][s.get("name")]:
            st["pend"][s.get("name")] = s.get("selectedOption")
    save()
""",
    "onecli": """
if args[:2] == ["config", "show"]:
    print(f"{args[2]}={st['cur'][args[2]]}")
elif args[:2] == ["config", "set"]:
    st["pend"][args[2]] = args[3]; save()
""",
}

CUR = {
    "racadm": {"BIOS.SysProfileSettings.SysProfile": "PerfPerWattOptimizedDapc"},
    "ilorest": {"WorkloadProfile": "GeneralPowerEfficientCompute"},
    "sum": {"Power Technology": "Energy Efficient"},
    "onecli": {"OperatingModes.ChooseOperatingMode": "Efficiency - Favor Performance"},
}


def setup_tool(root, tool, cfg):
    exe = root / "bin" / tool
    exe.write_text(f"#!{sys.executable}\n" + COMMON.replace("CUR", repr(CUR[tool])) + TOOLS[tool])
    exe.chmod(0o755)
    (root / "etc/metaltune/bmc.yaml").write_text(cfg)


def calls(root):
    out = [json.loads(x) for x in (root / "calls.jsonl").read_text().splitlines()]
    for argv in out:
        assert argv[0] == str(root / "bin" / argv[0].rsplit("/", 1)[-1])  # found on bin/ first
        argv[0] = argv[0].rsplit("/", 1)[-1]
    return out


@pytest.fixture
def root(tmp_path):
    return simhost.make(tmp_path / "h", pci=False)


def test_racadm_stage_job_and_clear(root):
    setup_tool(root, "racadm", "method: racadm\nvalues:\n  SysProfileSettings.SysProfile: "
               "[PerfPerWattOptimizedDapc, PerfOptimized, Custom]\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.SysProfileSettings.SysProfile"]
    assert k.read() == "PerfPerWattOptimizedDapc"
    assert k.apply("PerfOptimized") == "PerfOptimized"
    assert k.read() == "PerfPerWattOptimizedDapc" and k.pending() == "PerfOptimized"
    c = calls(root)
    assert ["racadm", "set", "BIOS.SysProfileSettings.SysProfile", "PerfOptimized"] in c
    assert ["racadm", "jobqueue", "create", "BIOS.Setup.1-1"] in c  # staged; no -r reboot flag
    assert not any("-r" in x[1:] and "jobqueue" in x for x in c)
    k.clear_pending()
    assert ["racadm", "jobqueue", "delete", "-i", "JID_123456789012"] in calls(root)
    assert k.pending() is None


def test_racadm_remote_redacts_the_password_in_errors(root):
    setup_tool(root, "racadm", "method: racadm\nbmc_host: 10.0.0.5\nusername: root\n"
               "password_file: /etc/metaltune/bmc.secret\nvalues:\n  SysProfileSettings.SysProfile: "
               "[PerfPerWattOptimizedDapc, Bogus]\n")
    (root / "etc/metaltune/bmc.secret").write_text("calvin-secret\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.SysProfileSettings.SysProfile"]
    assert k.read() == "PerfPerWattOptimizedDapc"
    assert calls(root)[0][:7] == ["racadm", "-r", "10.0.0.5", "-u", "root", "-p", "calvin-secret"]
    with pytest.raises(OperationFailed) as ei:
        k.apply("Bogus")
    assert "RAC1017" in str(ei.value) and "calvin-secret" not in str(ei.value)
    assert "***" in str(ei.value)


def test_ilorest_set_commit_and_pending(root):
    setup_tool(root, "ilorest", "method: ilorest\nvalues:\n  WorkloadProfile: "
               "[GeneralPowerEfficientCompute, HighPerformanceCompute]\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.WorkloadProfile"]
    k.apply("HighPerformanceCompute")
    assert ["ilorest", "set", "WorkloadProfile=HighPerformanceCompute", "--select", "Bios.",
            "--commit"] in calls(root)
    assert ["ilorest", "get", "WorkloadProfile", "--select", "Bios.", "--json"] in calls(root)
    assert k.pending() == "HighPerformanceCompute"
    k.clear_pending()
    assert k.pending() is None


def test_sum_edits_the_bios_xml(root):
    setup_tool(root, "sum", "method: sum\nbmc_host: 10.0.0.7\nusername: ADMIN\nvalues:\n"
               "  Power Technology: [Energy Efficient, Disable, Custom]\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.Power Technology"]
    assert k.read() == "Energy Efficient"
    assert k.apply("Disable") == "Disable"
    assert k.read() == "Energy Efficient" and k.pending() == "Disable"
    c = [x for x in calls(root) if "ChangeBiosCfg" in x]
    assert c[0][:7] == ["sum", "-i", "10.0.0.7", "-u", "ADMIN", "-p", ""]
    assert c[0][7:9] == ["-c", "ChangeBiosCfg"] and c[0][9] == "--file"
    first = calls(root)[0]
    assert first[7:10] == ["-c", "GetCurrentBiosCfg", "--file"] and first[11:] == ["--overwrite"]
    st = json.loads((root / "vendor_state.json").read_text())
    assert st["pend"] == {"Power Technology": "Disable"}


def test_onecli_show_and_set(root):
    setup_tool(root, "onecli", "method: onecli\nbmc_host: 10.0.0.9\nusername: USERID\nvalues:\n"
               "  OperatingModes.ChooseOperatingMode: [Efficiency - Favor Performance, Maximum Performance]\n")
    (root / "etc/metaltune/bmc.secret").write_text("x\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.OperatingModes.ChooseOperatingMode"]
    assert k.read() == "Efficiency - Favor Performance"
    (root / "etc/metaltune/bmc.yaml").write_text(
        (root / "etc/metaltune/bmc.yaml").read_text() + "password_file: /etc/metaltune/bmc.secret\n")
    k = registry.discover(simhost.host(root), ["bios"])["bios.OperatingModes.ChooseOperatingMode"]
    k.apply("Maximum Performance")
    assert ["onecli", "config", "set", "OperatingModes.ChooseOperatingMode",
            "Maximum Performance", "--bmc", "USERID:x@10.0.0.9"] in calls(root)
    assert k.pending() == "Maximum Performance"
    k.clear_pending()
    assert k.pending() is None
    # clearing stages the value in force again
    assert ["onecli", "config", "set", "OperatingModes.ChooseOperatingMode",
            "Efficiency - Favor Performance", "--bmc", "USERID:x@10.0.0.9"] in calls(root)


def test_missing_tool_is_unavailable(root):
    (root / "etc/metaltune/bmc.yaml").write_text("method: racadm\nvalues:\n  A.B: [x]\n")
    assert registry.discover(simhost.host(root), ["bios"])["bios.A.B"].describe()["value"] is None
