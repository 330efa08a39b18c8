"""Fixtures: a simulated host in a folder and the daemon started as a child process with a bound
NOTIFY_SOCKET (the sd_notify peer systemd would be), its own run dir and state dir."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def base_env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METALTUNE_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env["PYTHONPATH"] = str(REPO)
    env["METALTUNE_RUN_DIR"] = str(run_dir)
    return env


def metaltune(*args: str, env: dict[str, str], timeout: float = 120, check: bool = True
              ) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"metaltune {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


class Notifications:
    """The systemd side of sd_notify: a bound datagram socket, every message timestamped."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.msgs: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self.msgs.append((time.monotonic(), dict(l.split("=", 1) for l in data.decode().splitlines() if "=" in l)))

    def wait(self, pred: Callable[[dict[str, str]], bool], timeout: float = 30.0, after: int = 0) -> dict[str, str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for _, m in self.msgs[after:]:
                if pred(m):
                    return m
            time.sleep(0.02)
        raise AssertionError(f"no matching notification in {timeout}s; got {[m for _, m in self.msgs[-10:]]}")

    def close(self) -> None:
        self._stop.set()
        self._t.join(1)
        self.sock.close()


class DaemonProc:
    def __init__(self, tmp: Path, config: Path, run_dir: Path, watchdog_usec: Optional[int] = 400_000):
        self.tmp, self.config, self.run_dir = tmp, config, run_dir
        self.log_path = tmp / f"daemon-{int(time.time() * 1000)}.log"
        self.notify = Notifications(tmp / f"notify-{int(time.time() * 1000)}.sock")
        env = base_env(run_dir)
        env["NOTIFY_SOCKET"] = str(self.notify.path)
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.env = env
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--config", str(config)],
                                     env=env, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        # WATCHDOG_PID would have to be the daemon's pid, which we only learn now: systemd sets it
        # the same way (after fork, before exec); the daemon accepts WATCHDOG_USEC without it.

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 40.0) -> dict[str, str]:
        try:
            return self.notify.wait(lambda m: m.get("READY") == "1", timeout)
        except AssertionError:
            raise AssertionError(f"daemon not READY (rc={self.proc.poll()}):\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text()  # the child writes it directly (its own stdout)

    def wait_log(self, needle: str, timeout: float = 20.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = self.log()
            if needle in text:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in the daemon log:\n{self.log()}")

    def call(self, op: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        """One request over the control socket, as the CLI sends it."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(str(self.run_dir / "control.sock"))
        s.sendall((json.dumps({"op": op, "args": args}) + "\n").encode())
        line = s.makefile("rb").readline()
        s.close()
        return json.loads(line)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = base_env(self.run_dir)
        return metaltune(*args, env=env, check=check)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()
            self.notify.close()


@pytest.fixture
def sim_host(tmp_path) -> Path:
    root = tmp_path / "sim"
    metaltune("sim", "init", str(root), "--sku", "h200", "--gpus", "2", env=base_env(tmp_path / "run"))
    return root


def write_config(path: Path, sim: Path, tmp: Path, *, metrics_port: Optional[int] = None, **extra: Any) -> Path:
    lines = [f'backend = "sim"', f'sim_root = "{sim}"', f'state_dir = "{tmp / "state"}"',
             f'run_dir = "{tmp / "run"}"', "health_interval_s = 0.2", "probation_s = 1.0"]
    for k, v in extra.items():
        lines.append(f"{k} = {json.dumps(v)}")
    if metrics_port:
        lines += ["[metrics]", "enabled = true", f"port = {metrics_port}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_profile(path: Path, watts: int = 600) -> Path:
    path.write_text(f"name: test-power\ndescription: power cap for the daemon tests\n"
                    f"knobs:\n  gpu0.power_limit_w: {watts}\n")
    return path


def power_limit_w(sim: Path, gpu: int = 0) -> float:
    """What the simulated device itself holds (read through the fake NVML, not the journal)."""
    from tuner.sim.fake_pynvml import FakeNVML

    nv = FakeNVML(sim)
    nv.nvmlInit()
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(gpu)) / 1000.0
    finally:
        nv.nvmlShutdown()


@pytest.fixture
def start_daemon(tmp_path):
    started: list[DaemonProc] = []

    def start(config: Path, watchdog_usec: Optional[int] = 400_000) -> DaemonProc:
        d = DaemonProc(tmp_path, config, tmp_path / "run", watchdog_usec)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        # children a test killed the daemon under (safety's watchdog) must not outlive the test
    for d in started:
        try:
            d.notify.close()
        except Exception:
            pass
