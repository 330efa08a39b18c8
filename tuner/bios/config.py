"""`/etc/metaltune/bmc.yaml` (under the host's root): how this host's BIOS is reached.

```yaml
method: redfish            # redfish | racadm | ilorest | sum | onecli
url: https://10.1.2.3      # Redfish service (sim hosts: sim-bmc://local); user:pw@ in it is
                           # taken out at load (never stored, logged or shown)
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

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from safety.inputs import load_yaml
from tuner.errors import BadInput

CONFIG = "/etc/metaltune/bmc.yaml"


class BmcConfig(BaseModel):
    # the file may hold credentials: pydantic must never echo a value in an error
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

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
    _url_password: Optional[str] = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _credentials_out_of_the_url(self) -> "BmcConfig":
        """`https://user:pw@bmc` works, but only the bare URL is kept (it becomes the knobs'
        identity, so the journal and `host --json` would show it)."""
        if self.url:
            from tuner import redact

            clean, user, pw = redact.split_url(self.url)
            self.url = clean
            if self.username is None:
                self.username = user
            self._url_password = pw
            redact.remember(pw)
        return self

    def password(self, host: Any) -> Optional[str]:
        from tuner import redact

        env = os.environ.get("METALTUNE_BMC_PASSWORD")
        if env:
            redact.remember(env)
            return env
        if self.password_file:
            try:
                pw = host.path(self.password_file).read_text().strip()
            except OSError as e:
                raise BadInput(f"{CONFIG}: password_file {self.password_file}: {e.strerror}") from None
            redact.remember(pw)
            return pw
        return self._url_password

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
        from tuner.validation import first_error

        raise BadInput(f"{p}: {first_error(e, more=False)}") from None  # never the value
    if cfg.method == "redfish" and not cfg.url:
        raise BadInput(f"{p}: field url: required for method redfish")
    return cfg
