"""The process the crash-consistency test kills. Three transactions on a host (the simulated
host's GPU knobs, or file knobs): the first confirmed, the second rolled back by the caller, the
third confirmed (variant "confirm") or left to the watchdog's deadline (variant "expire").
Variant "nowatchdog" is "confirm" with no watchdog: a power cut, where nothing survives the kill
and `recover` does all the work.
With METALTUNE_CRASH_AT=k it SIGKILLs itself at the k-th crash point (safety._crash)."""
from __future__ import annotations

import sys
import time

PLANS = {
    "sim": [{"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": [1500, 1500]},
            {"gpu0.power_limit_w": 500, "gpu0.locked_clocks_mhz": [1200, 1200],
             "gpu0.locked_mem_clocks_mhz": [2201, 2201]},
            {"gpu0.power_limit_w": 550, "gpu0.locked_clocks_mhz": [1305, 1305]}],
    "file": [{"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": 1500},
             {"gpu0.power_limit_w": 500, "gpu0.locked_clocks_mhz": 1200, "cpu.governor_level": 3},
             {"gpu0.power_limit_w": 550, "gpu0.locked_clocks_mhz": 1305}],
}


class AllowAll:
    """The policy is not under test here (and pydantic stays out of the child)."""

    source = "<allow-all>"

    def enforce(self, *a: object) -> None:
        pass

    def probation_for(self, names: object) -> float:
        return 0.25


def knobs_for(kind: str, root: str) -> dict:
    if kind == "sim":
        from tuner.host import open_host
        from tuner.knobs.registry import discover

        return discover(open_host("sim", root), providers=["gpu"])
    from tests.safety import _knobs

    return _knobs.make(root)


def main(kind: str, root: str, state: str, variant: str) -> None:
    from safety.errors import ProbationExpired
    from safety.journal import Journal
    from safety.transaction import Transaction

    knobs = knobs_for(kind, root)
    j = Journal(f"{state}/journal.db")
    plan = PLANS[kind]

    def txn(changes: dict, probation: float) -> Transaction:
        return Transaction(j, knobs, changes, policy=AllowAll(), probation_s=probation,
                           state_dir=state, poll_interval_s=None, lock_timeout_s=30,
                           watchdog="none" if variant == "nowatchdog" else "process")

    t = txn(plan[0], 30).begin()
    t.check()
    t.confirm()
    t = txn(plan[1], 30).begin()
    t.check()
    t.rollback("worse")
    if variant in ("confirm", "nowatchdog"):
        t = txn(plan[2], 30).begin()
        t.check()
        t.confirm()
    else:
        t = txn(plan[2], 0.15).begin()
        time.sleep(0.4)  # the watchdog rolls back at the deadline
        try:
            t.confirm()
        except ProbationExpired:
            pass
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
