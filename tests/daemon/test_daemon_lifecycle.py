"""The daemon as systemd runs it: a child process on a simulated host, with a bound NOTIFY_SOCKET.
READY, watchdog pings, STATUS; the CLI through the socket; SIGTERM/SIGHUP; crash recovery."""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import threading
import time

import pytest

from tests.daemon.conftest import power_limit_w, write_config, write_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def test_ready_watchdog_status_and_cli(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg, watchdog_usec=400_000)  # WatchdogSec=0.4s -> a ping every 0.2 s
    ready = d.wait_ready()
    assert ready["STATUS"].startswith("running") and ready["MAINPID"] == str(d.pid)

    # watchdog pings at half the interval systemd asked for
    n0 = len(d.notify.msgs)
    time.sleep(1.5)
    pings = [t for t, m in d.notify.msgs[n0:] if m.get("WATCHDOG") == "1"]
    assert len(pings) >= 5, d.notify.msgs[n0:]
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert 0.1 <= statistics.median(gaps) <= 0.35, gaps

    # the CLI goes through the socket: the answer carries the daemon's own state
    r = d.cli("status", "--json")
    st = json.loads(r.stdout)
    assert st["daemon"]["pid"] == d.pid and st["daemon"]["phase"] == "running"
    assert st["daemon"]["heavy_modules"] == []  # no torch/triton/optuna in the resident process
    assert st["pending"] is None

    # a write through the socket: apply a profile; STATUS and the log follow
    prof = write_profile(tmp_path / "p.yaml", 600)
    n1 = len(d.notify.msgs)
    r = d.cli("apply", str(prof), "--probation", "0.5")
    assert power_limit_w(sim_host) == 600
    d.wait_log("event=change.confirmed")
    log = d.log()
    assert "event=request op=apply" in log and "knob=gpu0.power_limit_w" in log
    d.notify.wait(lambda m: "STATUS" in m and "probation txn" in m["STATUS"], after=n1)
    st = d.call("status")["result"]
    assert st["pending"] is None and st["current"]["gpu0.power_limit_w"] == 600

    # unknown operations and bad arguments are one clear error each, not a dead daemon
    bad = d.call("no-such-op")
    assert bad["ok"] is False and bad["exit_code"] == 2 and "unknown operation" in bad["error"]
    bad = d.call("verify")  # its required argument is missing
    assert bad["ok"] is False and bad["exit_code"] == 2 and "profile" in bad["error"]

    assert d.stop() == 0
    assert any(m.get("STOPPING") == "1" for _, m in d.notify.msgs)
    assert power_limit_w(sim_host) == 600  # stop policy "keep": the tuned state stays


def test_concurrent_clients_and_single_writer(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    results: dict[str, dict] = {}
    t = threading.Thread(target=lambda: results.update(apply=d.call("apply", profile=str(prof), probation_s=3)))
    t.start()
    d.wait_log("event=change.applied")
    # reads are served while the write is in probation
    reads = [d.call("status") for _ in range(5)]
    assert all(r["ok"] for r in reads)
    assert reads[-1]["result"]["pending"]["state"] == "probation"  # answered during the write
    # a second writer meanwhile: refused or serialised, never interleaved
    second = d.call("rollback")
    t.join()
    assert results["apply"]["ok"], results
    assert second["ok"]  # it waited for the apply, then restored the baseline
    assert power_limit_w(sim_host) == 700
    # and a second daemon on the same run dir refuses to start
    d2 = start_daemon(cfg)
    assert d2.proc.wait(timeout=30) == 1
    assert "another metaltune daemon is running" in d2.log()


def test_sigkill_in_probation_then_restart_is_back_to_baseline(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    def apply_and_die() -> None:
        try:
            d.call("apply", profile=str(prof), probation_s=60)
        except ValueError:
            pass  # the daemon is killed under the request: no answer comes

    threading.Thread(target=apply_and_die, daemon=True).start()
    d.wait_log("event=change.applied")
    assert power_limit_w(sim_host) == 600
    pending = d.call("status")["result"]["pending"]
    assert pending["state"] == "probation"
    # a crash as systemd sees it: the daemon and everything in its cgroup (the probation
    # watchdog too) die at once, so only the journal is left to undo the change
    wd = pending["watchdog_pid"]
    os.kill(d.pid, signal.SIGKILL)
    if wd:
        try:
            os.kill(wd, signal.SIGKILL)
        except ProcessLookupError:
            pass
    d.proc.wait()
    d2 = start_daemon(cfg)
    d2.wait_ready()
    assert power_limit_w(sim_host) == 700
    st = d2.call("status")["result"]
    assert st["pending"] is None and st["current"]["gpu0.power_limit_w"] == 700
    assert st["recent"][0]["state"] == "rolled_back"
    log = d2.log()
    assert "event=rollback" in log and "knob=gpu0.power_limit_w" in log and "to=700" in log
    assert d2.stop() == 0


def test_sigkill_after_confirm_then_restart_keeps_confirmed_state(tmp_path, sim_host, start_daemon):
    prof = write_profile(tmp_path / "p.yaml", 600)
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path, profile=str(prof))
    d = start_daemon(cfg)
    d.wait_ready()
    d.wait_log("event=profile.verified")
    assert power_limit_w(sim_host) == 600
    d.proc.kill()
    d.proc.wait()
    # the driver forgot the setting (reboot / driver reload): the restarted daemon re-applies it
    from tuner.sim.fake_pynvml import FakeNVML

    nv = FakeNVML(sim_host)
    nv.nvmlInit()
    nv.nvmlDeviceSetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(0), 700_000)
    nv.nvmlShutdown()
    d2 = start_daemon(cfg)
    d2.wait_ready()
    log = d2.wait_log("event=profile.verified")
    assert "event=profile.applying" in log and "result=ok" in log
    assert power_limit_w(sim_host) == 600
    d2.notify.wait(lambda m: "STATUS" in m and "profile" in m["STATUS"] and "verified" in m["STATUS"]
                   and "NOT" not in m["STATUS"])
    assert d2.stop() == 0


@pytest.mark.parametrize("policy, expect", [("keep", 600), ("rollback", 700)])
def test_sigterm_follows_the_stop_policy(tmp_path, sim_host, start_daemon, policy, expect):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path, stop_policy=policy)
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    assert d.call("apply", profile=str(prof), probation_s=0.3)["ok"]
    assert power_limit_w(sim_host) == 600
    assert d.stop(signal.SIGTERM) == 0
    assert power_limit_w(sim_host) == expect
    log = d.log()
    assert f"stop_policy={policy}" in log and "event=daemon.stopped" in log
    if policy == "rollback":
        assert "reason=\"stop policy rollback\"" in log or "reason=stop" in log


def test_sighup_reloads_and_a_bad_config_is_kept_out(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    text = cfg.read_text()
    cfg.write_text(text.replace("health_interval_s = 0.2", "health_interval_s = 0.5"))
    n = len(d.notify.msgs)
    os.kill(d.pid, signal.SIGHUP)
    d.notify.wait(lambda m: m.get("RELOADING") == "1", after=n)
    d.notify.wait(lambda m: m.get("READY") == "1", after=n)
    d.wait_log("event=config.reloaded")
    assert "health_interval_s=0.5" in d.log()
    cfg.write_text(text.replace("health_interval_s = 0.2", "health_interval_s = -1"))
    os.kill(d.pid, signal.SIGHUP)
    d.wait_log("event=config.reload_failed")
    assert d.proc.poll() is None and d.call("daemon")["result"]["health_interval_s"] == 0.5
    assert d.stop() == 0


def test_nobody_is_refused_by_the_running_daemon(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    sock = str(d.run_dir / "control.sock")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            msg = b"connected"
        except PermissionError:
            msg = b"refused"
        except BaseException as e:
            msg = repr(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    got = os.read(r, 200)
    os.waitpid(pid, 0)
    assert got == b"refused"
    assert d.stop() == 0


def test_search_runs_in_a_child_with_the_writer_lock(tmp_path, sim_host, start_daemon):
    from tuner.sim.workload import SimWorkload

    # the simulated H200 at stock settings runs power-capped in thermal slowdown (as a loaded
    # 700 W part can): let it have run once, so the daemon's clock-event monitor arms with those
    # reasons already set instead of racing the search's own monitors to a fatal incident
    w = SimWorkload(sim_host)
    w._start("bench")
    w._finish()
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    # knobs that leave the simulated GPU as it is: a random locked clock or power limit can
    # raise a fatal incident, and the daemon then stops the search (by design, not this test)
    safe = ["sysctl.vm.swappiness", "sysctl.vm.dirty_ratio"]
    res = d.call("search_host", budget=2, proposer="random", repeats=1, knobs=safe, timeout=120)
    assert res["ok"], res
    assert res["result"]["trials"] == 2 and res["result"]["run_id"]
    log = d.log()
    started = [l for l in log.splitlines() if "event=search.started" in l]
    assert started and "op=search_host" in started[0]
    child_pid = int(started[0].split(" pid=")[1].split()[0])
    assert child_pid != d.pid
    assert "event=search.finished" in log and "exit_code=0" in log
    info = d.call("daemon")["result"]
    assert info["search"]["running"] is False and info["search"]["exit_code"] == 0
    assert info["heavy_modules"] == []  # the search's imports stayed in the child
    # the daemon holds the writer lock again: another process cannot write behind its back
    from safety import Busy, WriterLock

    with pytest.raises(Busy):
        WriterLock(tmp_path / "state").acquire(timeout=0.2)
    # the trials are in the store the CLI reads
    assert d.call("trials")["ok"]
    # `metaltune search host` goes through the daemon too (the daemon holds the writer lock)
    r = d.cli("search", "host", "--budget", "1", "--proposer", "random", "--rounds", "1",
              "--knob", safe[0], "--knob", safe[1], "--json")
    assert json.loads(r.stdout)["trials"] == 1
    assert d.log().count("event=search.finished") == 2
    # and so does `metaltune search mixed` (host and runtime candidates: kernels would need a
    # GPU or Triton's interpreter)
    r = d.cli("search", "mixed", "--budget", "1", "--proposer", "random", "--family", "none",
              "--rounds", "1", "--repeats", "1", "--knob", safe[0], "--json")
    mixed = json.loads(r.stdout)
    assert mixed["trials"] == 1 and mixed["run_id"] != res["result"]["run_id"]
    log = d.log()
    assert log.count("event=search.finished") == 3 and "op=search_mixed" in log
    assert d.call("daemon")["result"]["heavy_modules"] == []
    assert d.stop() == 0


def test_scheduled_search_starts_itself_once(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    cfg.write_text(cfg.read_text() + "[search]\nenabled = true\nwindows = []\nonly_when_idle = false\n"
                   "budget = 1\nproposer = \"random\"\nmin_interval_s = 3600\n")
    d = start_daemon(cfg)
    d.wait_ready()
    log = d.wait_log("event=search.finished", timeout=60)
    assert "why=schedule" in log and "op=search_host" in log
    time.sleep(1.0)  # several more ticks: min_interval_s keeps it to one run
    assert d.log().count("event=search.started") == 1
    assert d.call("daemon")["result"]["heavy_modules"] == []
    assert d.stop() == 0
    # the schedule survives a restart: no second run within min_interval_s
    d2 = start_daemon(cfg)
    d2.wait_ready()
    time.sleep(1.0)
    assert "event=search.started" not in d2.log()
    assert d2.stop() == 0


def test_the_configured_policy_governs_requests(tmp_path, sim_host, start_daemon):
    pol = tmp_path / "strict.yaml"
    pol.write_text("version: 1\ndescription: nothing but the governor\nrules:\n  - knob: cpu.governor\n")
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path, policy=str(pol))
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    r = d.cli("apply", str(prof), "--probation", "0.3", check=False)
    assert r.returncode == 1 and "strict.yaml" in r.stderr, r.stderr
    assert power_limit_w(sim_host) == 700
    assert d.stop() == 0


def test_sigterm_in_probation_rolls_the_unconfirmed_change_back(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)  # stop policy "keep"
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(d.call("apply", profile=str(prof), probation_s=60)))
    t.start()
    d.wait_log("event=change.applied")
    assert power_limit_w(sim_host) == 600
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 15  # it does not wait out the 60 s probation
    t.join(10)
    assert power_limit_w(sim_host) == 700  # "keep" keeps what is confirmed, not what is on trial
    assert answer.get("ok") is False
    assert "event=rollback" in d.log()
