"""The host the crash test runs on: the simulated host (tuner.sim) when it is there, else file
knobs. Kept in one place so the crash test reads the same either way."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import tuner.sim.fake_pynvml  # noqa: F401
    import tuner.knobs.gpu  # noqa: F401
    KIND = "sim"
except ModuleNotFoundError:
    KIND = "file"

FILE_BASE = {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": 0, "cpu.governor_level": 0,
             "bios.Profile": 0}


def init(root: Path) -> None:
    if KIND == "sim":
        from tuner.sim.hostinit import init_host

        init_host(root)
    else:
        from tests.safety import _knobs

        _knobs.init(root, FILE_BASE)


def knobs(root: Path) -> dict[str, Any]:
    from tests.safety._crash_scenario import knobs_for

    return knobs_for(KIND, str(root))


def read_all(root: Path) -> dict[str, Any]:
    return {n: k.read() for n, k in knobs(root).items()}


def recover_argv(root: Path, state: Path) -> list[str]:
    if KIND == "sim":
        return [sys.executable, "-m", "tuner", "--backend", "sim", "--sim-root", str(root),
                "--state-dir", str(state), "recover", "--json"]
    code = ("import sys; from safety.journal import Journal; from safety.recovery import recover;"
            "from tests.safety import _knobs;"
            f"r = recover(Journal({str(state / 'journal.db')!r}), _knobs.make({str(root)!r}));"
            "sys.exit(0 if r['ok'] else 1)")
    return [sys.executable, "-c", code]
