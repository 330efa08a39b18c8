"""The fleet inventory: a YAML file of hosts and groups, validated with pydantic.

```yaml
defaults:                     # every host inherits these unless it sets its own
  user: root
  port: 22
  key: ~/.ssh/metaltune_ed25519       # private key file (its path only is ever logged)
  known_hosts: ~/.ssh/known_hosts     # host keys are verified against this file
  python: /opt/metaltune/.venv/bin/python   # metaltune runs there as `PYTHON -m tuner ...`
  cwd: null                            # optional working directory for remote commands
  env: {METALTUNE_STATE_DIR: /var/lib/metaltune}
hosts:
  gpu-a1: {address: 10.0.0.11, groups: [canary]}
  gpu-a2: {address: 10.0.0.12, port: 2222, env: {METALTUNE_SIM_ROOT: /srv/sim/a2}}
groups:
  rack1: [gpu-a1, gpu-a2]
```
Per-host `env` is merged over `defaults.env`. A group can be given in `groups:` or by a host's own
`groups:` list. Errors name the file, the field and what was expected (BadInput, exit 2).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tuner.errors import BadInput

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class Connection(_Strict):
    user: Optional[str] = None
    port: Optional[int] = Field(default=None, ge=1, le=65535)
    key: Optional[Path] = None
    known_hosts: Optional[Path] = None
    python: Optional[str] = None
    cwd: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)
    connect_timeout: Optional[float] = Field(default=None, gt=0, le=300)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV.match(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        return {k: str(x) for k, x in v.items()}


class HostSpec(Connection):
    address: str = Field(min_length=1)
    groups: list[str] = Field(default_factory=list)


class InventoryFile(_Strict):
    defaults: Connection = Field(default_factory=Connection)
    hosts: dict[str, HostSpec] = Field(min_length=1)
    groups: dict[str, list[str]] = Field(default_factory=dict)


class Host(BaseModel):
    """A host with every default resolved."""

    name: str
    address: str
    user: str = "root"
    port: int = 22
    key: Optional[Path] = None
    known_hosts: Optional[Path] = None
    python: str = "python3"
    cwd: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)
    connect_timeout: float = 10.0
    groups: list[str] = Field(default_factory=list)

    def ssh_target(self, trust_new: bool = False) -> Any:
        from tuner.fleet.ssh import SSHTarget

        return SSHTarget(self.address, self.port, self.user, self.key, self.known_hosts,
                         trust_new, self.connect_timeout)


class Inventory:
    def __init__(self, path: Path, hosts: dict[str, Host], groups: dict[str, list[str]]) -> None:
        self.path, self.hosts, self.groups = path, hosts, groups

    def select(self, limit: Optional[str] = None) -> list[Host]:
        """Hosts named by `limit` (comma-separated host and group names; default: all), in
        inventory order."""
        if not limit:
            return list(self.hosts.values())
        want: set[str] = set()
        for item in (s.strip() for s in limit.split(",") if s.strip()):
            if item in self.hosts:
                want.add(item)
            elif item in self.groups:
                want.update(self.groups[item])
            else:
                raise BadInput(f"--limit: {item!r} is neither a host nor a group of {self.path} "
                               f"(groups: {sorted(self.groups) or 'none'})")
        return [h for n, h in self.hosts.items() if n in want]


def load(path: Path) -> Inventory:
    from safety.inputs import load_yaml

    path = Path(path)
    raw = load_yaml(path, f"inventory {path}", error=BadInput)
    if not isinstance(raw, dict):
        raise BadInput(f"inventory {path}: expected a mapping with 'hosts:' (and optional "
                       f"'defaults:', 'groups:'), got {type(raw).__name__}")
    try:
        inv = InventoryFile.model_validate(raw)
    except ValidationError as e:
        from tuner.validation import first_error

        raise BadInput(f"inventory {path}: {first_error(e, show_value=True)}") from None
    d = inv.defaults
    hosts: dict[str, Host] = {}
    groups: dict[str, list[str]] = {g: list(m) for g, m in inv.groups.items()}
    for name, h in inv.hosts.items():
        if not _NAME.match(name):
            raise BadInput(f"inventory {path}: field hosts.{name}: host names are letters, digits, "
                           f"'.', '_' and '-'")
        pick = lambda f: getattr(h, f) if getattr(h, f) is not None else getattr(d, f)  # noqa: E731
        hosts[name] = Host(
            name=name, address=h.address, user=pick("user") or "root", port=pick("port") or 22,
            key=_expand(pick("key"), path), known_hosts=_expand(pick("known_hosts"), path),
            python=pick("python") or "python3", cwd=pick("cwd"), env={**d.env, **h.env},
            connect_timeout=pick("connect_timeout") or 10.0, groups=list(h.groups),
        )
        for g in h.groups:
            groups.setdefault(g, [])
            if name not in groups[g]:
                groups[g].append(name)
    for g, members in groups.items():
        if g in hosts:
            raise BadInput(f"inventory {path}: field groups.{g}: a group may not share a host's name")
        for m in members:
            if m not in hosts:
                raise BadInput(f"inventory {path}: field groups.{g}: unknown host {m!r} "
                               f"(hosts: {', '.join(hosts)})")
    return Inventory(path, hosts, groups)


def _expand(p: Optional[Path], inv_path: Path) -> Optional[Path]:
    """~ expanded; a relative path is relative to the inventory file."""
    if p is None:
        return None
    p = Path(p).expanduser()
    return p if p.is_absolute() else (inv_path.parent / p).resolve()


def to_ansible(inv: Inventory) -> dict[str, Any]:
    """The same hosts and groups as an Ansible dynamic inventory (`--list` JSON), so one file
    drives both `metaltune fleet` and an Ansible playbook (deploy/ansible/)."""
    import shlex

    hostvars: dict[str, dict[str, Any]] = {}
    for h in inv.hosts.values():
        # the python that runs metaltune also runs Ansible's modules (the host may have no other)
        v: dict[str, Any] = {"ansible_host": h.address, "ansible_port": h.port, "ansible_user": h.user,
                             "ansible_python_interpreter": h.python, "ansible_timeout": int(math.ceil(h.connect_timeout)),
                             "metaltune_python": h.python, "metaltune_env": h.env}
        if h.key:
            v["ansible_ssh_private_key_file"] = str(h.key)
        if h.known_hosts:  # host keys checked against the same file as `metaltune fleet` (never trusted blindly)
            v["ansible_ssh_common_args"] = (f"-o UserKnownHostsFile={shlex.quote(str(h.known_hosts))} "
                                            "-o StrictHostKeyChecking=yes")
        if h.cwd:
            v["metaltune_cwd"] = h.cwd
        hostvars[h.name] = v
    out: dict[str, Any] = {"_meta": {"hostvars": hostvars},
                           "all": {"hosts": list(inv.hosts), "children": sorted(inv.groups)}}
    for g, members in inv.groups.items():
        out[g] = {"hosts": list(members)}
    return out
