"""`/etc/metaltune/bmc.yaml` (under the host's root): how this host's BIOS is reached.

```yaml
method: redfish            # redfish | racadm | ilorest | sum | onecli
url: https://10.1.2.3      # Redfish service (sim hosts: sim-bmc://local)
username: metaltune
password_file: /etc/metaltune/bmc.secret   # or env METALTUNE_BMC_PASSWORD; never logged
verify_tls: true           # or a CA bundle path
system: /redfish/v1/Systems/1              # default: the only/first member
attributes: [WorkloadProfile, ProcCStates] # optional: expose only these as knobs
values: {WorkloadProfile: [Balanced, HighPerformanceCompute]}  # vendor CLIs: the domain
bmc_host: 10.1.2.3         # vendor CLIs: out-of-band target; absent = in-band (no credentials)
```
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from safety.inputs import load_yaml
from tuner.errors import BadInput

CONFIG = "/etc/metaltune/bmc.yaml"


class BmcConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Literal["redfish", "racadm", "ilorest", "sum", "onecli"] = "redfish"
    url: Optional[str] = None
    username: Optional[str] = None
    password_file: Optional[str] = None
    verify_tls: Union[bool, str] = True
    system: Optional[str] = None
    attributes: Optional[list[str]] = None
    values: dict[str, list[Any]] = {}
    bmc_host: Optional[str] = None
    timeout_s: float = 30.0

    def password(self, host: Any) -> Optional[str]:
        env = os.environ.get("METALTUNE_BMC_PASSWORD")
        if env:
            return env
        if self.password_file:
            try:
                return host.path(self.password_file).read_text().strip()
            except OSError as e:
                raise BadInput(f"{CONFIG}: password_file {self.password_file}: {e.strerror}") from None
        return None

    def __repr__(self) -> str:  # the password never lives here, but keep reprs short anyway
        return f"BmcConfig(method={self.method!r}, url={self.url!r})"


def load(host: Any) -> Optional[BmcConfig]:
    """The host's BMC config, or None when the file does not exist (no BIOS knobs then)."""
    p: Path = host.path(CONFIG)
    if not p.exists():
        return None
    raw = load_yaml(p, str(p), error=BadInput) or {}
    if not isinstance(raw, dict):
        raise BadInput(f"{p}: expected a mapping at the top level")
    try:
        cfg = BmcConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise BadInput(f"{p}: field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    if cfg.method == "redfish" and not cfg.url:
        raise BadInput(f"{p}: field url: required for method redfish")
    return cfg
