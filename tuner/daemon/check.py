"""`metaltune daemon --check` beyond the schema: every file and name the configuration points at
exists and loads (the policy, the active profile, the simulated host, the scheduled search's
proposer). The daemon runs the same check at start, so a config that passes `--check` starts."""
from __future__ import annotations

from pathlib import Path

from tuner.daemon.config import DaemonConfig
from tuner.errors import BadInput


def references(cfg: DaemonConfig, path: Path) -> None:
    """Raise BadInput (exit 2, one line naming the config file and the field) for the first
    reference that does not resolve."""
    def bad(field: str, why: str) -> BadInput:
        return BadInput(f"{path}: field {field}: {why}")

    if cfg.backend == "sim":
        from tuner.sim.state import SimState

        try:
            SimState(cfg.sim_root).check()  # type: ignore[arg-type]  # the model requires it for sim
        except BadInput as e:
            raise bad("sim_root", str(e)) from None
    if cfg.policy is not None:
        from tuner.search.safety_context import load_policy

        if not cfg.policy.is_file():
            raise bad("policy", f"{cfg.policy}: no such file")
        try:
            load_policy(str(cfg.policy))
        except BadInput as e:
            raise bad("policy", str(e)) from None
    if cfg.profile:
        from tuner import ops
        from tuner.ops.settings import Settings

        settings = Settings(state_dir=cfg.state_dir, backend=cfg.backend, sim_root=cfg.sim_root)
        try:
            ops.get("profile_show")(settings, profile=cfg.profile)
        except BadInput as e:
            raise bad("profile", str(e)) from None
    from tuner import proposers

    if cfg.search.proposer not in proposers.names():
        raise bad("search.proposer", f"unknown proposer {cfg.search.proposer!r}; expected one of "
                                     f"{', '.join(proposers.names())}")
