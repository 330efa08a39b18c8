"""`metaltune fleet apply` over real sshd hosts in network namespaces, each host running metaltune
on its own simulated GPU host: the rollout applies a profile in waves; an unreachable host is
reported and picked up on resume; injected instability on the canary halts the rollout and
nothing else changes; a measured regression rolls the wave back."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.peers

PROFILE = """description: fleet test profile
match:
  gpu_name: ["NVIDIA H200*"]
knobs:
  {knobs}
"""


def local_env(d: Path) -> dict[str, str]:
    return {"METALTUNE_BACKEND": "sim", "METALTUNE_SIM_ROOT": str(d / "sim"),
            "METALTUNE_STATE_DIR": str(d / "state"), "METALTUNE_RUN_DIR": str(d / "run")}


def mt_local(d: Path, *args, timeout=60):
    """metaltune on a host's simulated machine, from the test process (no SSH): to look."""
    env = {**os.environ, **local_env(d)}
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def status(d: Path) -> dict:
    r = mt_local(d, "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def setup_fleet(lab, tmp_path, names, dead=(), knobs="gpu*.power_limit_w: 650"):
    hosts = {}
    dirs = {}
    for n in names:
        h = lab.add_host(n, sshd=n not in dead)
        d = tmp_path / n
        r = subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(d / "sim")],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
        dirs[n] = d
        hosts[n] = {"address": h.address, "env": local_env(d)}
    inv = tmp_path / "fleet.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"user": "root", "key": str(lab.client_key), "known_hosts": str(lab.known_hosts()),
                     "python": sys.executable, "cwd": str(ROOT), "connect_timeout": 5},
        "hosts": hosts}))
    prof = tmp_path / "fleet-test.yaml"
    prof.write_text(PROFILE.format(knobs=knobs))
    return inv, prof, dirs


def fleet(lab, tmp_path, *args, timeout=240):
    return lab.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp_path / "ctl"), "fleet", *args],
                   timeout=timeout, cwd=ROOT)


def power(d: Path) -> int:
    return status(d)["current"]["gpu0.power_limit_w"]


def test_rollout_in_waves_unreachable_reported_then_resumed(netns_lab, tmp_path):
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["a0", "a1", "a2", "late"], dead=("late",))
    state = tmp_path / "rollout.json"
    args = ["apply", str(prof), "-I", str(inv), "--canary", "1", "--wave-size", "2",
            "--probation", "1", "--state", str(state), "--json"]
    r = fleet(lab, tmp_path, *args)
    assert r.returncode == 1, r.stderr                    # incomplete: one host not reached
    doc = json.loads(r.stdout)
    assert doc["status"] == "incomplete"
    assert doc["waves"] == [["a0"], ["a1", "a2"], ["late"]]
    states = {n: h["state"] for n, h in doc["hosts"].items()}
    assert states == {"a0": "done", "a1": "done", "a2": "done", "late": "unreachable"}
    assert [power(dirs[n]) for n in ("a0", "a1", "a2", "late")] == [650, 650, 650, 700]
    assert json.loads(state.read_text())["status"] == "incomplete"

    # the host comes up; the same command resumes and touches only what is left
    lab.start_sshd(lab.hosts["late"])
    before = {n: len(status(dirs[n])["recent"]) for n in ("a0", "a1", "a2")}
    r = fleet(lab, tmp_path, *args)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "done" and doc["hosts"]["late"]["state"] == "done"
    assert power(dirs["late"]) == 650
    assert {n: len(status(dirs[n])["recent"]) for n in ("a0", "a1", "a2")} == before

    r = fleet(lab, tmp_path, "verify", str(prof), "-I", str(inv), "--json")
    assert r.returncode == 0, r.stderr
    assert all(v["ok"] and v["data"]["ok"] for v in json.loads(r.stdout).values())
    r = fleet(lab, tmp_path, "status", "-I", str(inv))
    assert r.returncode == 0 and "1 knob(s) changed from baseline" in r.stdout

    # collect: each host's status, facts and benchmarks, and one report comparing them
    out = tmp_path / "collected"
    r = fleet(lab, tmp_path, "collect", "-I", str(inv), "--out", str(out), "--bench", "--repeats", "3",
              "--limit", "a0,late")
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "a0" / "compare.json").read_text())
    assert run["backend"] == "sim" and run["sim_root"] == str(dirs["a0"] / "sim")
    assert json.loads((out / "late" / "status.json").read_text())["status"]["current"]["gpu0.power_limit_w"] == 650
    rep = json.loads((out / "report" / "report.json").read_text())
    assert rep["targets"] == ["a0", "late"] and len(rep["metrics"]) >= 10


def test_an_unreachable_canary_halts_before_any_wave_and_resumes_when_it_is_back(netns_lab,
                                                                                   tmp_path):
    """No wave runs on an unverified canary: the rollout halts after the canary wave with the
    canary unreachable, touches no other host, and --resume-halted retries the canary first."""
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["k0", "w1", "w2"], dead=("k0",))
    state = tmp_path / "rollout.json"
    args = ["apply", str(prof), "-I", str(inv), "--canary", "1", "--wave-size", "2",
            "--probation", "1", "--state", str(state), "--json"]
    r = fleet(lab, tmp_path, *args)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "halted" and "canary k0 not reached" in doc["halt_reason"]
    assert {n: h["state"] for n, h in doc["hosts"].items()} == {
        "k0": "unreachable", "w1": "pending", "w2": "pending"}
    for n in ("w1", "w2"):
        assert status(dirs[n])["recent"] == [] and power(dirs[n]) == 700
    lab.start_sshd(lab.hosts["k0"])
    r = fleet(lab, tmp_path, *args, "--resume-halted")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "done" and [power(dirs[n]) for n in ("k0", "w1", "w2")] == [650] * 3


def test_instability_on_the_canary_halts_and_nothing_else_changes(netns_lab, tmp_path):
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["c0", "c1", "c2"])
    state = tmp_path / "rollout.json"
    # the plan first: waves and what each host would change, nothing written anywhere
    r = fleet(lab, tmp_path, "apply", str(prof), "-I", str(inv), "--canary", "1", "--dry-run", "--json",
              "--state", str(state))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["waves"] == [["c0"], ["c1", "c2"]]
    assert all(h["detail"] == "gpu0.power_limit_w -> 650" for h in plan["hosts"].values())
    assert not state.exists() and power(dirs["c0"]) == 700
    cmd = ["ip", "netns", "exec", lab.client_ns, sys.executable, "-m", "tuner", "--state-dir",
           str(tmp_path / "ctl"), "fleet", "apply", str(prof), "-I", str(inv), "--canary", "1",
           "--probation", "10", "--state", str(state), "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and status(dirs["c0"])["pending"] is None:
            time.sleep(0.3)
        assert status(dirs["c0"])["pending"] is not None, "the canary never entered probation"
        r = mt_local(dirs["c0"], "sim", "inject", str(dirs["c0"] / "sim"), "xid", "79")
        assert r.returncode == 0, r.stderr
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    doc = json.loads(out)
    assert doc["status"] == "halted" and "Xid 79" in doc["halt_reason"]
    assert doc["hosts"]["c0"]["state"] == "failed"
    assert doc["hosts"]["c1"]["state"] == doc["hosts"]["c2"]["state"] == "pending"
    # the canary's own transaction rolled it back; the others were never touched
    c0 = status(dirs["c0"])
    assert c0["current"]["gpu0.power_limit_w"] == 700 and c0["pending"] is None
    assert any(i["type"] == "xid" and i["xid"] == 79 for i in c0["incidents"])
    for n in ("c1", "c2"):
        s = status(dirs[n])
        assert s["recent"] == [] and s["baseline"] == {} and s["current"]["gpu0.power_limit_w"] == 700
        assert not (dirs[n] / "state" / "journal.db").exists()
    # a halted rollout does not resume by accident
    r = fleet(lab, tmp_path, "apply", str(prof), "-I", str(inv), "--state", str(state))
    assert r.returncode == 2 and "--resume-halted" in r.stderr


def test_regression_rolls_the_wave_back(netns_lab, tmp_path):
    lab = netns_lab
    # graphics clocks locked at 1200 MHz: allowed by the policy and stable, but the sim's model
    # runs its workload ~9% slower than at default clocks
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["r0", "r1", "r2"], knobs="gpu*.locked_clocks_mhz: [1200, 1200]")
    r = fleet(lab, tmp_path, "apply", str(prof), "-I", str(inv), "--canary", "2", "--probation", "0",
              "--metric", "decode_tok_s", "--repeats", "4", "--state", str(tmp_path / "s.json"), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "halted" and "regression in decode_tok_s" in doc["halt_reason"]
    for n in ("r0", "r1"):
        h = doc["hosts"][n]
        assert h["state"] == "rolled_back" and h["ratio"] < 0.95 and h["regression"]
        assert status(dirs[n])["current"]["gpu0.locked_clocks_mhz"] is None
    assert doc["hosts"]["r2"]["state"] == "pending" and status(dirs["r2"])["recent"] == []


def test_controller_killed_mid_probation_resumes_cleanly(netns_lab, tmp_path):
    """kill -9 of `fleet apply` while the canary is on probation: the host's own transaction
    finishes by itself, and the same command resumes (waiting for that probation to settle)."""
    lab = netns_lab
    inv, prof, dirs = setup_fleet(lab, tmp_path, ["k0", "k1"])
    state = tmp_path / "rollout.json"
    args = ["apply", str(prof), "-I", str(inv), "--canary", "1", "--probation", "5",
            "--state", str(state), "--json"]
    p = subprocess.Popen(["ip", "netns", "exec", lab.client_ns, sys.executable, "-m", "tuner",
                          "--state-dir", str(tmp_path / "ctl"), "fleet", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and status(dirs["k0"])["pending"] is None:
            time.sleep(0.3)
        assert status(dirs["k0"])["pending"] is not None
    finally:
        p.kill()          # ip netns exec execs python: this is the controller itself
        p.wait(10)
    doc = json.loads(state.read_text())
    assert doc["status"] == "running" and doc["hosts"]["k1"]["state"] == "pending"
    r = fleet(lab, tmp_path, *args)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "done" and {h["state"] for h in doc["hosts"].values()} == {"done"}
    assert power(dirs["k0"]) == power(dirs["k1"]) == 650
