"""Real OpenSSH servers in network namespaces, for tests (reusable by any test module).

`NetnsLab` makes one client namespace and, per host, a namespace joined to it by a veth pair with
link-local addresses (169.254.10.0/24, one /30 per host), `lo` up in each, and (optionally) a real
`sshd -D` from Debian's openssh-server listening on the host's address with its own ed25519 host
key. Traffic stays inside the namespaces; everything is removed on `close()` (the fixtures call it
in teardown). Commands that talk to the hosts run inside the client namespace (`lab.run(...)`).

Needs root, `ip` (iproute2), `/usr/sbin/sshd` and `ssh-keygen`; `skip_reason()` says what is
missing so tests skip instead of failing on a machine that cannot run peers.

Usage:
    from tests.peers.sshd import netns_lab  # noqa: F401  (a pytest fixture)
    def test_x(netns_lab):
        h = netns_lab.add_host("h1")
        r = netns_lab.run(["python", "-c", "..."])
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pytest

SSHD = "/usr/sbin/sshd"
SUBNET = "169.254.10"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("ip", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.path.exists(SSHD):
        return "needs openssh-server (apt-get install -y openssh-server)"
    return None


def _sh(argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def keygen(path: Path, comment: str = "metaltune-test") -> str:
    """A fresh ed25519 key pair at `path` / `path.pub`; returns the public key line."""
    _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(f"{path}.pub").read_text().strip()


@dataclass
class SshHost:
    name: str
    ns: str
    address: str
    port: int = 22
    dir: Path = field(default_factory=Path)
    host_pub: str = ""               # "ssh-ed25519 AAAA... comment"
    proc: subprocess.Popen | None = None

    def known_hosts_line(self) -> str:
        kind, b64 = self.host_pub.split()[:2]
        host = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{host} {kind} {b64}"

    def stop_sshd(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class NetnsLab:
    """A client namespace plus up to 60 host namespaces, each with (optionally) a real sshd."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tag = f"mt{os.getpid()}"
        self.client_ns = f"{self.tag}c"
        self.hosts: dict[str, SshHost] = {}
        self._namespaces: list[str] = []
        self._n = 0
        workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self._add_ns(self.client_ns)
        self.client_key = workdir / "client_ed25519"
        self.client_pub = keygen(self.client_key, "metaltune-fleet-test")

    # -- namespaces ---------------------------------------------------------------------------
    def _add_ns(self, ns: str) -> None:
        _sh(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def add_host(self, name: str, sshd: bool = True, authorize_client: bool = True) -> SshHost:
        """A host namespace linked to the client's, with sshd listening on port 22 unless
        `sshd=False` (then the address answers nothing: connection refused)."""
        i = self._n
        self._n += 1
        ns = f"{self.tag}h{i}"
        self._add_ns(ns)
        va, vb = f"v{os.getpid() % 100000}x{i}a", f"v{os.getpid() % 100000}x{i}b"
        _sh(["ip", "link", "add", va, "type", "veth", "peer", "name", vb])
        _sh(["ip", "link", "set", va, "netns", self.client_ns])
        _sh(["ip", "link", "set", vb, "netns", ns])
        c_addr, h_addr = f"{SUBNET}.{4 * i + 1}", f"{SUBNET}.{4 * i + 2}"
        _sh(["ip", "-n", self.client_ns, "addr", "add", f"{c_addr}/30", "dev", va])
        _sh(["ip", "-n", ns, "addr", "add", f"{h_addr}/30", "dev", vb])
        _sh(["ip", "-n", self.client_ns, "link", "set", va, "up"])
        _sh(["ip", "-n", ns, "link", "set", vb, "up"])
        d = self.workdir / name
        d.mkdir(parents=True, exist_ok=True)
        host = SshHost(name, ns, h_addr, 22, d)
        host.host_pub = keygen(d / "ssh_host_ed25519_key", f"host-{name}")
        (d / "authorized_keys").write_text(self.client_pub + "\n" if authorize_client else "")
        self.hosts[name] = host
        if sshd:
            self.start_sshd(host)
        return host

    def start_sshd(self, host: SshHost) -> None:
        d = host.dir
        cfg = d / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {host.port}", f"ListenAddress {host.address}",
            f"HostKey {d / 'ssh_host_ed25519_key'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
            f"PidFile {d / 'sshd.pid'}", "StrictModes no", "UsePAM no",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "LogLevel ERROR", "MaxStartups 50:30:100",
            "MaxSessions 50", "Subsystem sftp internal-sftp", "",
        ]))
        log = open(d / "sshd.log", "w")
        host.proc = subprocess.Popen(["ip", "netns", "exec", host.ns, SSHD, "-D", "-e", "-f", str(cfg)],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if host.proc.poll() is not None:
                raise RuntimeError(f"sshd for {host.name} exited: {(d / 'sshd.log').read_text()}")
            r = _sh(["ip", "netns", "exec", host.ns, "ss", "-Hltn", f"src {host.address}"], check=False)
            if f"{host.address}:{host.port}" in r.stdout:
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd for {host.name} did not listen within 10s")

    # -- helpers ------------------------------------------------------------------------------
    def known_hosts(self, names: Sequence[str] | None = None, path: Path | None = None) -> Path:
        """A known_hosts file holding the host keys of `names` (default: every host)."""
        path = path or self.workdir / "known_hosts"
        lines = [self.hosts[n].known_hosts_line() for n in (names if names is not None else self.hosts)]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def run(self, argv: Sequence[str], timeout: float = 120, env: dict[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the client namespace (where every host is reachable)."""
        return subprocess.run(["ip", "netns", "exec", self.client_ns, *argv], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=cwd)

    def close(self) -> None:
        for h in self.hosts.values():
            h.stop_sshd()
        for ns in reversed(self._namespaces):  # deleting a namespace deletes its veth ends
            _sh(["ip", "netns", "del", ns], check=False)
        self._namespaces.clear()


def python_for_remote() -> str:
    """The interpreter the remote hosts run metaltune with: this test run's own venv python
    (resolved at test time, so CI's clone uses its own .venv)."""
    return sys.executable


@pytest.fixture
def netns_lab(tmp_path: Path) -> Iterator[NetnsLab]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    lab = NetnsLab(tmp_path / "lab")
    try:
        yield lab
    finally:
        lab.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
