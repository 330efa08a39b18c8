"""The fleet over real OpenSSH servers in network namespaces: host keys verified (an unknown key
is refused; trust on first use only when asked, then recorded), an unreachable host reported
without stopping the others."""
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.peers


def inventory(lab, path, names, known_hosts, **per_host_env):
    hosts = {}
    for n in names:
        h = lab.hosts[n]
        hosts[n] = {"address": h.address, "port": h.port, "env": per_host_env.get(n, {})}
    path.write_text(yaml.safe_dump({
        "defaults": {"user": "root", "key": str(lab.client_key), "known_hosts": str(known_hosts),
                     "python": sys.executable, "cwd": str(ROOT), "connect_timeout": 5},
        "hosts": hosts}))
    return path


def fleet(lab, *args, timeout=180):
    return lab.run([sys.executable, "-m", "tuner", "fleet", *args], timeout=timeout, cwd=ROOT)


def test_unknown_key_refused_unreachable_reported_trust_on_first_use(netns_lab, tmp_path):
    lab = netns_lab
    lab.add_host("good")
    lab.add_host("stranger")                 # sshd runs, but its key is not in known_hosts
    lab.add_host("dead", sshd=False)          # nothing listens: connection refused
    kh = lab.known_hosts(["good"])
    inv = inventory(lab, tmp_path / "inv.yaml", ["good", "stranger", "dead"], kh)
    out = tmp_path / "collected"

    r = fleet(lab, "collect", "-I", str(inv), "--out", str(out), "--json")
    assert r.returncode == 1, r.stderr
    res = json.loads(r.stdout)
    assert res["good"]["ok"] and res["good"]["kind"] == "ok"
    assert res["stranger"]["kind"] == "host_key_rejected" and "not in" in res["stranger"]["detail"]
    assert res["dead"]["kind"] == "unreachable"
    facts = json.loads((out / "good" / "compare.json").read_text())["facts"]
    assert facts["cpu_count"] >= 1 and facts["virtualisation"] in ("vm", "bare-metal")
    assert not (out / "stranger" / "compare.json").exists()
    assert kh.read_text().count("\n") == 1                      # nothing was recorded

    # trust on first use, only when asked; the key is then recorded and verified next time
    r = fleet(lab, "collect", "-I", str(inv), "--out", str(out), "--limit", "stranger", "--trust-new", "--json")
    assert r.returncode == 0, r.stderr
    kind, b64 = lab.hosts["stranger"].host_pub.split()[:2]
    assert f"{lab.hosts['stranger'].address} {kind} {b64}" in kh.read_text()
    r = fleet(lab, "collect", "-I", str(inv), "--out", str(out), "--limit", "stranger", "--json")
    assert r.returncode == 0, r.stderr


def test_changed_host_key_is_refused_even_with_trust_new(netns_lab, tmp_path):
    lab = netns_lab
    lab.add_host("h")
    other = lab.add_host("other")
    kh = lab.known_hosts(["h"])
    # known_hosts says "h" has other's key: a man in the middle, or a reinstalled host
    kind, b64 = other.host_pub.split()[:2]
    kh.write_text(f"{lab.hosts['h'].address} {kind} {b64}\n")
    inv = inventory(lab, tmp_path / "inv.yaml", ["h"], kh)
    r = fleet(lab, "collect", "-I", str(inv), "--out", str(tmp_path / "o"), "--trust-new", "--json")
    assert r.returncode == 1
    res = json.loads(r.stdout)["h"]
    assert res["kind"] == "host_key_rejected" and "CHANGED" in res["detail"]
