"""Daemon configuration: /etc/metaltune/config.toml, read with tomllib, validated with pydantic at
start (and on SIGHUP) with one clear error naming the file, the field and what was expected."""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from safety.bounds import MAX_PROBATION_S
from tuner.errors import BadInput

DEFAULT_PATH = Path("/etc/metaltune/config.toml")
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


class _Strict(BaseModel):
    # every float finite: `probation_s = inf` would hold the writer for ever, NaN passes any bound
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SearchConfig(_Strict):
    """When the daemon may run a search on its own (in a child process, never two writers)."""

    enabled: bool = False
    kind: Literal["host", "kernel"] = "host"
    family: Optional[str] = None  # kernel searches: which family
    #: local-time maintenance windows "HH:MM-HH:MM" (may wrap midnight); empty: any time
    windows: list[str] = Field(default_factory=list)
    only_when_idle: bool = True
    idle_utilization_pct: int = Field(5, ge=0, le=100)
    idle_for_s: float = Field(300.0, ge=0, le=7 * 86400)
    budget: int = Field(20, ge=1)
    proposer: str = "optuna"
    min_interval_s: float = Field(86400.0, ge=0, le=365 * 86400)  # at most one scheduled search per this period
    timeout_s: float = Field(4 * 3600.0, gt=0, le=7 * 86400)

    @field_validator("windows")
    @classmethod
    def _windows(cls, v: list[str]) -> list[str]:
        for w in v:
            if not _WINDOW.match(w):
                raise ValueError(f"expected \"HH:MM-HH:MM\" (24 h, local time), got {w!r}")
        return v

    @model_validator(mode="after")
    def _family(self) -> "SearchConfig":
        if self.kind == "kernel" and not self.family:
            raise ValueError("kind = \"kernel\" needs family = \"<name>\"")
        return self


class MetricsConfig(_Strict):
    """Prometheus endpoint: no listener unless enabled; bound to `address` (loopback by default).
    Any other address (a pod IP, "0.0.0.0" behind a Kubernetes Service) has to be let through the
    unit's network fence: `metaltune install --allow-ip SCRAPER` (`daemon --check` tells)."""

    enabled: bool = False
    address: str = "127.0.0.1"
    port: int = Field(9477, ge=1, le=65535)
    #: a connection that sends no request in this long is closed (and a request's reads/writes)
    idle_timeout_s: float = Field(10.0, gt=0, le=300)
    #: connections open at once; one more is closed at accept (each costs a descriptor only)
    max_connections: int = Field(32, ge=1, le=1024)

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"expected an IP address to bind (127.0.0.1, ::1, a host address, 0.0.0.0 or ::), "
                             f"got {v!r}") from None
        return v

    def loopback_only(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


class DaemonConfig(_Strict):
    backend: Literal["real", "sim"] = "real"
    sim_root: Optional[Path] = None
    state_dir: Path = Path("/var/lib/metaltune")
    run_dir: Optional[Path] = None  # default: METALTUNE_RUN_DIR or /run/metaltune
    #: the active profile (name under host_profiles/ or a path); re-applied on every start
    profile: Optional[str] = None
    policy: Optional[Path] = None  # allowed-change list (YAML); None: safety's shipped default
    probation_s: float = Field(300.0, gt=0, le=MAX_PROBATION_S)
    health_interval_s: float = Field(5.0, ge=0.1, le=3600)
    #: on SIGTERM: keep the tuned (confirmed) state, or roll back to baseline
    stop_policy: Literal["keep", "rollback"] = "keep"
    #: a fatal incident (Xid 79, DBE...) with a confirmed change in force: "rollback" returns the
    #: host to baseline and quarantines that change; "record" only journals it. An unconfirmed
    #: change is always rolled back.
    on_fatal_incident: Literal["rollback", "record"] = "rollback"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    search: SearchConfig = Field(default_factory=SearchConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @field_validator("profile")
    @classmethod
    def _empty_is_none(cls, v: Optional[str]) -> Optional[str]:
        return v or None

    @model_validator(mode="after")
    def _sim(self) -> "DaemonConfig":
        if self.backend == "sim" and self.sim_root is None:
            raise ValueError("backend = \"sim\" needs sim_root = \"/path/to/simulated/host\"")
        return self

    def resolved_run_dir(self) -> Path:
        from tuner.daemon.client import run_dir

        return self.run_dir or run_dir()


def config_path(explicit: Optional[Path] = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ.get("METALTUNE_CONFIG", str(DEFAULT_PATH)))


def load(path: Path, missing_ok: bool = False) -> DaemonConfig:
    """Parse and validate; raise BadInput (exit 2) with the file, field and expectation."""
    from safety.inputs import load_toml

    if missing_ok and not os.path.lexists(path):
        return DaemonConfig()
    if not os.path.lexists(path):
        raise BadInput(f"{path}: config file not found (create it with `metaltune install`)")
    data = load_toml(path, str(path), error=BadInput)
    try:
        cfg = DaemonConfig.model_validate(data)
    except ValidationError as e:
        raise BadInput(f"{path}: {_first_error(e)}") from None
    if cfg.sim_root is not None and not cfg.sim_root.is_absolute():
        cfg.sim_root = (path.parent / cfg.sim_root).resolve()
    return cfg


def _first_error(e: ValidationError) -> str:
    from tuner.validation import first_error

    return first_error(e, show_value=True, unknown="unknown setting (check the spelling; see "
                                                   "`metaltune install` for the template)")
