"""What the loop, the demo and the CLI need from `safety`, bound to one host and state dir:
the journal, the policy, the host's health monitors, and transactions over the host's knobs."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import safety
from safety.errors import SafetyError
from safety.incident import REASON_BY_TYPE

from tuner.errors import BadInput, OperationFailed


def load_policy(policy: Any) -> Any:
    """A safety Policy from a path, "default", "permissive", or a Policy object; bad files → exit 2."""
    from safety import policy as pol

    try:
        if policy is None or policy == "default":
            return pol.load_default()
        if policy == "permissive":
            return pol.load_permissive()
        if isinstance(policy, (str, os.PathLike)):
            return pol.load(policy)
    except SafetyError as e:
        raise BadInput(str(e)) from None
    return policy


def host_monitors(host: Any, canary: Any = None, state_dir: Optional[Path] = None,
                  bdfs: Optional[list[str]] = None, cursor: bool = False) -> list[Any]:
    """safety's standard monitors for this host: NVML's (Xid events, ECC, PCIe replay, clock
    events, temperature) when it has NVML, the kernel log's Xid lines and the AER counters (of
    `bdfs`, or every device) under its root, `canary`; with `state_dir` the kernel canary's
    incident log (a model process's kernel computing wrong during a probation rolls the change
    back; `cursor`: the daemon's, which reads on from where it stopped). The one place a
    search, an apply's probation and the daemon build them."""
    from kernelsearch.canary_reader import KernelCanaryMonitor
    from safety import monitors

    try:
        nvml = host.nvml if host.has_nvml() else None
    except Exception:  # no NVML binding here (pynvml not installed): kernel log and AER only
        nvml = None
    ms = monitors.standard(nvml=nvml, root=host.path("/"), bdfs=bdfs, canary=canary)
    if state_dir is not None:
        ms.append(KernelCanaryMonitor(state_dir, cursor=cursor))
    return ms


@dataclass
class SafetyContext:
    host: Any
    state_dir: Path
    policy: Any = None
    probation_s: Optional[float] = None
    monitors: Optional[list[Any]] = None
    watchdog: str = "process"
    # the longest one measurement may take (the workload's timeout): the A/B checks the
    # transaction after every candidate sample, at most three samples apart (a b, b a, a b),
    # so each check keeps its deadline three of these (plus the grace) ahead
    measure_timeout_s: Optional[float] = None
    Instability: type = field(default=safety.Instability, init=False)
    ProbationExpired: type = field(default=safety.ProbationExpired, init=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = safety.Journal.in_state_dir(self.state_dir)
        self.policy = load_policy(self.policy)
        if self.monitors is None:
            self.monitors = host_monitors(self.host, state_dir=self.state_dir)

    # -- gates -----------------------------------------------------------------------------
    def policy_check_for(self, knobs: Mapping[str, Any]):
        def check(name: str, before: Any, after: Any) -> Optional[str]:
            r = self.policy.check(knobs[name], before, after, self.journal)
            return None if r is None else str(r)

        return check

    def quarantined_keys(self) -> set[str]:
        return {q["key"] for q in self.journal.quarantined()}

    def quarantine(self, key: str, reason: str) -> None:
        self.journal.quarantine(key, reason)

    # -- transactions ----------------------------------------------------------------------
    def begin(self, knobs: Mapping[str, Any], changes: Mapping[str, Any], label: str = "",
              candidate_key: Optional[str] = None) -> Any:
        """Apply `changes` inside a transaction in probation. The caller polls `check()` (no
        monitor thread: the caller's own A/B toggling must not race an asynchronous rollback).
        Each `check()` keeps the deadline one measurement (plus the grace) ahead, so an A/B longer
        than the probation is judged; the watchdog still rolls back if the caller dies or hangs,
        and a trial that writes nothing to the host has no deadline at all."""
        from safety.transaction import NO_PROBATION_GRACE_S

        txn = safety.Transaction(
            self.journal, knobs, changes, policy=self.policy, monitors=self.monitors,
            probation_s=self.probation_s, label=label, key=candidate_key,
            state_dir=self.state_dir, watchdog=self.watchdog, poll_interval_s=None,
            keepalive_s=NO_PROBATION_GRACE_S + 3 * (self.measure_timeout_s or 0.0),
        )
        try:
            txn.begin()
        except safety.PolicyDenied as e:
            raise OperationFailed(f"policy: {e}") from None
        except SafetyError as e:
            if getattr(e, "exit_code", 1) == 2:
                raise BadInput(str(e)) from None
            raise OperationFailed(str(e)) from None
        return txn

    @staticmethod
    def incident_dict(e: Exception) -> dict[str, Any]:
        inc = getattr(e, "incident", None)
        d = inc.to_dict() if hasattr(inc, "to_dict") else dict(getattr(inc, "__dict__", {}))
        d.setdefault("detail", str(e))
        d.setdefault("reason", REASON_BY_TYPE.get(d.get("type", ""), "instability_xid"))
        return d

    def close(self) -> None:
        for m in self.monitors or []:
            try:
                m.close()
            except Exception:
                pass
        self.journal.close()
