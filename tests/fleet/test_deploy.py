"""What ships for users who outgrow SSH fan-out: the Ansible inventory bridge and playbook, the
Kubernetes DaemonSets. Checked for consistency with the CLI they call."""
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_ansible_dynamic_inventory_mirrors_the_fleet_inventory(tmp_path):
    inv = tmp_path / "fleet.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"user": "ops", "key": "/keys/id", "python": "/opt/mt/bin/python", "known_hosts": "/keys/known_hosts",
                     "env": {"METALTUNE_STATE_DIR": "/var/lib/metaltune"}},
        "hosts": {"a1": {"address": "10.0.0.1", "groups": ["canary"]},
                  "a2": {"address": "10.0.0.2", "port": 2222}}}))
    env = {"METALTUNE_INVENTORY": str(inv), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(DEPLOY / "ansible/metaltune_inventory.py"), "--list"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    hv = doc["_meta"]["hostvars"]
    assert hv["a2"] == {"ansible_host": "10.0.0.2", "ansible_port": 2222, "ansible_user": "ops",
                        "ansible_ssh_private_key_file": "/keys/id", "metaltune_python": "/opt/mt/bin/python",
                        "ansible_python_interpreter": "/opt/mt/bin/python", "ansible_timeout": 10,
                        "ansible_ssh_common_args": "-o UserKnownHostsFile=/keys/known_hosts -o StrictHostKeyChecking=yes",
                        "metaltune_env": {"METALTUNE_STATE_DIR": "/var/lib/metaltune"}}
    assert doc["canary"] == {"hosts": ["a1"]} and doc["all"]["hosts"] == ["a1", "a2"]
    inv.write_text("hosts: {a1: {port: 22}}")
    r = subprocess.run([sys.executable, str(DEPLOY / "ansible/metaltune_inventory.py"), "--list"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "hosts.a1.address" in r.stderr


def _metaltune_commands() -> set[str]:
    r = subprocess.run([sys.executable, "-m", "tuner", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return set(re.findall(r"│ (\w+)\s", r.stdout))


def test_playbook_is_canary_then_waves_and_calls_real_commands():
    play = yaml.safe_load((DEPLOY / "ansible/rollout.yml").read_text())[0]
    assert play["serial"] == ["{{ canary | default(1) }}", "{{ wave | default('25%') }}"]
    # halt on one failure, but let the failed wave's rollback task run first (tests/fleet/test_rollout_ansible.py)
    assert play["max_fail_percentage"] == 0 and not play.get("any_errors_fatal")
    text = (DEPLOY / "ansible/rollout.yml").read_text()
    used = set(re.findall(r"\{\{ metaltune \}\} (\w+)", text))
    assert {"status", "apply", "verify", "rollback"} <= used
    assert used <= _metaltune_commands()


def test_daemonsets_are_disjoint_canary_and_main_with_verify_readiness():
    main = list(yaml.safe_load_all((DEPLOY / "k8s/metaltune-daemonset.yaml").read_text()))[1]
    canary = yaml.safe_load((DEPLOY / "k8s/metaltune-canary.yaml").read_text())
    for ds in (main, canary):
        spec = ds["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        c = spec["template"]["spec"]["containers"][0]
        assert c["securityContext"]["privileged"] is True
        assert "metaltune verify" in " ".join(c["readinessProbe"]["exec"]["command"])
        script = c["args"][0]
        used = set(re.findall(r"metaltune (\w+)", script))
        assert used == {"recover", "apply", "daemon"} and used <= _metaltune_commands()
    assert main["spec"]["selector"] != canary["spec"]["selector"]

    def op(ds):
        t = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        return t["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"]

    assert {op(main), op(canary)} == {"In", "NotIn"}
