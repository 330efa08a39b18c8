"""`metaltune compare ssh://...`: the same child runs on remote hosts through paramiko (host keys
verified), here two real sshd hosts in network namespaces, each with its own simulated host."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.peers


def test_compare_two_remote_hosts_over_ssh(netns_lab, tmp_path):
    lab = netns_lab
    targets = []
    for name, extra in (("metal", []), ("cloud", ["--vm"])):
        h = lab.add_host(name)
        sim = tmp_path / f"sim-{name}"
        r = subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(sim), *extra],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
        targets.append(f"ssh://root@{h.address}:22?python={sys.executable}&cwd={ROOT}&sim={sim}")
    kh = lab.known_hosts()
    rep = tmp_path / "rep"
    r = lab.run([sys.executable, "-m", "tuner", "compare", *targets, "--identity", str(lab.client_key),
                 "--known-hosts", str(kh), "--seed", "5", "--json", "--report", str(rep)],
                timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["targets"] == [f"ssh://root@{lab.hosts['metal'].address}:22",
                              f"ssh://root@{lab.hosts['cloud'].address}:22"]
    facts = {f["fact"]: f["values"] for f in doc["facts"]}
    assert facts["virtualisation"] == ["bare-metal", "vm"]
    lat = next(m for m in doc["metrics"] if m["name"] == "launch_eager_us")["comparisons"][0]
    assert lat["verdict"].startswith("worse")
    assert (rep / "report.html").is_file()

    # a target whose host key is unknown is refused; the other target is still measured
    kh.write_text(lab.hosts["metal"].known_hosts_line() + "\n")
    r = lab.run([sys.executable, "-m", "tuner", "compare", *targets, "--identity", str(lab.client_key),
                 "--known-hosts", str(kh), "--json"], timeout=180, cwd=ROOT)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["targets"] == [f"ssh://root@{lab.hosts['metal'].address}:22"]
    assert doc["failed_targets"][0]["kind"] == "host_key_rejected"
