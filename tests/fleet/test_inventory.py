"""The inventory file: defaults, groups, per-host env; bad input named by file and field."""
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.errors import BadInput
from tuner.fleet.inventory import load

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
defaults:
  user: ops
  key: keys/fleet_ed25519
  python: /opt/mt/bin/python
  env: {METALTUNE_STATE_DIR: /var/lib/metaltune, A: "1"}
hosts:
  a1: {address: 10.0.0.1, groups: [canary]}
  a2: {address: 10.0.0.2, port: 2222, user: root, env: {A: "2", METALTUNE_SIM_ROOT: /srv/sim/a2}}
  b1: {address: 10.0.1.1}
groups:
  rack-a: [a1, a2]
"""


def test_defaults_groups_and_env(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(GOOD)
    inv = load(p)
    a1, a2 = inv.hosts["a1"], inv.hosts["a2"]
    assert (a1.user, a1.port, a1.python) == ("ops", 22, "/opt/mt/bin/python")
    assert a1.key == tmp_path / "keys/fleet_ed25519"        # relative to the inventory
    assert (a2.user, a2.port) == ("root", 2222)
    assert a2.env == {"METALTUNE_STATE_DIR": "/var/lib/metaltune", "A": "2", "METALTUNE_SIM_ROOT": "/srv/sim/a2"}
    assert [h.name for h in inv.select("canary,b1")] == ["a1", "b1"]
    assert [h.name for h in inv.select("rack-a")] == ["a1", "a2"]
    with pytest.raises(BadInput, match="neither a host nor a group"):
        inv.select("rack-z")


@pytest.mark.parametrize("text,needle", [
    ("hosts: {a: {address: x, port: 0}}", "field hosts.a.port"),
    ("hosts: {a: {address: x, colour: red}}", "field hosts.a.colour"),
    ("hosts: {a: {port: 22}}", "field hosts.a.address"),
    ("hosts: {}", "field hosts"),
    ("hosts: {a: {address: x}}\ngroups: {g: [a, zz]}", "field groups.g: unknown host 'zz'"),
    ("hosts: {a: {address: x, env: {'1BAD': v}}}", "field hosts.a.env"),
    ("hosts: [a, b]", "field hosts"),
    ("hosts: {a: {address: x}\n", "not valid YAML"),
    ("- just a list", "expected a mapping"),
])
def test_bad_inventory_names_file_and_field(tmp_path, text, needle):
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    with pytest.raises(BadInput) as e:
        load(p)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_cli_bad_inventory_exits_2_and_contacts_nobody(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text("hosts: {a: {address: 10.0.0.1, port: seventy}}")
    r = subprocess.run([sys.executable, "-m", "tuner", "fleet", "status", "-I", str(p)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert "hosts.a.port" in r.stderr and str(p) in r.stderr
