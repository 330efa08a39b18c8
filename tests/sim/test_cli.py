"""`metaltune sim init|inject|show`, including bad input: one clear error, exit 2, nothing changed."""
from __future__ import annotations

import json

import pytest

from tuner.cli import main


def _snapshot(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_init_show_inject_round_trip(tmp_path, capsys):
    root = tmp_path / "host"
    assert main(["sim", "init", str(root), "--sku", "rtx4090", "--gpus", "2", "--seed", "4"]) == 0
    assert (root / "host.json").is_file()
    assert (root / "sys/bus/pci/devices/0000:01:00.0/config").stat().st_size == 4096
    capsys.readouterr()
    assert main(["sim", "show", str(root), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sku"] == "rtx4090" and len(d["gpus"]) == 2 and d["true_throughput"] > 0
    assert d["gpus"][0]["power_limit_w"] == 450
    assert main(["sim", "inject", str(root), "xid", "43", "--gpu", "1"]) == 0
    assert main(["sim", "inject", str(root), "pcie-replay", "7"]) == 0
    assert main(["sim", "inject", str(root), "aer-fatal"]) == 0
    assert main(["sim", "inject", str(root), "thermal"]) == 0
    capsys.readouterr()
    assert main(["sim", "show", str(root), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["events"] == 1 and d["gpus"][0]["pcie_replay"] == 7
    assert d["gpus"][0]["injected"]["thermal"] is True
    assert "TOTAL_ERR_FATAL 1" in (root / "sys/bus/pci/devices/0000:01:00.0/aer_dev_fatal").read_text()
    kmsg = (root / "dev/kmsg").read_text()
    assert "NVRM: Xid (PCI:0000:02:00): 43, " in kmsg and "PCIe Bus Error: severity=Uncorrected (Fatal)" in kmsg
    assert main(["sim", "inject", str(root), "clear"]) == 0
    capsys.readouterr()
    assert main(["sim", "show", str(root)]) == 0
    assert "GeForce RTX 4090" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["inject", "{root}", "melt"], "unknown event 'melt'"),
    (["inject", "{root}", "xid"], "expected a number"),
    (["inject", "{root}", "xid", "abc"], "whole number"),
    (["inject", "{root}", "xid", "0"], "1..999"),
    (["inject", "{root}", "thermal", "5"], "takes no arguments"),
    (["inject", "{root}", "xid", "79", "--gpu", "3"], "--gpu"),
    (["inject", "{root}/nope", "xid", "79"], "not a simulated host"),
    (["show", "{root}/nope"], "not a simulated host"),
    (["init", "{root}"], "already a simulated host"),
])
def test_bad_input_exits_2_and_changes_nothing(tmp_path, capsys, argv, msg):
    root = tmp_path / "h"
    assert main(["sim", "init", str(root)]) == 0
    before = _snapshot(root)
    capsys.readouterr()
    assert main(["sim", *[a.format(root=root) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert _snapshot(root) == before


@pytest.mark.parametrize("argv,msg", [
    (["--sku", "a100"], "expected one of h200, rtx4090"),
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "9"], "--gpus"),
])
def test_bad_init_options_create_nothing(tmp_path, capsys, argv, msg):
    root = tmp_path / "new"
    assert main(["sim", "init", str(root), *argv]) == 2
    assert msg in capsys.readouterr().err
    assert not root.exists()


def test_vm_and_geforce_refuse_events_they_cannot_have(tmp_path, capsys):
    vm, rtx = tmp_path / "vm", tmp_path / "rtx"
    assert main(["sim", "init", str(vm), "--vm"]) == 0
    assert main(["sim", "init", str(rtx), "--sku", "rtx4090"]) == 0
    assert main(["sim", "inject", str(vm), "aer-correctable"]) == 2
    assert "no AER reporting" in capsys.readouterr().err
    assert main(["sim", "inject", str(rtx), "ecc-dbe"]) == 2
    assert "ECC is off" in capsys.readouterr().err
