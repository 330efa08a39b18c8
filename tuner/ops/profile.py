"""Operations on host profiles: "verify", "profile_list", "profile_show", "profile_diff",
"profile_export", "host" (CLI and daemon socket share them, see tuner.ops), and the `plan` that
verify and "apply" (tuner.ops.apply) both make.

verify: per knob `ok` / `drifted` / `unsupported` / `pending-reboot` (a staged BIOS or driver
change waits for a reboot or driver reload) / `missing` (a GPU the host does not have) / `error`, like `tuned-adm verify` but machine-readable.
apply: everything is checked first (profile shape, knob names, values against the device's own
domains, the policy); only then does a safety Transaction write, with probation and rollback.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput, MetaltuneError, OutOfDomain
from tuner.ops.registry import operation

PENDING = "pending-reboot"
#: a setting for a device (gpu3) the host does not have
MISSING = "missing"


def _dirs(settings: Any) -> list[Path]:
    return [Path(settings.state_dir) / "profiles", Path("/etc/metaltune/profiles")]


def _load(settings: Any, name: str) -> Any:
    from tuner import profiles

    return profiles.load(name, _dirs(settings))


def _host_knobs(settings: Any, dry_run: bool = False) -> tuple[Any, dict[str, Any], Any]:
    from tuner.host import hardware as hw
    from tuner.knobs import registry

    host = settings.host(dry_run=dry_run)
    return host, registry.discover(host, state_dir=settings.state_dir), hw.detect(host)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def plan(profile: Any, knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per setting that applies on this host, values checked against the device's
    domain (an out-of-domain value is BadInput naming the file, line and field)."""
    from tuner import profiles
    from tuner.knobs.base import Unsupported, values_equal

    resolved, unmatched = profiles.resolve(profile, knobs)
    items: list[dict[str, Any]] = []
    for name, ks in resolved.items():
        k = knobs[name]
        it: dict[str, Any] = {"knob": name, "key": ks.key, "file": ks.file, "line": ks.line,
                              "effect": k.effect.value, "wanted": _jsonable(ks.value)}
        try:
            dom = k.limits()
        except MetaltuneError as e:
            items.append({**it, "status": "unsupported", "reason": str(e)})
            continue
        if isinstance(dom, Unsupported):
            items.append({**it, "status": "unsupported", "reason": dom.reason})
            continue
        value = ks.value
        bound = profiles.bound_of(value)
        if bound is not None:
            value = bound[1]
        if value == "default":
            value = k.default()
            if value is None:
                raise BadInput(f"{ks.where()}: field knobs.{ks.key}: {name} reports no default "
                               "value; give one explicitly")
        try:
            value = k.validate(value)
        except OutOfDomain as e:
            raise BadInput(f"{ks.where()}: field knobs.{ks.key}: {e} "
                           f"(expected {dom.describe()})") from None
        it["wanted"] = _jsonable(value)
        it["domain"] = dom.describe()
        try:
            cur = k.read()
            pend = k.pending() if hasattr(k, "pending") else None
        except MetaltuneError as e:
            items.append({**it, "status": "error", "reason": str(e)})
            continue
        if bound is not None and isinstance(cur, (int, float)) and not isinstance(cur, bool) and (
                cur >= value if bound[0] == "at_least" else cur <= value):
            value = cur  # the host already satisfies the bound: keep its value
            it["wanted"] = _jsonable(cur)
            it["bound"] = {bound[0]: bound[1]}
        it["current"], it["pending"] = _jsonable(cur), _jsonable(pend)
        if pend is not None and values_equal(pend, value):
            it["status"] = PENDING
        elif pend is None and (values_equal(cur, value) or k.readback_matches(value, cur)):
            it["status"] = "ok"
        else:
            it["status"] = "drifted"
        if it["status"] != "ok" and hasattr(k, "verify_note"):
            it["reason"] = k.verify_note(value)  # a boot-time value: what /proc/cmdline says
        items.append(it)
    gpus = sorted({n.split(".", 1)[0] for n in knobs if re.match(r"gpu\d+\.", n)},
                  key=lambda g: int(g[3:]))
    for ks in unmatched:
        it = {"knob": None, "key": ks.key, "file": ks.file, "line": ks.line,
              "wanted": _jsonable(ks.value), "status": "unsupported",
              "reason": "no such knob on this host"}
        m = re.match(r"(gpu\d+)\.", ks.key)
        if m and m.group(1) not in gpus:  # a board this host lacks: never "in force"
            it.update(status=MISSING, reason=f"this host has no {m.group(1)} (it has "
                      f"{', '.join(gpus) or 'no GPU'})")
        items.append(it)
    return items


def refuse_missing(items: list[dict[str, Any]]) -> None:
    """A setting for a GPU this host does not have is bad input for `apply` (exit 2): the
    profile was written for another host, and "nothing to change" would call it in force."""
    for it in items:
        if it["status"] == MISSING:
            where = f"{it['file']}:{it['line']}" if it.get("line") else it["file"]
            raise BadInput(f"{where}: field knobs.{it['key']}: {it['reason']}; nothing applied")


def _summary(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in items:
        out[it["status"]] = out.get(it["status"], 0) + 1
    return out


def _hw_brief(hw: Any) -> dict[str, Any]:
    return {"gpus": [g.name for g in hw.gpus], "driver": hw.driver_version,
            "virtualization": "vm" if hw.virtualization.is_vm else "bare_metal",
            "evidence": hw.virtualization.evidence}


@operation("verify", reads=True)
def verify(settings: Any, profile: str) -> dict[str, Any]:
    from tuner import profiles

    prof = _load(settings, profile)
    host, knobs, hw = _host_knobs(settings, dry_run=True)
    try:
        items = plan(prof, knobs)
    finally:
        host.close()
    summ = _summary(items)
    return {"profile": prof.name, "path": prof.path, "host": _hw_brief(hw),
            "match": profiles.match_host(prof, hw),
            "ok": not summ.get("drifted") and not summ.get("error") and not summ.get(MISSING),
            "summary": summ, "knobs": items}


@operation("profile_list", reads=True)
def profile_list(settings: Any, match: bool = True) -> dict[str, Any]:
    from tuner import profiles

    items = profiles.list_profiles(_dirs(settings))
    hw = None
    if match:
        try:
            from tuner.host import hardware as hwmod

            with settings.host(dry_run=True) as host:
                hw = hwmod.detect(host)
        except MetaltuneError:
            hw = None
    if hw is not None:
        for it in items:
            if "error" in it:
                continue
            try:
                why = profiles.match_host(profiles.load(it["path"], _dirs(settings)), hw)
            except BadInput as e:
                why = [str(e)]
            it["matches_host"] = not why
            it["mismatch"] = why
    return {"profiles": items, "host": _hw_brief(hw) if hw is not None else None}


@operation("profile_show", reads=True)
def profile_show(settings: Any, profile: str) -> dict[str, Any]:
    prof = _load(settings, profile)
    d = prof.model_dump(mode="json")
    return d


@operation("profile_diff", reads=True)
def profile_diff(settings: Any, a: str, b: Optional[str] = None) -> dict[str, Any]:
    """Knob-by-knob difference between two profiles (after includes), or between a profile
    and what this host has now when `b` is omitted."""
    from tuner.knobs.base import values_equal

    pa = _load(settings, a)
    va = pa.values()
    if b is not None:
        pb = _load(settings, b)
        vb, bname = pb.values(), pb.name
    else:  # against this host: what verify would report as not ok, with resolved values
        host, knobs, _ = _host_knobs(settings, dry_run=True)
        try:
            items = plan(pa, knobs)
        finally:
            host.close()
        rows = [{"knob": it["knob"] or it["key"], pa.name: it["wanted"],
                 "host": it.get("current", "<" + it.get("reason", it["status"]) + ">"),
                 "status": it["status"]} for it in items if it["status"] != "ok"]
        return {"a": pa.name, "b": "host", "differences": rows, "same": not rows}
    keys = sorted(set(va) | set(vb))
    rows = []
    for k in keys:
        x, y = va.get(k, "<unset>"), vb.get(k, "<unset>")
        same = values_equal(x, y)
        if not same:
            rows.append({"knob": k, pa.name: _jsonable(x), bname: _jsonable(y)})
    return {"a": pa.name, "b": bname, "differences": rows, "same": not rows}


@operation("profile_export", reads=True)
def profile_export(settings: Any, profile: Optional[str] = None, from_host: bool = False,
                   new_name: Optional[str] = None, kernels: Optional[str] = None,
                   from_search: Optional[str] = None, engine: Optional[str] = None,
                   ) -> dict[str, Any]:
    """A self-contained YAML profile: a profile with its includes flattened, or (from_host) the
    values this host has now, with provenance saying where and when they were read. `kernels`:
    a dispatch table (JSON) to carry as the profile's `kernels:`. `engine`: a serving workload's
    args (`vllm:ARGS`) whose engine setup goes to `provenance.engine`. Every stored source the
    kernels name is bundled under `kernel_sources:` (tuner.ops.profile_kernels)."""
    import yaml

    from tuner.ops import profile_kernels

    _Dumper = _dumper()

    if sum(map(bool, (profile, from_host, from_search))) > 1:
        raise BadInput("profile export: give one of PROFILE, --from-host, --from-search RUN")
    if from_search:
        from tuner.ops import profile_search

        host, _, hw = _host_knobs(settings, dry_run=True)
        host.close()
        doc = profile_search.profile_doc(Path(settings.state_dir), from_search, new_name,
                                         [g.name for g in hw.gpus], settings.backend or "real")
    elif from_host:
        from tuner.knobs.base import Unsupported

        host, knobs, hw = _host_knobs(settings, dry_run=True)
        try:
            vals = {}
            for n, k in sorted(knobs.items()):
                if n == profile_kernels.KNOB:  # a profile carries its table as `kernels:`
                    continue
                try:
                    if isinstance(k.limits(), Unsupported):
                        continue
                    vals[n] = _jsonable(k.read())
                except MetaltuneError:
                    continue
        finally:
            host.close()
        doc = {"name": new_name or "exported",
               "description": "values read from a host by `metaltune profile export --from-host`",
               "match": {"gpu_name": sorted({g.name for g in hw.gpus})} if hw.gpus else {},
               "knobs": vals,
               "provenance": {"source": "exported from host",
                              "values_from": "simulated" if settings.backend == "sim"
                              else "measured",
                              "measured_on": ", ".join(sorted({g.name for g in hw.gpus})) or None,
                              "driver": hw.driver_version,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        if not doc["match"]:
            doc.pop("match")
    else:
        if not profile:
            raise BadInput("profile export: give a PROFILE, --from-host or --from-search RUN")
        prof = _load(settings, profile)
        doc = prof.to_yaml_dict()
        if new_name:
            doc["name"] = new_name
    if kernels:
        from kernelsearch.table import DispatchTable, TableError

        try:
            doc["kernels"] = DispatchTable.load(kernels).to_dict()
        except TableError as e:
            raise BadInput(f"--kernels: {e}") from None
        doc.pop("kernel_sources", None)
        doc = {k: doc[k] for k in doc if k != "provenance"} | {"provenance": doc.get("provenance", {})}
    if engine:
        doc.setdefault("provenance", {})["engine"] = _engine_setup(engine)
    doc = profile_kernels.bundle(doc, Path(settings.state_dir))
    return {"yaml": yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None),
            "profile": doc}


def _engine_setup(spec: str) -> dict[str, Any]:
    """`provenance.engine` from `vllm:ARGS`: the engine's settings, flags and environment as its
    server gets them (secret-looking variables masked); BadInput for a bad config."""
    from tuner.profiles import EngineSetup
    from tuner.workloads.serving.config import load
    from tuner.workloads.serving.workload import ServingWorkload

    name, _, args = spec.partition(":")
    if name != "vllm":
        raise BadInput(f"--engine: expected vllm:<config>, got {spec!r}")
    wl = ServingWorkload(load(args))
    flags, env = wl.launch()
    setup = EngineSetup(name=wl.engine.name, model=wl.cfg.model, settings=wl.runtime_settings(),
                        flags=flags, env=wl.public_env(env))
    return setup.model_dump(mode="json")


def _block_str(dumper: Any, s: str) -> Any:
    """Multi-line strings (bundled kernel sources) as literal blocks: readable, and yaml
    round-trips them byte for byte, so their digests still verify on the importing host."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


def _dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, _block_str)
    return Dumper


@operation("host")
def host_info(settings: Any) -> dict[str, Any]:
    """Detected hardware and every knob (value, domain, effect), read-only."""
    from tuner.host import hardware as hwmod
    from tuner.knobs import registry

    with settings.host(dry_run=True) as host:
        info = hwmod.detect(host)
        knobs = registry.discover(host)
        rows = [k.describe() for _, k in sorted(knobs.items())]
    return {"hardware": info.model_dump(mode="json"), "knobs": rows}
