"""Input files that are not what they seem, as a profile, a policy and an inventory, through the
real CLI in a child process (with a timeout and an address-space limit, so a loader that hangs on
a FIFO or expands a billion laughs fails the test instead of the machine): exit 2, one line that
names the file, nothing changed on the host, nothing run."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.simhelpers import PERMISSIVE, host_digest
from tuner.sim.hostinit import init_host

ROOT = Path(__file__).resolve().parents[2]
GOOD_PROFILE = "name: good\nknobs:\n  gpu0.power_limit_w: 650\n"
GOOD_POLICY = Path(PERMISSIVE).read_text()


def _laughs(prefix: str) -> str:
    """Nine levels of nine aliases each: 9^9 (387 million) strings once expanded."""
    out = [f"{prefix}l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        out.append(f"{prefix}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(out) + "\n"


# each attack: (kind -> file content) for the three kinds; the content is a plausible document
# of that kind with the attack where a value belongs
ATTACKS: dict[str, Callable[[str], bytes | None]] = {
    "python-tag": lambda kind: {
        "profile": b"name: x\nknobs: !!python/object/apply:os.system ['touch PWNED']\n",
        "policy": b"version: 1\nrules: !!python/object/apply:os.system ['touch PWNED']\n",
        "inventory": b"hosts: !!python/object/apply:os.system ['touch PWNED']\n",
    }[kind],
    "unknown-tag": lambda kind: {
        "profile": b"name: x\nknobs: {gpu0.power_limit_w: !watts 650}\n",
        "policy": b"version: 1\nrules: [{knob: !glob 'gpu*.power_limit_w'}]\n",
        "inventory": b"hosts: {a: {address: !ip 10.0.0.1}}\n",
    }[kind],
    "impossible-date": lambda kind: {
        "profile": b"name: x\nprovenance: {date: 2024-02-30}\nknobs: {gpu0.power_limit_w: 650}\n",
        "policy": b"version: 1\ndescription: 2024-02-30\nrules: []\n",
        "inventory": b"hosts: {a: {address: 2024-02-30}}\n",
    }[kind],
    "nan": lambda kind: {
        "profile": b"name: x\nknobs: {gpu0.power_limit_w: .nan}\n",
        "policy": b"version: 1\nrules: [{knob: 'gpu*.power_limit_w', range: [null, .nan]}]\n",
        "inventory": b"defaults: {connect_timeout: .nan}\nhosts: {a: {address: a}}\n",
    }[kind],
    "inf": lambda kind: {
        "profile": b"name: x\nknobs: {gpu0.power_limit_w: {at_most: .inf}}\n",
        "policy": b"version: 1\ndefaults: {probation_s: .inf}\nrules: []\n",
        "inventory": b"defaults: {connect_timeout: .inf}\nhosts: {a: {address: a}}\n",
    }[kind],
    "not-utf8": lambda kind: {
        "profile": b"name: caf\xe9\nknobs: {gpu0.power_limit_w: 650}\n",
        "policy": b"version: 1\ndescription: caf\xe9\nrules: []\n",
        "inventory": b"hosts: {caf\xe9: {address: a}}\n",
    }[kind],
    "50MB": lambda kind: (b"# padding\n" * (5 << 20)) + (GOOD_PROFILE.encode() if kind == "profile" else b""),
    "billion-laughs": lambda kind: {
        "profile": "name: x\nprovenance:\n" + _laughs("  ") + "knobs: {}\n",
        "policy": "version: 1\ndescription: x\nrules: []\nlaughs:\n" + _laughs("  "),
        "inventory": "hosts: {a: {address: a}}\nlaughs:\n" + _laughs("  "),
    }[kind].encode(),
    "fifo": lambda kind: None,        # made with mkfifo below
    "dev-zero": lambda kind: None,    # the path /dev/zero itself
}

EXPECT = {
    "python-tag": "python/object", "unknown-tag": "could not determine a constructor",
    "impossible-date": "2024-02-30", "nan": "not a finite number", "inf": "not a finite number",
    "not-utf8": "not UTF-8", "50MB": "1 MiB", "billion-laughs": "aliases expanded",
    "fifo": "is a FIFO", "dev-zero": "is a character device",
}


def _limits() -> None:  # the child: 3 GiB of address space; a billion laughs needs far more
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def metaltune(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")}
    env.update(PYTHONPATH=str(ROOT), METALTUNE_STATE_DIR=str(tmp_path / "state"),
               METALTUNE_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=timeout, preexec_fn=_limits)


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    return init_host(tmp_path_factory.mktemp("hostile") / "h200", "h200")


def _write_attack(tmp_path: Path, attack: str, kind: str) -> str:
    if attack == "dev-zero":
        return "/dev/zero"
    path = tmp_path / f"hostile-{kind}.yaml"
    if attack == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(ATTACKS[attack](kind))
    return str(path)


@pytest.mark.parametrize("kind", ["profile", "policy", "inventory"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_input_is_one_line_exit_2_and_changes_nothing(tmp_path, host, attack, kind):
    bad = _write_attack(tmp_path, attack, kind)
    good_profile = tmp_path / "good.yaml"
    good_profile.write_text(GOOD_PROFILE)
    good_policy = tmp_path / "policy.yaml"
    good_policy.write_text(GOOD_POLICY)
    apply = ["--backend", "sim", "--sim-root", str(host), "apply"]
    argv = {
        "profile": [*apply, bad, "--probation", "0", "--policy", str(good_policy)],
        "policy": [*apply, str(good_profile), "--probation", "0", "--policy", bad],
        "inventory": ["fleet", "apply", str(good_profile), "-I", bad, "--canary", "1"],
    }[kind]
    before = host_digest(host)
    t0 = time.monotonic()
    r = metaltune(tmp_path, *argv)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("metaltune: error: "), r.stderr[-2000:]
    assert Path(bad).name in lines[0] and EXPECT[attack] in lines[0], lines[0]
    assert len(lines[0]) < 400
    assert host_digest(host) == before
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "state" / "journal.db").exists()
    assert took < 30, took          # refused up front: no parsing of 50 MB, no expansion


def test_the_good_files_of_these_tests_are_accepted(tmp_path, host):
    """The good files of these tests are accepted (so the refusals above are the attacks' doing):
    the profile applies under the policy, the inventory parses."""
    prof, pol = tmp_path / "good.yaml", tmp_path / "policy.yaml"
    prof.write_text(GOOD_PROFILE)
    pol.write_text(GOOD_POLICY)
    sim = init_host(tmp_path / "own", "h200")
    r = metaltune(tmp_path, "--backend", "sim", "--sim-root", str(sim), "apply", str(prof),
                  "--probation", "0", "--policy", str(pol))
    assert r.returncode == 0, r.stderr
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts: {a: {address: 127.0.0.1}}\n")
    from tuner.fleet.inventory import load

    assert list(load(inv).hosts) == ["a"]
