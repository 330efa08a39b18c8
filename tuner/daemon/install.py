"""`metaltune install [--root DIR]` / `uninstall`: the systemd unit, /etc/metaltune/config.toml,
the default policy and the state directory. `--root` writes the same tree into a folder (tests,
packaging); paths inside the files are those of the final system.

Why each privilege and hardening line (the unit is rendered by `render_unit`):
- CAP_SYS_ADMIN: the NVIDIA driver gates privileged RM controls (every NVML setter: locked clocks,
  power limit, application clocks, persistence) on `capable(CAP_SYS_ADMIN)`, not on uid 0
  (kernel-open/common/inc/nv-linux.h: `NV_IS_SUSER() capable(CAP_SYS_ADMIN)`). It also lets
  /sys/bus/pci/devices/*/config return more than the first 64 bytes (pci_read_config checks
  CAP_SYS_ADMIN), which is where the PCIe capability (relaxed ordering, max read request) lives.
- CAP_SYSLOG: reading /dev/kmsg (Xid lines) when kernel.dmesg_restrict=1, Debian/Ubuntu's default.
- not CAP_SYS_RAWIO: sysfs config-space *writes* (pci_write_config) check only kernel lockdown and
  the file's mode (root-owned 0644), and setpci uses sysfs; RAWIO is for iopl/ioperm and /dev/mem,
  which metaltune never touches. Not CAP_DAC_OVERRIDE either: the service runs as uid 0, the owner
  of every sysfs/procfs file and of /dev/cpu_dma_latency (0600 root).
- ProtectSystem=full (not strict) + ReadWritePaths=/etc/modprobe.d: /usr and /etc read-only except
  the driver-options knob; strict would also make /var read-only for nothing.
- No PrivateDevices (it hides /dev/nvidia*), no ProtectKernelTunables (it makes /proc/sys and /sys
  read-only: sysctl, cpufreq, THP, PCI config knobs), no ProtectKernelLogs (it denies /dev/kmsg).
  DevicePolicy=closed with DeviceAllow for the NVIDIA nodes, /dev/cpu_dma_latency and /dev/kmsg.
- DeviceAllow=char-ipmidev: in-band vendor BIOS tools use /dev/ipmi0. Tools that map /dev/mem
  would need CAP_SYS_RAWIO and are not granted: use Redfish (network) for those BMCs.
- NoNewPrivileges: the setuid nvidia-modprobe cannot run from the service; the device nodes exist
  once the driver is loaded (nvidia-persistenced or boot), which the unit orders itself after.
- No MemoryDenyWriteExecute: search children JIT kernels (Triton/LLVM need W+X pages).
- ProtectHome=yes and PrivateTmp=yes hide /home, /root, /run/user and /tmp, /var/tmp from the
  service. When ExecStart, its interpreter or PYTHONPATH lie there (a checkout or venv in a home
  directory), the unit binds exactly those trees read-only (BindReadOnlyPaths=; ProtectHome=tmpfs,
  the setting systemd.exec(5) pairs with BindReadOnlyPaths=, so the rest of the homes stays
  hidden) instead of failing at start with status 203/EXEC. `hidden_trees` finds them.
- Network: PrivateNetwork=yes when metrics are off, no BMC is configured (etc/metaltune/bmc.yaml)
  and no --allow-ip is given (the daemon needs no network then); otherwise IPAddressDeny=any with
  IPAddressAllow=localhost (metrics bind loopback by default) plus the BMC's address and each
  --allow-ip (the Prometheus server, for a metrics address beyond loopback).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput

UNIT_NAME = "metaltune.service"
UNIT_DIR = "etc/systemd/system"
CONFIG = "etc/metaltune/config.toml"
POLICY = "etc/metaltune/policy.yaml"
STATE_DIR = "var/lib/metaltune"
WATCHDOG_SEC = 30

CONFIG_TEMPLATE = """\
# metaltune daemon configuration, read at start and on `systemctl reload metaltune` (SIGHUP).
# A bad value stops the daemon with one error naming this file and the field.

backend = "{backend}"                   # "real" or "sim" (a simulated host, for tests and demos)
{sim_line}
state_dir = "{state_dir}"               # journal, trial store, writer lock
# run_dir = "/run/metaltune"             # control socket (root-only); default METALTUNE_RUN_DIR or /run/metaltune
policy = "{policy}"    # allowed-change list (deny by default)
profile = ""                            # active profile (name or path): re-applied and verified on every start
probation_s = 300                       # how long a change is watched before it counts as confirmed
health_interval_s = 5                   # seconds between health samples (safety monitors)
stop_policy = "keep"                    # on stop: "keep" the tuned state or "rollback" to baseline
on_fatal_incident = "rollback"          # Xid 79 etc. with a confirmed change: "rollback" to baseline or "record"
log_level = "info"

[search]                                # searches the daemon starts by itself (one at a time, in a child)
enabled = false
kind = "host"
windows = ["02:00-05:00"]               # local-time maintenance windows; [] = any time
only_when_idle = true                   # ...and only after the GPUs were idle this long:
idle_utilization_pct = 5
idle_for_s = 300
budget = 20
proposer = "optuna"
min_interval_s = 86400
timeout_s = 14400

[metrics]                               # Prometheus endpoint, no listener unless enabled. Enabling it
enabled = false                         # needs `metaltune install` again (the unit then gets loopback
address = "127.0.0.1"                   # network); an address beyond loopback also --allow-ip SCRAPER.
port = 9477                             # `metaltune daemon --check` says whether the unit can serve it
idle_timeout_s = 10.0                   # a connection silent this long is closed
max_connections = 32                    # open at once; more are closed at accept (2 worker threads)
"""


def default_exec_start() -> list[str]:
    """The installed `metaltune` next to this interpreter, else `python -m tuner`."""
    exe = Path(sys.executable)
    cand = exe.parent / "metaltune"
    if cand.is_file() and os.access(cand, os.X_OK):
        return [str(cand.absolute())]
    return [str(exe.absolute()), "-m", "tuner"]


def not_executable(exe: Path, root: Path = Path("/")) -> str:
    """Why the unit could not run `exe` ("" when it can). Under `install --root DIR` the path
    names the final system: it counts when it is there under DIR, else on this one."""
    if not exe.is_absolute():
        return "expected an absolute path"
    inside = Path(root) / exe.relative_to("/")
    p = inside if os.path.lexists(inside) else exe
    if not p.exists():
        return "no such file"
    if not p.is_file():
        return "not a regular file"
    if not os.access(p, os.X_OK):
        return "not executable (no x permission)"
    return ""


def untrusted_exec(exe: Path, root: Path = Path("/")) -> str:
    """Why root may not run `exe` ("" when it may; looked up under `root` first): the project's
    rule for code root loads (safety.securefs.check_file: every directory from / and the file itself root's or ours, not
    writable by group or others), for the file and for the interpreter its `#!` names (a script
    is only as safe as what runs it)."""
    from safety.securefs import UnsafePath, check_file

    inside = Path(root) / exe.relative_to("/")
    p = inside if os.path.lexists(inside) else exe
    try:
        check_file(p)
    except UnsafePath as e:
        return f"{e} (another user could change what root runs)"
    interp = _shebang(p)
    if interp is None:
        return ""
    inside = Path(root) / interp.relative_to("/")
    ip = inside if os.path.lexists(inside) else interp
    try:
        check_file(ip)
    except UnsafePath as e:
        return f"its interpreter {interp}: {e} (another user could change what root runs)"
    return ""


def _source_checkout() -> Optional[Path]:
    """The repository root when metaltune runs from a checkout that is not installed."""
    import tuner

    pkg = Path(tuner.__file__).resolve().parent
    if "site-packages" in pkg.parts or "dist-packages" in pkg.parts:
        return None
    import importlib.util

    spec = importlib.util.find_spec("tuner")
    return pkg.parent if spec is not None else None


#: what ProtectHome=yes and PrivateTmp=yes replace in the service's view of the file system
HIDDEN_BY_HOME = ("/home", "/root", "/run/user")
HIDDEN_BY_TMP = ("/tmp", "/var/tmp")
#: trees a root service should not run code from (any user may write there, tmpfiles cleans them)
VOLATILE = ("/tmp", "/var/tmp", "/run/user")


def hidden_under(p: Path) -> Optional[str]:
    """The hidden prefix `p` lies under, if any."""
    for h in (*HIDDEN_BY_HOME, *HIDDEN_BY_TMP):
        if p == Path(h) or Path(h) in p.parents:
            return h
    return None


def _tree_of(p: Path) -> Path:
    """The folder to bind for a file the service runs: its venv or Python prefix (bin/.. with a
    pyvenv.cfg or lib/python3*), else the file's own folder."""
    top = p.parent.parent if p.parent.name == "bin" else p.parent
    if (top / "pyvenv.cfg").is_file() or any(top.glob("lib/python3*")):
        return top
    return p if p.is_dir() else p.parent


def hidden_trees(exec_start: list[str], pythonpath: Optional[Path]) -> list[Path]:
    """Trees the unit's process needs that ProtectHome=/PrivateTmp= would hide: the ExecStart
    executable (as written and through its symlinks), the interpreter its `#!` names and that
    interpreter's base install (a venv made from a pyenv Python), and PYTHONPATH."""
    need: list[Path] = []
    exe = Path(exec_start[0])
    cands = [exe, exe.resolve()]
    interp = _shebang(exe)
    if interp is not None:
        cands += [interp, interp.resolve()]
    if pythonpath is not None:
        need.append(Path(pythonpath).absolute())
    for c in cands:
        need.append(_tree_of(c))
        cfg = _tree_of(c) / "pyvenv.cfg"
        home = _pyvenv_home(cfg) if cfg.is_file() else None
        if home is not None:
            need.append(_tree_of(home / "python3"))
    out: list[Path] = []
    for t in sorted({t for t in need if hidden_under(t)}, key=lambda t: len(t.parts)):
        if not any(o == t or o in t.parents for o in out):
            out.append(t)
    return out


def _shebang(exe: Path) -> Optional[Path]:
    try:
        with open(exe, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]) if words and words[0].startswith("/") else None


def _pyvenv_home(cfg: Path) -> Optional[Path]:
    for line in cfg.read_text(errors="replace").splitlines():
        k, _, v = line.partition("=")
        if k.strip() == "home" and v.strip():
            return Path(v.strip())
    return None


def render_unit(exec_start: list[str], *, config: str = "/" + CONFIG, allow_ip: list[str] | None = None,
                metrics: bool = False, watchdog_sec: int = WATCHDOG_SEC,
                pythonpath: Optional[Path] = None, bmc_host: Optional[str] = None,
                binds: Optional[list[Path]] = None) -> str:
    for a in exec_start[:1]:
        if not Path(a).is_absolute():
            raise BadInput(f"--exec: expected an absolute path, got {a!r}")
    binds = hidden_trees(exec_start, pythonpath) if binds is None else binds
    home_binds = [b for b in binds if hidden_under(b) in HIDDEN_BY_HOME]
    sandbox = ["ProtectHome=tmpfs" if home_binds else "ProtectHome=yes", "PrivateTmp=yes"]
    if binds:
        sandbox = [f"# {', '.join(sorted({hidden_under(b) or '' for b in binds}))} are hidden from the service: "
                   "bind the trees it runs from, read-only", *sandbox,
                   "BindReadOnlyPaths=" + " ".join(_quote(str(b)) for b in binds)]
    cmd = " ".join(_quote(a) for a in [*exec_start, "daemon", "--config", config])
    allow_ip = list(allow_ip or [])
    if bmc_host and not _is_ip(bmc_host):
        # IPAddressAllow takes addresses only: a BMC known by name keeps the network open
        net = [f"# BMC {bmc_host} is a host name: install with its address (--allow-ip) to fence the network"]
    elif metrics or allow_ip or bmc_host:
        if bmc_host and bmc_host not in allow_ip:
            allow_ip.append(bmc_host)
        net = ["IPAddressDeny=any", "IPAddressAllow=localhost" + "".join(f" {a}" for a in allow_ip)]
    else:
        net = ["# no metrics endpoint and no BMC: the daemon needs no network at all",
               "PrivateNetwork=yes"]
    env = ["Environment=PYTHONUNBUFFERED=1", "Environment=TRITON_CACHE_DIR=/var/cache/metaltune/triton"]
    if pythonpath is not None:
        env.append(f"Environment={_quote('PYTHONPATH=' + str(pythonpath))}")
    lines = [
        "[Unit]",
        "Description=metaltune: verified tuning of GPU host settings",
        "After=nvidia-persistenced.service systemd-modules-load.service",
        "StartLimitIntervalSec=10min",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={cmd}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        f"WatchdogSec={watchdog_sec}s",
        "Restart=on-failure",
        "RestartSec=5s",
        "# start recovers and re-applies the active profile; stop may roll back to baseline",
        "TimeoutStartSec=5min",
        "TimeoutStopSec=2min",
        "# SIGTERM to the daemon only: it stops its search child and rolls back what is unconfirmed",
        "KillMode=mixed",
        *env,
        "User=root",
        "UMask=0077",
        "StateDirectory=metaltune",
        "StateDirectoryMode=0700",
        "RuntimeDirectory=metaltune",
        "RuntimeDirectoryMode=0700",
        "CacheDirectory=metaltune",
        "CacheDirectoryMode=0700",
        "# NVML setters and full PCI config reads need CAP_SYS_ADMIN; /dev/kmsg needs CAP_SYSLOG",
        "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYSLOG",
        "NoNewPrivileges=yes",
        "ProtectSystem=full",
        "ReadWritePaths=-/etc/modprobe.d",
        *sandbox,
        "# /dev/nvidia*, /dev/cpu_dma_latency and /dev/kmsg stay reachable: no PrivateDevices",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "DeviceAllow=char-nvidia-caps rw",
        "DeviceAllow=char-nvidia-nvswitch rw",
        "DeviceAllow=/dev/cpu_dma_latency rw",
        "DeviceAllow=/dev/kmsg r",
        "# in-band BIOS tools (racadm, OneCLI, SUM) talk IPMI through /dev/ipmi0",
        "DeviceAllow=char-ipmidev rw",
        "# knobs write /proc/sys and /sys: no ProtectKernelTunables; Xid lines: no ProtectKernelLogs",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=~@clock @cpu-emulation @module @mount @obsolete @raw-io @reboot @swap",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        *net,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _is_ip(h: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(h.strip("[]"))
        return True
    except ValueError:
        return False


def _bmc_host(root: Path) -> Optional[str]:
    """The BMC the BIOS knobs talk to over the network (etc/metaltune/bmc.yaml `url`), if any."""
    p = root / "etc/metaltune/bmc.yaml"
    if not p.is_file():
        return None
    try:
        from urllib.parse import urlsplit

        from safety.inputs import load_yaml

        url = (load_yaml(p) or {}).get("url") or ""
        parts = urlsplit(str(url))
    except Exception:  # a bad bmc.yaml is reported where it is used (tuner.bios.config)
        return None
    if parts.scheme in ("", "sim-bmc") or not parts.hostname:
        return None
    return parts.hostname


def _quote(s: str) -> str:
    return s if s and not any(c in s for c in " \t\"'\\;$%") else '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def _default_policy_source() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("safety")
    locs = list(spec.submodule_search_locations or []) if spec else []
    return Path(locs[0]) / "policies" / "default.yaml" if locs else Path("/nonexistent")


def root_dir(root: Path) -> Path:
    """`--root` as a folder to install into: itself or its nearest existing parent a directory
    (a file there crashed the install half-way with NotADirectoryError)."""
    root = Path(root)
    for p in (root, *root.parents):
        if os.path.lexists(p):
            if not p.is_dir():
                what = "is" if p == root else f"lies under {p}, which is"
                raise BadInput(f"--root: {root} {what} not a directory; expected a folder to "
                               "install into (it is made when missing)")
            break
    return root


def install(root: Path = Path("/"), *, exec_start: list[str] | None = None, allow_ip: list[str] | None = None,
            force: bool = False, backend: str = "real", sim_root: Optional[Path] = None) -> dict[str, Any]:
    """Write the unit (always: it belongs to metaltune), the config and policy (only when absent
    unless `force`: they belong to the operator), and the state directory."""
    root = root_dir(root)
    if backend not in ("real", "sim"):
        raise BadInput(f"--backend: expected 'real' or 'sim', got {backend!r}")
    if backend == "sim" and sim_root is None:
        raise BadInput("--backend sim needs --sim-root DIR")
    for a in allow_ip or []:
        import ipaddress

        try:
            ipaddress.ip_network(a, strict=False)
        except ValueError:
            raise BadInput(f"--allow-ip: expected an IP address or network, got {a!r}") from None
    if exec_start:  # --exec: the unit would fail with 203/EXEC at every start
        why = not_executable(Path(exec_start[0]), root) or untrusted_exec(Path(exec_start[0]), root)
        if why:
            raise BadInput(f"--exec: {exec_start[0]}: {why}; expected the metaltune executable "
                           "(e.g. /opt/metaltune/bin/metaltune)")
    exec_start = exec_start or default_exec_start()
    written, kept = [], []
    cfg_path = root / CONFIG
    metrics = _metrics_enabled(cfg_path) if cfg_path.exists() and not force else False
    pythonpath = _source_checkout()
    binds = hidden_trees(exec_start, pythonpath)
    unit = render_unit(exec_start, allow_ip=allow_ip, metrics=metrics, pythonpath=pythonpath,
                       bmc_host=_bmc_host(root), binds=binds)
    notes = [f"{b} is under {hidden_under(b)}, which any user may write to and which is cleaned by "
             "systemd-tmpfiles: for a service, install metaltune under /opt or /usr/local "
             "(python3 -m venv /opt/metaltune && /opt/metaltune/bin/pip install metaltune)"
             for b in binds if hidden_under(b) in VOLATILE]

    def put(rel: str, text: str | None, mode: int, operator_owned: bool, src: Path | None = None) -> None:
        p = root / rel
        if operator_owned and p.exists() and not force:
            kept.append(str(p))
            return
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = p.with_name(p.name + ".tmp")
        if src is not None:
            shutil.copyfile(src, tmp)
        else:
            tmp.write_text(text or "")
        os.chmod(tmp, mode)
        os.replace(tmp, p)
        written.append(str(p))

    put(f"{UNIT_DIR}/{UNIT_NAME}", unit, 0o644, operator_owned=False)
    put(CONFIG, CONFIG_TEMPLATE.format(
        backend=backend, state_dir="/" + STATE_DIR, policy="/" + POLICY,
        sim_line=f'sim_root = "{Path(sim_root).resolve()}"' if sim_root else '# sim_root = "/path/to/sim"',
    ), 0o600, operator_owned=True)
    os.chmod(cfg_path.parent, 0o700)
    src = _default_policy_source()
    if src.is_file():
        put(POLICY, None, 0o600, operator_owned=True, src=src)
    state = root / STATE_DIR
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)
    if root.resolve() == Path("/"):
        nxt = "systemctl daemon-reload && systemctl enable --now metaltune"
    else:
        nxt = (f"metaltune daemon --check --root {_quote(str(root))}; on the target system: "
               "systemctl daemon-reload && systemctl enable --now metaltune")
    return {"root": str(root), "unit": str(root / UNIT_DIR / UNIT_NAME), "written": written,
            "kept": kept, "state_dir": str(state), "exec_start": exec_start,
            "bound_read_only": [str(b) for b in binds], "notes": notes,
            "policy_installed": src.is_file(), "next": nxt}


def uninstall(root: Path = Path("/"), *, purge: bool = False) -> dict[str, Any]:
    """Remove the unit; with `purge` also the config, policy and state (journal, trials)."""
    root = root_dir(root)
    removed = []
    paths = [root / UNIT_DIR / UNIT_NAME]
    if purge:
        paths += [root / CONFIG, root / POLICY]
    for p in paths:
        if p.exists():
            p.unlink()
            removed.append(str(p))
    if purge:
        for d in (root / STATE_DIR, root / "etc/metaltune"):
            if d.exists():
                shutil.rmtree(d)
                removed.append(str(d))
    return {"root": str(root), "removed": removed,
            "kept": [] if purge else [str(root / CONFIG), str(root / POLICY), str(root / STATE_DIR)]}


def _metrics_enabled(cfg_path: Path) -> bool:
    from safety.errors import InputError
    from safety.inputs import load_toml

    try:
        return bool(load_toml(cfg_path).get("metrics", {}).get("enabled", False))
    except (InputError, AttributeError):
        return False
