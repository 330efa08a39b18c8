"""A journal that is not the one metaltune wrote (issue 15, item 2): emptied, deleted, cut in half,
overwritten by another journal, or replaced by an older copy of itself, while its anchor says a
change is in force. Each is detected; nothing is recorded over it (exit 1, one line, no
traceback); `baseline --accept-current` and `recover --from-defaults` are the ways out."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from safety import Journal

REPO = Path(__file__).resolve().parents[2]


def cli(tmp: Path, sim: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")}
    env.update(PYTHONPATH=str(REPO), METALTUNE_RUN_DIR=str(tmp / "no-daemon"))
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp / "state"),
                           "--backend", "sim", "--sim-root", str(sim), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def refused(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "recover --from-defaults" in r.stderr and "baseline --accept-current" in r.stderr
    return r.stderr


def power(sim: Path, gpu: int = 0) -> float:
    from tuner.sim.fake_pynvml import FakeNVML

    nv = FakeNVML(sim)
    nv.nvmlInit()
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(gpu)) / 1000.0
    finally:
        nv.nvmlShutdown()


@pytest.fixture
def tuned(tmp_path):
    """A sim host with a confirmed change in force: gpu0 power limit 700 -> 600."""
    sim = tmp_path / "sim"
    ok(subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(sim), "--sku", "h200"],
                      capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}))
    for watts in (550, 600, 650):
        (tmp_path / f"p{watts}.yaml").write_text(f"name: p{watts}\nknobs:\n  gpu0.power_limit_w: {watts}\n")
    ok(cli(tmp_path, sim, "apply", str(tmp_path / "p600.yaml"), "--probation", "0.2"))
    assert power(sim) == 600
    return tmp_path, sim


def damage(tmp: Path, sim: Path, how: str) -> str:
    """Damage the journal as a careless operator or a bad restore does; the text it is named by."""
    j = tmp / "state" / "journal.db"
    if how == "emptied":
        os.truncate(j, 0)
        return "is empty (0 bytes)"
    if how == "deleted":
        j.unlink()
        return "is missing"
    if how == "cut in half":
        os.truncate(j, j.stat().st_size // 2)
        return "not a readable SQLite database"
    if how == "overwritten":
        Journal(tmp / "elsewhere" / "journal.db").close()  # a sound journal, just not this one
        shutil.copy(tmp / "elsewhere" / "journal.db", j)
        return "it is not the journal metaltune wrote here"
    if how == "an older copy":
        shutil.copy(j, tmp / "backup.db")
        ok(cli(tmp, sim, "apply", str(tmp / "p650.yaml"), "--probation", "0.2"))
        shutil.copy(tmp / "backup.db", j)  # "restored from last night's backup"
        return "ends at transaction 1 but its anchor records transaction 2"
    raise AssertionError(how)


HOW = ["emptied", "deleted", "cut in half", "overwritten", "an older copy"]


@pytest.mark.parametrize("how", HOW)
def test_damage_is_detected_and_nothing_recorded_over_it(tuned, how):
    tmp, sim = tuned
    what = damage(tmp, sim, how)
    held = power(sim)
    for args in (["apply", str(tmp / "p550.yaml"), "--probation", "0.2"], ["status"], ["rollback"],
                 ["recover"], ["confirm"]):
        err = refused(cli(tmp, sim, *args))
        assert what in err and "gpu0.power_limit_w" in err, err
    assert power(sim) == held  # nothing was written


@pytest.mark.parametrize("how", ["emptied", "overwritten"])
def test_accept_current_starts_a_new_journal_with_the_values_in_force(tuned, how):
    tmp, sim = tuned
    damage(tmp, sim, how)
    r = ok(cli(tmp, sim, "baseline", "--accept-current"))
    assert "baseline accepted: gpu0.power_limit_w = 600" in r.stdout, r.stdout
    assert power(sim) == 600  # nothing is written: the operator accepted what is there
    st = json.loads(ok(cli(tmp, sim, "status", "--json")).stdout)
    assert st["baseline"] == {"gpu0.power_limit_w": 600} and st["pending"] is None
    assert list((tmp / "state").glob("journal.db.damaged-*"))  # kept for inspection
    ok(cli(tmp, sim, "apply", str(tmp / "p650.yaml"), "--probation", "0.2"))
    assert power(sim) == 650
    ok(cli(tmp, sim, "rollback"))
    assert power(sim) == 600  # back to the accepted baseline


@pytest.mark.parametrize("how", ["deleted", "cut in half", "an older copy"])
def test_from_defaults_restores_driver_defaults_and_makes_them_the_baseline(tuned, how):
    tmp, sim = tuned
    damage(tmp, sim, how)
    r = ok(cli(tmp, sim, "recover", "--from-defaults"))
    assert "restored to driver defaults: gpu0.power_limit_w" in r.stdout, r.stdout
    assert power(sim) == 700
    st = json.loads(ok(cli(tmp, sim, "status", "--json")).stdout)
    assert st["baseline"] == {"gpu0.power_limit_w": 700}
    assert st["recent"][0]["label"] == "recover --from-defaults" and st["recent"][0]["state"] == "confirmed"


def test_a_sound_journal_without_an_anchor_gets_one(tuned):
    """Journals written before anchors existed (or an anchor removed by hand) are adopted."""
    tmp, sim = tuned
    a = tmp / "state" / "journal.anchor"
    first = json.loads(a.read_text())
    assert first["in_force"][0]["knob"] == "gpu0.power_limit_w" and first["in_force"][0]["value"] == 600
    a.unlink()
    ok(cli(tmp, sim, "apply", str(tmp / "p650.yaml"), "--probation", "0.2"))
    again = json.loads(a.read_text())
    assert again["journal_id"] == first["journal_id"] and again["last_txn"] == 2
    assert again["in_force"][0]["value"] == 650 and again["baseline"][0]["value"] == 700
    ok(cli(tmp, sim, "rollback"))
    assert json.loads(a.read_text())["in_force"] == []  # back at baseline: nothing in force


def test_journal_and_anchor_both_damaged(tuned):
    """The journal cut in half and its anchor gone: what is in force is unknown. Still refused;
    `recover --from-defaults` then restores every knob that takes effect now and reports a driver
    default, and stages nothing for a reboot on a guess."""
    tmp, sim = tuned
    damage(tmp, sim, "cut in half")
    (tmp / "state" / "journal.anchor").unlink()
    err = refused(cli(tmp, sim, "apply", str(tmp / "p550.yaml"), "--probation", "0.2"))
    assert "its anchor is gone too" in err
    r = ok(cli(tmp, sim, "recover", "--from-defaults", "--json"))
    res = json.loads(r.stdout)
    assert "gpu0.power_limit_w" in res["restored"] and power(sim) == 700
    assert res["baseline"]["gpu0.power_limit_w"] == 700
    staged = [s for s in res["skipped"] if s["knob"].startswith("bios.")]
    assert staged and all("no record that metaltune changed it" in s["why"] for s in staged)
