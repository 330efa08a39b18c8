"""Operation "set": one setting changed in one command, as `nvidia-smi -pl 650` would, but through
the same path as `apply` (tuner.ops.apply): the device's domain, the policy, the quarantine, a
journalled transaction with probation and rollback. A one-knob profile made from the command
line; journalled as "set KNOB=VALUE", so it never becomes the host's active profile."""
from __future__ import annotations

from typing import Any, Optional

from tuner.errors import BadInput
from tuner.ops.registry import operation

SET_LABEL = "set "


def parse_value(text: str) -> Any:
    """`650` -> 650, `[1530, 1530]` -> [1530, 1530], `performance` -> "performance" (YAML scalars
    and flow lists, safe types only)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BadInput(f"VALUE {text!r}: expected a number, a word or a list such as "
                       "[1530, 1530]") from None
    if value is None or isinstance(value, dict):
        raise BadInput(f"VALUE {text!r}: expected a number, a word or a list such as [1530, 1530]")
    return value


@operation("set")
def set_knob(settings: Any, knob: str, value: Any, dry_run: bool = False,
             probation_s: Optional[float] = None, policy: Optional[str] = None,
             no_wait: bool = False) -> dict[str, Any]:
    from tuner.ops import apply as A
    from tuner.ops.profile import _host_knobs
    from tuner.profiles import KnobSetting, Profile

    if probation_s is not None:
        probation_s = A._probation(probation_s)
    if isinstance(value, str):
        value = parse_value(value)
    host, knobs, hw = _host_knobs(settings, dry_run=dry_run)
    try:
        if knob not in knobs:
            near = sorted(n for n in knobs if n.split(".")[-1] == knob.split(".")[-1])[:5]
            raise BadInput(f"KNOB {knob!r}: no such knob on this host"
                           + (f" (did you mean {', '.join(near)}?)" if near else "")
                           + "; `metaltune host` lists them")
        prof = Profile(name=f"set {knob}", path="metaltune set",
                       knobs=[KnobSetting(key=knob, value=value, file="metaltune set")])
        p = A.check(settings, prof, knobs, hw, policy, True, dry_run)
        res = A.report(p, dry_run)
        res["profile"] = None
        res["set"] = {"knob": knob, "value": value}
        A.refuse(res, dry_run)
        if dry_run or not p.changes:
            res["result"] = "dry run: nothing written" if dry_run else "nothing to change"
            return res
        res.update(A.transaction(settings, prof, knobs, p.changes, p.pol, probation_s, host,
                                 no_wait=no_wait, label=f"{SET_LABEL}{knob}={value}"))
        return res
    finally:
        host.close()
