"""`metaltune daemon --check` beyond the schema: every file and name the configuration points at
exists and loads (the policy, the active profile, the simulated host, the scheduled search's
proposer). The daemon runs the same check at start, so a config that passes `--check` starts.
With the installed unit beside it (`--root DIR`, or the system's own), `--check` also says whether
that unit can run the config (`unit_serves`)."""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

from tuner.daemon.config import DaemonConfig
from tuner.errors import BadInput, OperationFailed


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


def under_root(cfg: DaemonConfig, root: Path) -> DaemonConfig:
    """The config `install --root DIR` wrote names the final system's paths: look each one up
    under DIR first (where the install put it), else where it says."""
    def rebase(p: Optional[Path]) -> Optional[Path]:
        if p is None or not p.is_absolute():
            return p
        inside = root / p.relative_to("/")
        return inside if os.path.lexists(inside) else p

    update = {k: rebase(getattr(cfg, k)) for k in ("policy", "state_dir", "sim_root", "run_dir")}
    if cfg.profile and cfg.profile.startswith("/"):
        update["profile"] = str(rebase(Path(cfg.profile)))
    return cfg.model_copy(update=update)


def unit_serves(cfg: DaemonConfig, unit: Path, root: Path = Path("/")) -> None:
    """Raise OperationFailed (exit 1, one line naming the unit, why and the fix) when the installed
    unit cannot run this config: an ExecStart or PYTHONPATH its sandbox hides, or metrics that its
    network fence keeps every scraper from."""
    from safety.inputs import read_text
    from tuner.daemon.install import hidden_under, not_executable, untrusted_exec

    text = read_text(unit, str(unit), error=BadInput)
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and not k.startswith(("#", ";")):
            keys.setdefault(k.strip(), []).append(v.strip())

    def bad(why: str, fix: str) -> OperationFailed:
        return OperationFailed(f"{unit}: not ok: {why}; {fix}")

    reinstall = "run `metaltune install` again (it writes the unit for the config in place)"
    bound = [Path(w.lstrip("-+")) for v in keys.get("BindReadOnlyPaths", []) + keys.get("BindPaths", [])
             for w in shlex.split(v)]
    needed = [("ExecStart", w[0].lstrip("-@:+!")) for w in (shlex.split(v) for v in keys.get("ExecStart", [])) if w]
    for v in keys.get("Environment", []):
        for w in shlex.split(v):
            if w.startswith("PYTHONPATH="):
                needed += [("PYTHONPATH", p) for p in w.split("=", 1)[1].split(":") if p]
    for what, p in needed[:1] if needed and needed[0][0] == "ExecStart" else []:
        why = not_executable(Path(p), root)
        if why:
            raise bad(f"ExecStart {p}: {why} (the service would fail with status 203/EXEC)",
                      "run `metaltune install --exec PATH` with the metaltune executable")
        why = untrusted_exec(Path(p), root)
        if why:
            raise bad(f"ExecStart {p}: {why}", "make it root's and not writable by others (chown "
                      "root: and chmod go-w, its folders too), or run `metaltune install --exec "
                      "PATH` with a metaltune executable root owns")
    for what, p in needed:
        h = hidden_under(Path(p))
        if h and not any(b == Path(p) or b in Path(p).parents for b in bound):
            raise bad(f"{what} {p} is under {h}, which ProtectHome=/PrivateTmp= hide from the service "
                      "(it would fail with status 203/EXEC)", reinstall)
    m = cfg.metrics
    if not m.enabled:
        return
    if "yes" in keys.get("PrivateNetwork", []):
        raise bad(f"metrics.enabled = true, but the unit has PrivateNetwork=yes: nothing outside the "
                  f"service can reach {m.address}:{m.port}", reinstall)
    allowed = " ".join(keys.get("IPAddressAllow", [])).split()
    if not m.loopback_only() and "any" in " ".join(keys.get("IPAddressDeny", [])).split() \
            and not [a for a in allowed if a not in ("localhost", "link-local", "127.0.0.1", "::1")]:
        raise bad(f"metrics.address = {m.address!r} listens beyond loopback, but the unit lets only "
                  "localhost through (IPAddressDeny=any)",
                  "run `metaltune install --allow-ip ADDR` with your Prometheus server's address or network")
