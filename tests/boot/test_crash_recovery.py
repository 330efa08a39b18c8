"""The daemon (or `boot try`) dying at every step of a trial: the next start finishes it from the
journal, and at no moment is a trial entry the default boot entry unless its gate passed.

Each step is a crash point (safety._crash). In-process, the point raises `Died`, a BaseException
nothing in the trial path catches, so the process "stops" there with what it committed; one
subprocess run checks the same with a real SIGKILL."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from safety import _crash
from safety.boot_journal import BootTrials
from safety.journal import Journal
from tests.boot.conftest import POLICY, needs_grub
from tests.simhelpers import REPO
from tuner.boot.grub import Grub
from tuner.host import Host
from tuner.ops import boot as ops
from tuner.ops.settings import Settings
from tuner.sim import boot as simboot
from tuner.sim.hostinit import init_host

pytestmark = needs_grub

TRY_POINTS = ["boot.measured", "boot.intent", "boot.entry_written", "boot.armed",
              "boot.armed_journalled", "boot.rebooting"]
PROMOTE_POINTS = ["gate.gating", "gate.measured", "gate.promoting", "gate.promoted_entry"]
DEMOTE_POINTS = ["gate.gating", "gate.measured", "gate.demoting", "gate.undone", "gate.demoted"]


class Died(BaseException):
    pass


@pytest.fixture
def crash_at(monkeypatch):
    where: dict[str, str | None] = {"at": None}

    def point(name: str) -> None:
        if name == where["at"]:
            raise Died(name)

    monkeypatch.setattr(_crash, "point", point)
    return where


def host(tmp_path, name):
    root = init_host(tmp_path / name)
    pol = tmp_path / "policy.yaml"
    pol.write_text(POLICY)
    return Settings(state_dir=tmp_path / f"{name}-state", backend="sim", sim_root=root), str(pol)


def trial_state(s: Settings) -> dict:
    return BootTrials(Journal.in_state_dir(s.state_dir)).all(1)[0]


def gate(s: Settings) -> dict:
    return ops.boot_gate(s, probation=0.0)


def default_is_safe(s: Settings) -> None:
    """The invariant: a metaltune entry is the default only once its gate passed."""
    d = Grub(Host("sim", s.sim_root)).default()
    if d is not None:
        t = trial_state(s)
        assert t["entry"] == d and t["state"] in ("promoting", "promoted"), (d, t)


def finish(s: Settings) -> dict:
    """Start after start (and reboot when asked) until the trial is final."""
    for _ in range(4):
        res = gate(s)
        default_is_safe(s)
        if res["state"] in ("promoted", "rolled_back", "lost", "aborted"):
            return res
        simboot.reboot(s.sim_root)
    raise AssertionError(f"trial never finished: {res}")


@pytest.mark.parametrize("point", TRY_POINTS)
def test_boot_try_dying_at_each_step(tmp_path, crash_at, point):
    s, pol = host(tmp_path, "h")
    base = (s.sim_root / "proc/cmdline").read_text()
    crash_at["at"] = point
    with pytest.raises(Died):
        ops.boot_try(s, ["boot.cmdline.iommu=pt"], policy=pol, repeats=3)
    crash_at["at"] = None
    default_is_safe(s)
    if point == "boot.measured":  # nothing journalled, nothing written
        assert gate(s)["trial"] is None and not (s.sim_root / "boot/grub/custom.cfg").exists()
        return
    res = finish(s)
    if point == "boot.rebooting":  # the reboot was asked for: the trial goes on
        assert res["state"] == "promoted"
    else:  # the same boot: no reboot came; disarmed and removed
        assert res["state"] == "aborted", res
        g = Grub(Host("sim", s.sim_root))
        assert g.armed() is None and g.find("metaltune-trial-1") is None
        assert simboot.reboot(s.sim_root)["cmdline"].strip() == base.strip()


@pytest.mark.parametrize("change,point", [("boot.cmdline.iommu=pt", p) for p in PROMOTE_POINTS]
                         + [("boot.cmdline.intel_iommu=on", p) for p in DEMOTE_POINTS])
def test_the_gate_dying_at_each_step(tmp_path, crash_at, change, point):
    s, pol = host(tmp_path, "h")
    base = (s.sim_root / "proc/cmdline").read_text().strip()
    ops.boot_try(s, [change], policy=pol, repeats=3)
    simboot.reboot(s.sim_root)
    crash_at["at"] = point
    with pytest.raises(Died):
        gate(s)
    crash_at["at"] = None
    default_is_safe(s)
    res = finish(s)
    if point in ("gate.gating", "gate.measured"):  # a half-run gate never promotes
        assert res["state"] == "rolled_back"
    else:
        assert res["state"] == ("promoted" if "iommu=pt" in change else "rolled_back"), res
    line = simboot.reboot(s.sim_root)["cmdline"]
    assert (change.split(".", 2)[2] in line) == (res["state"] == "promoted")
    if res["state"] != "promoted":
        assert line == base


def test_a_real_sigkill_mid_gate_is_recovered_at_the_next_start(tmp_path):
    s, pol = host(tmp_path, "h")
    ops.boot_try(s, ["boot.cmdline.iommu=pt"], policy=pol, repeats=3)
    simboot.reboot(s.sim_root)
    env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_BACKEND": "sim",
           "METALTUNE_SIM_ROOT": str(s.sim_root), "METALTUNE_STATE_DIR": str(s.state_dir),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "METALTUNE_NO_DAEMON": "1",
           "METALTUNE_CRASH_AT": "3"}  # gating, measured, promoting: dies before the loader write
    r = subprocess.run([sys.executable, "-m", "tuner", "boot", "gate", "--probation", "0"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    assert trial_state(s)["state"] == "promoting"
    assert Grub(Host("sim", s.sim_root)).default() is None
    assert finish(s)["state"] == "promoted"
    assert Grub(Host("sim", s.sim_root)).default() == "metaltune-trial-1"


def test_a_fatal_incident_during_the_probation_demotes_the_trial(tmp_path):
    import threading

    from tuner.sim.inject import inject

    s, pol = host(tmp_path, "h")
    ops.boot_try(s, ["boot.cmdline.iommu=pt"], policy=pol, repeats=3)  # a winner otherwise
    simboot.reboot(s.sim_root)
    t = threading.Timer(0.5, lambda: inject(s.sim_root, "xid", ["79"]))
    t.start()
    try:
        res = ops.boot_gate(s, probation=3.0)
    finally:
        t.join()
    assert res["state"] == "demoted" and "79" in res["reason"], res
    assert Grub(Host("sim", s.sim_root)).default() is None
    assert finish(s)["state"] == "rolled_back"
