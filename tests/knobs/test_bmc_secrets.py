"""BMC credentials never leave the process: a password in the BMC URL is used (HTTP Basic auth
against the BMC double) but is not in the knobs' identity, the journal, `host --json`, the logs
or any error; a bad bmc.yaml fails loudly (exit 2, one line naming the file and field, no
value echoed); an inventory with an unknown `password:` field does not print it."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from safety import Journal, Policy, Transaction
from tests.profiles import simhost
from tuner.errors import BadInput
from tuner.knobs import registry
from tuner.sim import bmc
from tuner.sim.hostinit import init_host

ROOT = Path(__file__).resolve().parents[2]
PW = "s3cr3t-Pw-9"
PERMISSIVE = {"version": 1, "forbidden": [], "rules": [{"knob": "bios.*", "allow_reboot_effect": True}]}


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _one_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def host_with_url_password(tmp_path):
    root = init_host(tmp_path / "h", "h200")
    bmc.BmcDouble(root).update(auth={"user": "metaltune", "password": PW})
    (root / "etc/metaltune/bmc.yaml").write_text(
        f"method: redfish\nurl: sim-bmc://metaltune:{PW}@local\n")
    return root


def test_password_in_the_url_authenticates_but_is_never_stored_or_shown(host_with_url_password,
                                                                        tmp_path, caplog):
    root = host_with_url_password
    caplog.set_level(logging.DEBUG)
    knobs = registry.discover(simhost.host(root))
    k = knobs["bios.ProcCStates"]
    assert k.read() == "Enabled"  # the URL's credentials did authenticate
    assert PW not in k.identity() and k.identity() == "bmc:sim-bmc://local"
    j = Journal(tmp_path / "state" / "journal.db")
    txn = Transaction(j, knobs, {"bios.ProcCStates": "Disabled"},
                      policy=Policy.from_dict(PERMISSIVE), probation_s=30, watchdog="thread")
    txn.begin()
    txn.rollback("test")
    assert j.baseline()["bios.ProcCStates"]["identity"] == "bmc:sim-bmc://local"
    for f in (tmp_path / "state").iterdir():
        assert PW.encode() not in f.read_bytes(), f"password stored in {f.name}"
    assert PW not in caplog.text
    p = cli("--backend", "sim", "--sim-root", str(root), "host", "--json")
    assert p.returncode == 0, p.stderr
    assert "bios.ProcCStates" in p.stdout
    assert PW not in p.stdout + p.stderr


def test_malformed_bmc_yaml_fails_loudly_without_echoing_the_line(host_with_url_password,
                                                                   caplog):
    root = host_with_url_password
    (root / "etc/metaltune/bmc.yaml").write_text(
        f"method: redfish\nurl: sim-bmc://metaltune:{PW}@local: [\n")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BadInput, match=r"bmc.yaml: (malformed|not valid) YAML at line") as ei:
        registry.discover(simhost.host(root))
    assert PW not in str(ei.value) and PW not in caplog.text
    p = cli("--backend", "sim", "--sim-root", str(root), "host", "--json")
    assert p.returncode == 2, (p.stdout, p.stderr)
    line = _one_line(p.stderr)
    assert "bmc.yaml" in line and PW not in p.stdout + p.stderr


@pytest.mark.parametrize("body,field", [
    ("method: redfish\nurl: sim-bmc://local\npasswd: {pw}\n", "passwd"),
    ("method: redfish\nurl: sim-bmc://local\nusername: [metaltune, {pw}]\n", "username"),
    ("method: telnet\nurl: sim-bmc://local\nusername: {pw}\n", "method"),
])
def test_bad_bmc_yaml_is_exit_2_naming_file_and_field(host_with_url_password, body, field):
    root = host_with_url_password
    (root / "etc/metaltune/bmc.yaml").write_text(body.format(pw=PW))
    p = cli("--backend", "sim", "--sim-root", str(root), "host", "--json")
    assert p.returncode == 2, (p.stdout[-300:], p.stderr)
    line = _one_line(p.stderr)
    assert "bmc.yaml" in line and f"field {field}" in line, line
    assert PW not in p.stdout + p.stderr


def test_inventory_unknown_password_field_is_not_printed(tmp_path):
    from tuner.fleet import inventory

    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  h1:\n    address: 127.0.0.1\n    password: {PW}\n")
    with pytest.raises(BadInput, match="field hosts.h1.password") as ei:
        inventory.load(inv)
    assert PW not in str(ei.value)
    prof = tmp_path / "p.yaml"
    prof.write_text("name: p\nknobs:\n  gpu0.power_limit_w: 600\n")
    p = cli("--state-dir", str(tmp_path / "s"), "fleet", "apply", str(prof), "--inventory", str(inv))
    assert p.returncode == 2, (p.stdout, p.stderr)
    line = _one_line(p.stderr)
    assert "password" in line and PW not in p.stdout + p.stderr


def test_redact_masks_url_credentials_and_remembered_secrets():
    from tuner import redact

    assert redact.text("GET https://admin:hunter2x@10.0.0.1/redfish failed") == \
        "GET https://admin:***@10.0.0.1/redfish failed"
    redact.remember("Zq9-remembered")
    assert "Zq9-remembered" not in redact.text("401 for password Zq9-remembered")
    assert redact.split_url("https://u:p%40ss@h:8443/x") == ("https://h:8443/x", "u", "p@ss")
