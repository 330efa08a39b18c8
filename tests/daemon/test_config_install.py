"""Configuration validation, `metaltune install/uninstall`, and the unit under systemd-analyze."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.daemon.config import DaemonConfig, load
from tuner.daemon.install import install, render_unit, uninstall
from tuner.errors import BadInput

REPO = Path(__file__).resolve().parents[2]
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env=e, cwd=REPO, timeout=60)


def test_defaults_are_safe():
    c = DaemonConfig()
    assert c.stop_policy == "keep" and c.metrics.enabled is False and c.search.enabled is False
    assert c.metrics.address == "127.0.0.1"


@pytest.mark.parametrize("text, field, expect", [
    ("stop_policy = 'maybe'\n", "stop_policy", "'keep' or 'rollback'"),
    ("health_interval_s = 0\n", "health_interval_s", "greater than or equal to 0.1"),
    ("[metrics]\nenabled = true\naddress = 'localhost'\n", "metrics.address", "IP address to bind"),
    ("[search]\nwindows = ['25:00-03:00']\n", "search.windows", "HH:MM-HH:MM"),
    ("backend = 'sim'\n", "(top level)", "sim_root"),
    ("stop_polcy = 'keep'\n", "stop_polcy", "unknown setting"),
    ("[search]\nkind = 'kernel'\n", "search", "family"),
])
def test_bad_config_names_file_and_field(tmp_path, text, field, expect):
    p = tmp_path / "config.toml"
    p.write_text(text)
    with pytest.raises(BadInput) as ei:
        load(p)
    msg = str(ei.value)
    assert str(p) in msg and f"field {field}" in msg and expect in msg, msg


def test_bad_toml_and_missing_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("backend = \n")
    with pytest.raises(BadInput, match="not valid TOML"):
        load(p)
    with pytest.raises(BadInput, match="not found"):
        load(tmp_path / "nope.toml")


def test_cli_check_exit_codes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("stop_policy = 'rollback'\n[metrics]\nenabled = true\nport = 9555\n")
    r = cli("daemon", "--check", "--config", str(good))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[metrics]\nport = 70000\n")
    r = cli("daemon", "--check", "--config", str(bad))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "metrics.port" in r.stderr and str(bad) in r.stderr, r.stderr
    # the daemon itself refuses to start on it (before touching anything)
    r = cli("daemon", "--config", str(bad), env={"METALTUNE_RUN_DIR": str(tmp_path / "run")})
    assert r.returncode == 2 and "metrics.port" in r.stderr
    assert not (tmp_path / "run").exists()


def test_install_into_folder(tmp_path):
    res = install(tmp_path)
    unit = tmp_path / "etc/systemd/system/metaltune.service"
    cfg = tmp_path / "etc/metaltune/config.toml"
    assert res["unit"] == str(unit) and unit.is_file() and cfg.is_file()
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "var/lib/metaltune").stat().st_mode) == 0o700
    text = unit.read_text()
    for line in ["Type=notify", "NotifyAccess=main", "Restart=on-failure", "WatchdogSec=30s",
                 "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYSLOG", "ProtectSystem=full",
                 "DeviceAllow=char-nvidia-frontend rw", "DeviceAllow=/dev/cpu_dma_latency rw",
                 "RuntimeDirectoryMode=0700", "PrivateNetwork=yes"]:
        assert line in text.splitlines(), line
    for absent in ["PrivateDevices=yes", "ProtectKernelTunables=yes", "ProtectSystem=strict",
                   "MemoryDenyWriteExecute=yes", "ProtectKernelLogs=yes"]:
        assert absent not in text  # each would break NVML, sysfs/procfs knobs, JIT or /dev/kmsg
    # the installed config is valid as shipped
    c = load(cfg)
    assert c.stop_policy == "keep" and c.backend == "real"
    if res["policy_installed"]:
        assert (tmp_path / "etc/metaltune/policy.yaml").is_file()
        assert str(c.policy) == "/etc/metaltune/policy.yaml"


def test_install_keeps_operator_files_and_uninstall(tmp_path):
    install(tmp_path)
    cfg = tmp_path / "etc/metaltune/config.toml"
    cfg.write_text(cfg.read_text().replace('profile = ""', 'profile = "mine"'))
    res = install(tmp_path)
    assert str(cfg) in res["kept"] and 'profile = "mine"' in cfg.read_text()
    (tmp_path / "var/lib/metaltune/journal.db").write_text("x")
    res = uninstall(tmp_path)
    assert not (tmp_path / "etc/systemd/system/metaltune.service").exists()
    assert cfg.exists() and (tmp_path / "var/lib/metaltune/journal.db").exists()
    uninstall(tmp_path, purge=True)
    assert not cfg.exists() and not (tmp_path / "var/lib/metaltune").exists()


def test_metrics_or_bmc_get_loopback_network_only():
    u = render_unit(["/usr/bin/metaltune"], metrics=True)
    assert "PrivateNetwork=yes" not in u and "IPAddressDeny=any" in u and "IPAddressAllow=localhost" in u
    u = render_unit(["/usr/bin/metaltune"], allow_ip=["10.0.0.5"])
    assert "IPAddressAllow=localhost 10.0.0.5" in u
    with pytest.raises(BadInput):
        render_unit(["metaltune"])


@needs_analyze
def test_systemd_analyze_verify_passes(tmp_path):
    r = cli("install", "--root", str(tmp_path))
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "etc/systemd/system/metaltune.service"
    v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stderr
    assert "metaltune.service" not in v.stderr, v.stderr  # no warning about our unit at all


@needs_analyze
def test_systemd_analyze_catches_a_broken_unit(tmp_path):
    # the check above is only worth something if verify really rejects a bad unit
    # (install itself refuses such an --exec now: the unit is rendered as it used to be written)
    unit = tmp_path / "metaltune.service"
    unit.write_text(render_unit(["/nonexistent/metaltune"]))
    v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert v.returncode != 0 and "nonexistent" in v.stderr


def test_daemon_imports_no_torch_triton_optuna():
    # everything the resident daemon loads: the CLI frame, the daemon, every operation module,
    # safety's monitors and recovery, the knob providers
    code = ("import sys, tuner.cli, tuner.daemon.service, tuner.daemon.metrics, tuner.daemon.server, tuner.ops;"
            "tuner.ops.names();"
            "import safety.monitors, safety.recovery, safety.transaction, tuner.knobs.registry as r;"
            "[__import__('tuner.knobs.' + p) for p in r.PROVIDERS if __import__('importlib').util.find_spec('tuner.knobs.' + p)];"
            "print(sorted(m for m in ('torch', 'triton', 'optuna') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] in ("torch", "triton", "optuna")}


def test_a_configured_bmc_gets_through_the_fence(tmp_path):
    (tmp_path / "etc/metaltune").mkdir(parents=True)
    (tmp_path / "etc/metaltune/bmc.yaml").write_text("method: redfish\nurl: https://10.1.2.3\nusername: admin\n")
    u = (Path(install(tmp_path)["unit"])).read_text()
    assert "PrivateNetwork=yes" not in u and "IPAddressAllow=localhost 10.1.2.3" in u
    (tmp_path / "etc/metaltune/bmc.yaml").write_text("method: redfish\nurl: sim-bmc://local\n")
    assert "PrivateNetwork=yes" in Path(install(tmp_path)["unit"]).read_text()


@pytest.mark.parametrize("extra, field", [
    ('sim_root = "{tmp}/no-such-sim"', "sim_root"),
    ('policy = "{tmp}/no-such-policy.yaml"', "policy"),
    ('policy = "{tmp}/bad-policy.yaml"', "policy"),
    ('profile = "no-such-profile"', "profile"),
    ('profile = "{tmp}/no-such-profile.yaml"', "profile"),
    ('[search]\nproposer = "no-such-proposer"', "search.proposer"),
])
def test_check_fails_for_references_that_do_not_resolve(tmp_path, extra, field):
    """`daemon --check` said "ok" for a config whose policy, profile, sim root or proposer did not
    exist (issue 15, item 10); the daemon refuses to start on it as well."""
    sim = tmp_path / "sim"
    assert cli("sim", "init", str(sim), "--sku", "h200").returncode == 0
    (tmp_path / "bad-policy.yaml").write_text("rules: [{knob: 'gpu*', max_step: -1}]\n")
    extra = extra.replace("{tmp}", str(tmp_path))
    sim_line = "" if extra.startswith("sim_root") else f'sim_root = "{sim}"\n'
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'backend = "sim"\n{sim_line}state_dir = "{tmp_path}/state"\n{extra}\n')
    r = cli("daemon", "--check", "--config", str(cfg))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and f"field {field}" in r.stderr and str(cfg) in r.stderr, r.stderr
    r = cli("daemon", "--config", str(cfg), env={"METALTUNE_RUN_DIR": str(tmp_path / "run")})
    assert r.returncode == 2 and f"field {field}" in r.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "state").exists()
    # the same config with every reference in place passes
    good = extra.split("=")[0].strip()
    cfg.write_text(f'backend = "sim"\nsim_root = "{sim}"\nstate_dir = "{tmp_path}/state"\n'
                   + {"policy": f'policy = "{REPO}/safety/policies/default.yaml"\n',
                      "profile": 'profile = "h200"\n'}.get(good, ""))
    r = cli("daemon", "--check", "--config", str(cfg))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def _venv(base: Path) -> Path:
    """A venv-shaped tree whose `metaltune` the unit would run: bin/metaltune (#! its python)."""
    v = base / "venv"
    (v / "bin").mkdir(parents=True)
    (v / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (v / "bin/python").symlink_to("/usr/bin/python3")
    exe = v / "bin/metaltune"
    exe.write_text(f"#!{v}/bin/python\nimport sys\nfrom tuner.cli import run\nsys.exit(run())\n")
    exe.chmod(0o755)
    return v


@needs_analyze
@pytest.mark.parametrize("hidden", ["/tmp", "/root"])
def test_a_tree_the_sandbox_hides_is_bound_read_only(tmp_path, hidden):
    """A venv under /root (ProtectHome=yes) or /tmp (PrivateTmp=yes) is not there for the service:
    the unit used to fail with 203/EXEC. Now it binds that tree read-only, `systemd-analyze verify`
    passes, and `daemon --check --root` says ok; without the bind it says not ok."""
    import tempfile

    if not os.access(hidden, os.W_OK):
        pytest.skip(f"cannot write under {hidden}")
    base = Path(tempfile.mkdtemp(prefix="metaltune-test-", dir=hidden))
    try:
        venv = _venv(base)
        root = tmp_path / "root"
        r = cli("install", "--root", str(root), "--exec", str(venv / "bin/metaltune"))
        assert r.returncode == 0, r.stderr
        assert f"bind   {venv} read-only" in r.stdout
        assert "next: metaltune daemon --check --root" in r.stdout and "systemctl enable --now metaltune" in r.stdout
        unit = root / "etc/systemd/system/metaltune.service"
        lines = unit.read_text().splitlines()
        binds = next(l for l in lines if l.startswith("BindReadOnlyPaths=")).split("=", 1)[1].split()
        assert str(venv) in binds
        # homes stay hidden except the bound tree (systemd.exec(5): tmpfs with BindReadOnlyPaths=)
        assert ("ProtectHome=tmpfs" if hidden == "/root" else "ProtectHome=yes") in lines
        assert "PrivateTmp=yes" in lines
        v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert v.returncode == 0 and "metaltune.service" not in v.stderr, v.stderr
        sec = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                             capture_output=True, text=True, timeout=60)
        level = float(re.search(r"Overall exposure level for metaltune.service: ([\d.]+)", sec.stdout).group(1))
        assert level <= 3.0, sec.stdout[-500:]  # the bind costs no hardening (2.9 OK without it)
        r = cli("daemon", "--check", "--root", str(root))
        assert r.returncode == 0 and "can run it" in r.stdout, r.stderr
        # the unit as it was written before: no bind, so the service cannot see its executable
        unit.write_text("\n".join(l for l in lines if not l.startswith("BindReadOnlyPaths=")) + "\n")
        r = cli("daemon", "--check", "--root", str(root))
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
        assert "not ok" in r.stderr and str(venv / "bin/metaltune") in r.stderr and "203/EXEC" in r.stderr
    finally:
        shutil.rmtree(base)


def test_check_root_says_not_ok_for_metrics_the_unit_cannot_serve(tmp_path):
    """`daemon --check` said ok for metrics behind PrivateNetwork=yes, and could not check what
    `install --root DIR` wrote at all."""
    root = tmp_path / "root"
    assert cli("install", "--root", str(root)).returncode == 0
    cfg = root / "etc/metaltune/config.toml"
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 0 and "can run it" in r.stdout, r.stderr
    head, metrics = cfg.read_text().split("[metrics]")
    cfg.write_text(head + "[metrics]" + re.sub(r"(?m)^enabled = false", "enabled = true", metrics))
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and "PrivateNetwork=yes" in r.stderr and "metaltune install" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert cli("install", "--root", str(root)).returncode == 0          # the unit follows the config
    assert "IPAddressAllow=localhost" in (root / "etc/systemd/system/metaltune.service").read_text()
    assert cli("daemon", "--check", "--root", str(root)).returncode == 0
    # beyond loopback: the fence lets only localhost through until the scraper is allowed
    cfg.write_text(cfg.read_text().replace('address = "127.0.0.1"', 'address = "0.0.0.0"'))
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and "--allow-ip" in r.stderr and "0.0.0.0" in r.stderr, r.stderr
    assert cli("install", "--root", str(root), "--allow-ip", "10.20.0.0/16").returncode == 0
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 0, r.stderr
    # --root alone does not start a daemon
    r = cli("daemon", "--root", str(root))
    assert r.returncode == 2 and "--check" in r.stderr


def test_install_refuses_an_exec_that_is_not_there_and_check_says_not_ok(tmp_path):
    """Issue 33: `install --exec PATH` wrote a unit for a path that does not exist, and
    `daemon --check --root` then said ok: the service would fail with 203/EXEC at every start."""
    root = tmp_path / "root"
    for exe, why in ((tmp_path / "nowhere/metaltune", "no such file"), (tmp_path, "not a regular file")):
        r = cli("install", "--root", str(root), "--exec", str(exe))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
        assert f"--exec: {exe}: {why}" in r.stderr and "Traceback" not in r.stderr
        assert not root.exists()  # nothing written
    plain = tmp_path / "metaltune"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    r = cli("install", "--root", str(root), "--exec", str(plain))
    assert r.returncode == 2 and "not executable" in r.stderr and not root.exists(), r.stderr
    # a path that is there only under --root (the final system's) is accepted
    inside = root / "opt/metaltune/bin/metaltune"
    inside.parent.mkdir(parents=True)
    inside.write_text("#!/bin/sh\n")
    inside.chmod(0o755)
    r = cli("install", "--root", str(root), "--exec", "/opt/metaltune/bin/metaltune")
    assert r.returncode == 0, r.stderr
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 0 and "can run it" in r.stdout, r.stderr
    # the executable goes away (or loses its x bit) after the install: check says not ok
    inside.chmod(0o644)
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "not ok" in r.stderr and "/opt/metaltune/bin/metaltune" in r.stderr and "not executable" in r.stderr
    inside.unlink()
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and "no such file" in r.stderr and "install --exec" in r.stderr, r.stderr
