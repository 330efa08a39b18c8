"""deploy/ansible/rollout.yml run for real: ansible-playbook (ansible-core) with the shipped dynamic
inventory, over OpenSSH to sshd hosts in network namespaces, each host running metaltune on its
own simulated GPU host (the same lab as tests/fleet/test_rollout_ssh.py). Canary, then waves; a
failing wave is rolled back and stops the play; an Xid on the canary during probation halts the
play and that host's own transaction rolls it back, exactly as `metaltune fleet apply` does. An
unreachable host (no sshd at its address) stops the play before the next wave; one lost after its
preflight counts as failed and its wave is rolled back."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fleet.test_rollout_ssh import mt_local, setup_fleet, status

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "deploy/ansible/rollout.yml"
INVENTORY = ROOT / "deploy/ansible/metaltune_inventory.py"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
pytestmark = pytest.mark.peers


def playbook_cmd(lab, tmp_path: Path, inv: Path, *extra: str,
                 ansible_inventory: Path = INVENTORY) -> tuple[list[str], dict[str, str]]:
    assert ANSIBLE_PLAYBOOK.exists(), "ansible-core is a test extra: pip install -e '.[test]'"
    a = tmp_path / "ansible"
    env = {
        # the inventory script's `#!/usr/bin/env python3` finds this venv's python (pydantic, yaml)
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(a), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
        "METALTUNE_INVENTORY": str(inv),
        "ANSIBLE_HOME": str(a), "ANSIBLE_LOCAL_TEMP": str(a / "tmp"), "ANSIBLE_REMOTE_TMP": str(a / "remote"),
        "ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).with_name("ansible_plugins")),
        "ANSIBLE_STDOUT_CALLBACK": "record_json", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PIPELINING": "1",
        # no ControlPersist master left running after the play; host keys as configured (checked)
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o BatchMode=yes",
    }
    argv = ["ip", "netns", "exec", lab.client_ns, str(ANSIBLE_PLAYBOOK), "-i", str(ansible_inventory), str(PLAYBOOK),
            "-e", "canary=1", *extra]
    return argv, env


def play(lab, tmp_path, inv, *extra: str, timeout: float = 300, ansible_inventory: Path = INVENTORY
         ) -> tuple[int, dict]:
    argv, env = playbook_cmd(lab, tmp_path, inv, *extra, ansible_inventory=ansible_inventory)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    (tmp_path / "ansible.json").write_text(r.stdout)       # for a look after a failure
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"ansible-playbook rc={r.returncode}: {r.stdout[-3000:]} {r.stderr[-3000:]}") from None


def play_during_probation(lab, tmp_path, inv, d: Path, act, *extra: str) -> tuple[int, dict, str]:
    """Run the playbook; once the host at `d` has a change on probation, `act()`; then let it end."""
    argv, env = playbook_cmd(lab, tmp_path, inv, *extra)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and status(d)["pending"] is None and p.poll() is None:
            time.sleep(0.3)
        assert status(d)["pending"] is not None, f"{d.name} never entered probation"
        act()
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    return p.returncode, json.loads(out), err


def batches(doc: dict) -> list[list[str]]:
    """The hosts each serial batch ran the apply task on, in order."""
    out = []
    for p in doc["plays"]:
        for t in p["tasks"]:
            if t["task"]["name"].lower().startswith("apply through the safety transaction"):
                out.append(sorted(t["hosts"]))
    return out


def task_hosts(doc: dict, prefix: str, key: str = "rc") -> dict[str, object]:
    return {h: r.get(key) for p in doc["plays"] for t in p["tasks"]
            if t["task"]["name"].lower().startswith(prefix.lower()) for h, r in t["hosts"].items()
            if not r.get("skipped")}


def test_canary_then_waves_and_a_failing_wave_is_rolled_back(netns_lab, tmp_path):
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["w0", "w1", "w2", "w3"])
    # w2 is a commodity card whose power limit ends below 650 W: its apply is refused (exit 2)
    shutil.rmtree(dirs["w2"] / "sim")
    r = subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(dirs["w2"] / "sim"), "--sku", "rtx4090"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    w2_before = status(dirs["w2"])["current"]
    rc, doc = play(lab, tmp_path, inv, "-e", f"profile={prof}", "-e", "probation=0", "-e", "wave=2")
    assert rc != 0
    # the canary alone, then the first wave; the play stopped there
    assert batches(doc) == [["w0"], ["w1", "w2"]]
    w0 = status(dirs["w0"])                 # the canary keeps the profile, confirmed
    assert w0["current"]["gpu0.power_limit_w"] == 650 and w0["pending"] is None
    assert w0["recent"][0]["state"] == "confirmed" and doc["stats"]["w0"]["failures"] == 0
    # the failing wave: w1 had applied and is rolled back with it, w2 never changed
    assert set(task_hosts(doc, "roll the whole wave back")) == {"w1", "w2"}
    w1 = status(dirs["w1"])
    assert w1["current"]["gpu0.power_limit_w"] == 700 and w1["pending"] is None
    assert w1["recent"][0]["label"] == "rollback to baseline" and w1["recent"][1]["state"] == "confirmed"
    assert status(dirs["w2"])["current"] == w2_before
    halt = task_hosts(doc, "halt the rollout", "msg")
    assert set(halt) == {"w1", "w2"} and "w2 failed" in str(halt["w1"]) and "650" in str(halt["w1"])
    # the next wave was never touched
    w3 = status(dirs["w3"])
    assert w3["recent"] == [] and w3["current"]["gpu0.power_limit_w"] == 700 and "w3" not in doc["stats"]


def test_an_xid_on_the_canary_halts_the_play_and_rolls_that_host_back(netns_lab, tmp_path):
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["c0", "c1", "c2"])

    def xid() -> None:
        r = mt_local(dirs["c0"], "sim", "inject", str(dirs["c0"] / "sim"), "xid", "79")
        assert r.returncode == 0, r.stderr

    rc, doc, err = play_during_probation(lab, tmp_path, inv, dirs["c0"], xid, "-e", f"profile={prof}",
                                         "-e", "probation=10", "-e", "wave=2")
    assert rc != 0, err
    assert batches(doc) == [["c0"]]                       # the waves never started
    assert task_hosts(doc, "apply through the safety transaction")["c0"] == 1
    assert "Xid 79" in str(task_hosts(doc, "halt the rollout", "msg")["c0"])
    # the canary's own transaction rolled it back; the others were never touched
    c0 = status(dirs["c0"])
    assert c0["current"]["gpu0.power_limit_w"] == 700 and c0["pending"] is None
    assert any(i["type"] == "xid" and i["xid"] == 79 for i in c0["incidents"])
    for n in ("c1", "c2"):
        s = status(dirs[n])
        assert s["recent"] == [] and s["baseline"] == {} and s["current"]["gpu0.power_limit_w"] == 700
        assert not (dirs[n] / "state" / "journal.db").exists()



def untouched(d: Path) -> None:
    s = status(d)
    assert s["recent"] == [] and s["current"]["gpu0.power_limit_w"] == 700, s
    assert not (d / "state" / "journal.db").exists()


@pytest.mark.parametrize("canary", [1, 2])
def test_an_unreachable_canary_halts_the_play_before_any_wave(netns_lab, tmp_path, canary):
    """A canary's address answers nothing (no sshd): nothing was verified there, so no wave may
    start, even when another canary passed; no later-wave host is contacted."""
    lab = netns_lab
    names = ["u0", "u1", "u2", "u3"]
    inv, prof, dirs = setup_fleet(lab, tmp_path, names, dead=("u0",))
    rc, doc = play(lab, tmp_path, inv, "-e", f"profile={prof}", "-e", "probation=0",
                   "-e", f"canary={canary}", "-e", "wave=2")
    assert rc != 0
    assert doc["stats"]["u0"]["unreachable"] >= 1
    later = names[canary:]
    for n in later:
        assert n not in doc["stats"], f"{n} was contacted after the canary was unreachable"
        untouched(dirs[n])
    if canary == 2:  # the reachable canary passed and keeps the profile; the play says why it stopped
        assert batches(doc) == [["u1"]]
        u1 = status(dirs["u1"])
        assert u1["current"]["gpu0.power_limit_w"] == 650 and u1["recent"][0]["state"] == "confirmed"
        halt = str(task_hosts(doc, "halt the rollout", "msg")["u1"])
        assert "u0 unreachable" in halt and "nothing was changed" in halt, halt


def test_an_unreachable_host_in_a_wave_halts_the_play_before_the_next(netns_lab, tmp_path):
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["v0", "v1", "v2", "v3", "v4"], dead=("v2",))
    rc, doc = play(lab, tmp_path, inv, "-e", f"profile={prof}", "-e", "probation=0", "-e", "wave=2")
    assert rc != 0
    assert batches(doc) == [["v0"], ["v1"]] and doc["stats"]["v2"]["unreachable"] >= 1
    # nothing changed on v2, so v1's wave keeps the profile (as earlier waves do)
    for n in ("v0", "v1"):
        assert status(dirs[n])["current"]["gpu0.power_limit_w"] == 650
    assert "v2 unreachable" in str(task_hosts(doc, "halt the rollout", "msg")["v1"])
    for n in ("v2", "v3", "v4"):
        untouched(dirs[n])
    assert "v3" not in doc["stats"] and "v4" not in doc["stats"]


def test_a_host_lost_during_its_apply_counts_as_failed_and_its_wave_is_rolled_back(netns_lab, tmp_path):
    """l1's sshd stops while its apply is on probation (the running session lives on, the next
    connection is refused): its state is unknown, so the wave is rolled back and the play halts."""
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["l0", "l1", "l2", "l3"])
    rc, doc, err = play_during_probation(lab, tmp_path, inv, dirs["l1"], lab.hosts["l1"].stop_sshd,
                                         "-e", f"profile={prof}", "-e", "probation=6", "-e", "wave=2")
    assert rc != 0, err
    assert batches(doc) == [["l0"], ["l1", "l2"]] and doc["stats"]["l1"]["unreachable"] >= 1
    assert set(task_hosts(doc, "roll the whole wave back")) == {"l2"}
    l2 = status(dirs["l2"])
    assert l2["current"]["gpu0.power_limit_w"] == 700 and l2["recent"][0]["label"] == "rollback to baseline"
    assert "l1 lost after preflight" in str(task_hosts(doc, "halt the rollout", "msg")["l2"])
    assert status(dirs["l0"])["current"]["gpu0.power_limit_w"] == 650   # the canary keeps it
    untouched(dirs["l3"])
    assert "l3" not in doc["stats"]


def ini_inventory(inv: Path, out: Path) -> Path:
    """The lab's hosts as a plain INI inventory, the kind deploy/ansible/inventory.example.ini is
    (host variables only, no metaltune inventory script)."""
    doc = yaml.safe_load(inv.read_text())
    d = doc["defaults"]
    lines = ["[canary]"]
    names = list(doc["hosts"])
    for i, n in enumerate(names):
        h = doc["hosts"][n]
        if i == 1:
            lines.append("[gpu]")
        lines.append(f"{n} ansible_host={h['address']} metaltune_env='{json.dumps(h['env'])}'")
    lines += ["[metaltune:children]", "canary", "gpu", "[metaltune:vars]", "ansible_user=root",
              f"ansible_ssh_private_key_file={d['key']}", f"metaltune_python={d['python']}",
              f"ansible_python_interpreter={d['python']}", f"metaltune_cwd={d['cwd']}",
              f"ansible_ssh_common_args=-o UserKnownHostsFile={d['known_hosts']} -o StrictHostKeyChecking=yes"]
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_standard_inventory_and_the_policy_variable(netns_lab, tmp_path):
    """`-e policy=FILE` reaches every host's apply (it had no way in); a plain INI inventory drives
    the play as the dynamic one does."""
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["p0", "p1", "p2"])
    ini = ini_inventory(inv, tmp_path / "hosts.ini")
    strict = tmp_path / "no-power.yaml"   # allows the governor only: a power limit is denied
    strict.write_text("version: 1\ndescription: no power changes\nrules:\n"
                      "  - knob: cpu.governor\n    values: [performance]\n")
    rc, doc = play(lab, tmp_path, inv, "-e", f"profile={prof}", "-e", "probation=0", "-e", "wave=2",
                   "-e", f"policy={strict}", ansible_inventory=ini)
    assert rc != 0 and batches(doc) == [["p0"]]
    assert task_hosts(doc, "apply through the safety transaction")["p0"] == 1
    halt = str(task_hosts(doc, "halt the rollout", "msg")["p0"])
    assert "p0 failed" in halt and "gpu0.power_limit_w" in halt, halt
    copied = task_hosts(doc, "make a private temporary file", "path")["p0"]
    assert not Path(copied).exists()                     # the host's copy is removed
    for n in ("p0", "p1", "p2"):
        assert status(dirs[n])["current"]["gpu0.power_limit_w"] == 700
    # without the variable each host's own (default) policy applies, and the same inventory rolls out
    rc, doc = play(lab, tmp_path, inv, "-e", f"profile={prof}", "-e", "probation=0", "-e", "wave=2",
                   ansible_inventory=ini)
    assert rc == 0 and batches(doc) == [["p0"], ["p1", "p2"]]
    for n in ("p0", "p1", "p2"):
        assert status(dirs[n])["current"]["gpu0.power_limit_w"] == 650
