"""Host profiles: YAML files with `include:` inheritance, `match:` rules, knob values, a kernel
dispatch section and provenance. Loading checks everything that can be checked without a host
(shape, knob names, include cycles); `plan()` checks values against a host's own domains.
Every error names the file, the field (and line) and what was expected: `BadInput`, exit 2.

```yaml
# host_profiles/h200.yaml
description: NVIDIA H200 SXM, inference
include: [datacenter]
match: {gpu_name: ["NVIDIA H200*"], driver: ">=550", virtualization: any}
knobs:
  gpu*.power_limit_w: 700        # a comment saying why
  pcie.*.max_read_request_bytes: 4096
kernels: {}                     # kernelsearch dispatch table (its dict form)
provenance: {source: vendor guidance, values_from: guidance, date: 2026-11-29}
```
Knob keys are names or fnmatch patterns (`gpu*`, `pcie.*`), or the PCIe role selectors
`pcie.@gpus.<field>` / `pcie.@nics.<field>`; an exact name beats a pattern, and a child file beats
its includes. The value `default` means the device's own default.
"""
from __future__ import annotations

import difflib
import fnmatch
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from safety.inputs import compose_yaml, read_text
from tuner.errors import BadInput

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "host_profiles"

# -- the knob vocabulary (docs/INTERNALS.md) ------------------------------------------------
GPU_FIELDS = ["power_limit_w", "locked_clocks_mhz", "locked_mem_clocks_mhz",
              "gpc_clock_offset_mhz", "mem_clock_offset_mhz", "app_clocks_mhz", "persistence_mode"]
PCIE_FIELDS = ["relaxed_ordering", "max_read_request_bytes"]
CPU_OS = ["cpu.governor", "cpu.energy_performance_preference", "cpu.boost",
          "cpu.max_cstate_latency_us", "os.numa_balancing", "os.transparent_hugepages"]


def _vocabulary() -> list[tuple[re.Pattern[str], str]]:
    from tuner.knobs.boot import PARAMS
    from tuner.knobs.driver import OPTIONS
    from tuner.knobs.sysctl import ALLOWED

    pats = [
        (rf"gpu(\d+|[*?\[\]0-9-]+)\.({'|'.join(GPU_FIELDS)})", "gpu<i>.<field>"),
        (rf"pcie\.([0-9a-fA-F:.*?\[\]-]+|@gpus|@nics)\.({'|'.join(PCIE_FIELDS)})",
         "pcie.<bdf>.<field>"),
        (rf"driver\.nvidia\.({'|'.join(map(re.escape, OPTIONS))})", "driver.nvidia.<option>"),
        (rf"({'|'.join(map(re.escape, CPU_OS))})", "cpu/os knob"),
        (rf"sysctl\.({'|'.join(map(re.escape, ALLOWED))})", "sysctl.<allowed name>"),
        (r"bios\.[A-Za-z_][A-Za-z0-9_.]*[*?]?", "bios.<Attribute>"),
        (rf"boot\.cmdline\.({'|'.join(map(re.escape, PARAMS))})", "boot.cmdline.<parameter>"),
    ]
    return [(re.compile(p + r"\Z"), d) for p, d in pats]


def known_examples() -> list[str]:
    from tuner.knobs.boot import PARAMS
    from tuner.knobs.driver import OPTIONS
    from tuner.knobs.sysctl import ALLOWED

    return ([f"gpu*.{f}" for f in GPU_FIELDS] + [f"pcie.*.{f}" for f in PCIE_FIELDS]
            + [f"driver.nvidia.{o}" for o in OPTIONS] + CPU_OS + [f"sysctl.{n}" for n in ALLOWED]
            + [f"boot.cmdline.{p}" for p in PARAMS])


def check_knob_key(key: str) -> Optional[str]:
    """None when `key` names (or patterns) a knob metaltune has; else what was expected."""
    if any(p.match(key) for p, _ in _vocabulary()):
        return None
    hint = difflib.get_close_matches(key, known_examples(), n=1, cutoff=0.6)
    extra = ""
    if key == "sysctl.kernel.numa_balancing":
        extra = " (NUMA balancing is the knob os.numa_balancing)"
    elif key.startswith("sysctl."):
        extra = " (only sysctls from the allowed list are knobs: tuner/knobs/sysctl.py ALLOWED)"
    return ("not a knob metaltune knows" + extra
            + (f"; did you mean {hint[0]!r}?" if hint else
               "; expected gpu<i>.<field>, pcie.<bdf>.<field>, cpu.*, os.*, sysctl.<name>, "
               "driver.nvidia.<option>, bios.<Attribute> or boot.cmdline.<parameter>"))


# -- the file model ---------------------------------------------------------------------------
class Match(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu_name: Optional[list[str]] = None      # fnmatch patterns, case-insensitive; any matches
    driver: Optional[str] = None              # ">=550, <600"
    virtualization: Literal["any", "bare_metal", "vm"] = "any"
    min_gpus: Optional[int] = None


class EngineSetup(BaseModel):
    """The serving engine a profile was measured with (tuner.workloads.serving): its settings as
    the registry names them, and the flags and environment they gave the server."""
    model_config = ConfigDict(extra="forbid")
    name: str                                 # "vllm"
    model: Optional[str] = None
    settings: dict[str, Any] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("settings")
    @classmethod
    def _known(cls, v: dict[str, Any], info: Any) -> dict[str, Any]:
        from tuner.workloads.serving.engines import engine

        eng = engine(info.data.get("name", ""))  # ValueError: an engine the registry lacks
        unknown = sorted(set(v) - set(eng.by_name()))
        if unknown:
            raise ValueError(f"{eng.name} has no setting {unknown[0]!r}")
        return v


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow")
    source: Optional[str] = None              # "measured", "vendor guidance", "hand-tuned"
    #: where the values come from, as `profile list` shows it and `apply` warns of: measured on
    #: real hardware, found on a simulated host only, or guidance (vendor, community) not
    #: measured end to end; absent: unstated
    values_from: Optional[Literal["measured", "simulated", "guidance"]] = None
    measured_on: Optional[str] = None         # host / GPU / driver it was measured on
    date: Optional[str] = None
    workload: Optional[str] = None
    gain_pct: Optional[float] = None
    spread_pct: Optional[float] = None
    trials: Optional[int] = None
    notes: Optional[str] = None
    #: what the search that found it kept (tuner.search.objective); absent: throughput
    objective: Optional[Literal["throughput", "energy", "power-capped", "goodput"]] = None
    throughput_floor: Optional[float] = Field(None, gt=0, le=1)  # energy
    power_budget_w: Optional[float] = Field(None, gt=0)  # power-capped
    tok_per_j_gain_pct: Optional[float] = None  # tokens per joule over the run's start
    engine: Optional[EngineSetup] = None  # the serving engine it was measured with, if any


class ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Optional[str] = None
    description: str = ""
    include: list[str] = Field(default_factory=list)
    match: Optional[Match] = None
    knobs: dict[str, Any] = Field(default_factory=dict)
    kernels: dict[str, Any] = Field(default_factory=dict)
    # the stored kernel sources `kernels:` names as src:<sha256>: {sha: {source, record}}
    kernel_sources: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance = Field(default_factory=Provenance)
    abstract: bool = False                    # a base meant only for include:, never applied


class KnobSetting(BaseModel):
    key: str        # name or pattern as written
    value: Any
    file: str
    line: Optional[int] = None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


class Profile(BaseModel):
    """A profile with its includes resolved."""

    name: str
    path: str
    description: str = ""
    chain: list[str] = Field(default_factory=list)   # files, root ancestor first
    match: Match = Field(default_factory=Match)
    knobs: list[KnobSetting] = Field(default_factory=list)
    kernels: dict[str, Any] = Field(default_factory=dict)
    kernel_sources: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance = Field(default_factory=Provenance)
    abstract: bool = False

    def values(self) -> dict[str, Any]:
        return {k.key: k.value for k in self.knobs}

    def to_yaml_dict(self) -> dict[str, Any]:
        """A self-contained file (includes flattened) for `profile export`."""
        d: dict[str, Any] = {"name": self.name, "description": self.description}
        m = self.match.model_dump(exclude_none=True)
        if m.get("virtualization") == "any":
            m.pop("virtualization")
        if m:
            d["match"] = m
        d["knobs"] = self.values()
        if self.kernels:
            d["kernels"] = self.kernels
        if self.kernel_sources:
            d["kernel_sources"] = self.kernel_sources
        prov = self.provenance.model_dump(exclude_none=True)
        prov.setdefault("flattened_from", self.chain)
        d["provenance"] = prov
        return d


# -- loading ------------------------------------------------------------------------------------
def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _key_lines(node: Any) -> dict[tuple[str, ...], int]:
    """Line numbers of top-level keys and of keys under `knobs:`, for messages (duplicate keys
    are refused by the loader)."""
    lines: dict[tuple[str, ...], int] = {}
    if not isinstance(node, yaml.MappingNode):
        return lines
    for k, v in node.value:
        lines[(str(k.value),)] = k.start_mark.line + 1
        if str(k.value) == "knobs" and isinstance(v, yaml.MappingNode):
            for kk, _ in v.value:
                lines[("knobs", str(kk.value))] = kk.start_mark.line + 1
    return lines


def read_file(path: Path) -> tuple[ProfileFile, dict[tuple[str, ...], int]]:
    """One profile file, validated (its includes unresolved), and the lines of its keys. Read
    through safety.inputs: a regular file of at most 1 MiB, UTF-8, safe YAML within limits."""
    src = _rel(path)
    data, node = compose_yaml(read_text(path, src, error=BadInput), src, BadInput)
    lines = _key_lines(node)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{src}: expected a mapping (name, include, match, knobs, kernels, "
                       f"provenance), got {type(data).__name__}")
    try:
        pf = ProfileFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        line = lines.get((str(err["loc"][0]),)) if err["loc"] else None
        if err["type"] == "extra_forbidden":
            # never the value: a file that is not a profile (a password file, say) ends here
            raise BadInput(f"{src}{f':{line}' if line else ''}: field {loc}: not a profile "
                           "field (expected name, description, include, match, knobs, kernels, "
                           "kernel_sources, provenance, abstract)") from None
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise BadInput(f"{src}{f':{line}' if line else ''}: field {loc}: {err['msg']} "
                       f"(got {got})") from None
    for key, value in pf.knobs.items():
        why = check_knob_key(str(key))
        line = lines.get(("knobs", str(key)))
        if why:
            raise BadInput(f"{src}{f':{line}' if line else ''}: field knobs.{key}: {why}")
        if isinstance(value, dict) and not bound_of(value):
            raise BadInput(f"{src}{f':{line}' if line else ''}: field knobs.{key}: expected a "
                           f"value, `default`, {{at_least: N}} or {{at_most: N}}, got {value!r}")
    if pf.match and pf.match.driver:
        try:
            parse_range(pf.match.driver)
        except ValueError as e:
            raise BadInput(f"{src}:{lines.get(('match',), '?')}: field match.driver: {e}") from None
    return pf, lines


def bound_of(value: Any) -> Optional[tuple[str, Any]]:
    """`{at_least: N}` / `{at_most: N}`: keep the host's value when it already satisfies the
    bound (a profile must not lower a host that runs a larger vm.max_map_count, say)."""
    if isinstance(value, dict) and len(value) == 1:
        (k, v), = value.items()
        if k in ("at_least", "at_most") and isinstance(v, (int, float)) and not isinstance(v, bool):
            return k, v
    return None


def search_path(extra: list[Path] | None = None) -> list[Path]:
    """Where profile names are looked up: the given dirs (state dir profiles, /etc), then the
    shipped host_profiles/."""
    return [*(extra or []), SHIPPED_DIR]


def find(name_or_path: str, dirs: list[Path] | None = None, relative_to: Path | None = None) -> Path:
    """The file a profile name or path refers to. Anything present at a path counts (a FIFO or
    directory is then refused by the loader, with what it is), so a file is never skipped over."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        for cand in ([relative_to / p] if relative_to and not p.is_absolute() else []) + [p]:
            if os.path.lexists(cand):
                return cand
        raise BadInput(f"profile {name_or_path}: no such file")
    for d in ([relative_to] if relative_to else []) + search_path(dirs):
        for ext in (".yaml", ".yml"):
            if os.path.lexists(d / (name_or_path + ext)):
                return d / (name_or_path + ext)
    known = ", ".join(sorted({q.stem for d in search_path(dirs) for q in d.glob("*.y*ml")}))
    raise BadInput(f"profile {name_or_path!r} not found (known: {known or 'none'})")


MAX_INCLUDE_DEPTH = 32      # include levels below the profile named (shipped ones use 2)
MAX_INCLUDED_FILES = 256    # distinct files one profile may pull in


def load(name_or_path: str, dirs: list[Path] | None = None) -> Profile:
    path = find(name_or_path, dirs)
    return _Resolver(dirs).resolve(path, [])


class _Resolver:
    """Include resolution for one load: each file is read and resolved once (a diamond of
    includes costs one visit per file, not one per path to it), cycles and chains deeper than
    MAX_INCLUDE_DEPTH are refused, and at most MAX_INCLUDED_FILES files are read."""

    def __init__(self, dirs: list[Path] | None) -> None:
        self.dirs = dirs
        self.done: dict[Path, Profile] = {}
        self.roots: list[Path] = []  # where includes may resolve: set by the first resolve()

    def resolve(self, path: Path, stack: list[Path]) -> Profile:
        rp = path.resolve()
        if not self.roots:  # the profile named (its own folder), then the search path
            self.roots = list(dict.fromkeys(d.resolve() for d in [rp.parent, *search_path(self.dirs)]))
        if rp in stack:
            cyc = " -> ".join(_rel(p) for p in stack[stack.index(rp):] + [rp])
            raise BadInput(f"{_rel(stack[-1])}: field include: include cycle {cyc}")
        if rp in self.done:
            return self.done[rp]
        if len(stack) > MAX_INCLUDE_DEPTH:
            raise BadInput(f"{_rel(stack[-1])}: field include: includes nested more than "
                           f"{MAX_INCLUDE_DEPTH} levels deep (from {_rel(stack[0])})")
        if len(self.done) >= MAX_INCLUDED_FILES:
            raise BadInput(f"{_rel(stack[0])}: field include: more than {MAX_INCLUDED_FILES} "
                           "files included")
        self.done[rp] = prof = self._build(path, rp, stack)
        return prof

    def _build(self, path: Path, rp: Path, stack: list[Path]) -> Profile:
        pf, lines = read_file(path)
        src = _rel(path)
        merged_knobs: dict[str, KnobSetting] = {}
        kernels: dict[str, Any] = {}
        sources: dict[str, Any] = {}
        match: Optional[Match] = None
        chain: dict[str, None] = {}           # ordered set: a diamond lists each file once
        for inc in pf.include:
            try:
                ip = find(inc, self.dirs, relative_to=path.parent)
            except BadInput as e:
                raise BadInput(f"{src}:{lines.get(('include',), '?')}: field include: {e}") from None
            self._inside(ip, inc, src, lines)
            parent = self.resolve(ip, stack + [rp])
            for ks in parent.knobs:
                merged_knobs.pop(ks.key, None)
                merged_knobs[ks.key] = ks
            kernels = _deep_merge(kernels, parent.kernels)
            sources.update(parent.kernel_sources)
            match = parent.match if parent.match != Match() else match
            chain.update(dict.fromkeys(parent.chain))
        for key, value in pf.knobs.items():
            merged_knobs.pop(key, None)  # re-insert: a child's keys come after (win over) parents'
            merged_knobs[key] = KnobSetting(key=key, value=value, file=src,
                                            line=lines.get(("knobs", key)))
        chain[src] = None
        return Profile(
            name=pf.name or path.stem, path=src, description=pf.description, chain=list(chain),
            match=pf.match or match or Match(), knobs=list(merged_knobs.values()),
            kernels=_deep_merge(kernels, pf.kernels),
            kernel_sources={**sources, **pf.kernel_sources}, provenance=pf.provenance,
            abstract=pf.abstract,
        )


    def _inside(self, ip: Path, inc: str, src: str, lines: dict[tuple[str, ...], int]) -> None:
        """An include resolves (symlinks and `..` followed) inside the profile's own folder or
        the search path: a profile must not make root read, and quote, any file on the host."""
        real = ip.resolve()
        if not any(real.is_relative_to(r) for r in self.roots):
            name = inc if len(inc) <= 80 else inc[:77] + "..."
            raise BadInput(f"{src}:{lines.get(('include',), '?')}: field include: {name!r} "
                           "resolves outside the profile's folder and the profile search path "
                           f"({', '.join(_rel(r) for r in self.roots)}); includes are read only "
                           "from there")


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def list_profiles(dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for d in search_path(dirs):
        for p in sorted(d.glob("*.y*ml")):
            if p.stem in seen:
                continue  # an earlier dir shadows a shipped profile of the same name
            try:
                pr = _Resolver(dirs).resolve(p, [])
                seen[p.stem] = {"name": pr.name, "path": pr.path, "description": pr.description,
                                "include": pr.chain[:-1], "abstract": pr.abstract,
                                "match": pr.match.model_dump(exclude_none=True),
                                "knobs": len(pr.knobs),
                                "values_from": pr.provenance.values_from or "unstated"}
            except BadInput as e:
                seen[p.stem] = {"name": p.stem, "path": _rel(p), "error": str(e)}
    return list(seen.values())


# -- matching against detected hardware -------------------------------------------------------
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _ver(s: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", s)
    if not parts:
        raise ValueError(f"{s!r} is not a version")
    return tuple(int(x) for x in parts)


def parse_range(spec: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for term in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)?\s*([0-9][0-9.]*)\s*", term)
        if not m:
            raise ValueError(f"expected a version range like '>=550, <600', got {spec!r}")
        out.append((m.group(1) or "==", _ver(m.group(2))))
    return out


def _cmp(v: tuple[int, ...], op: str, w: tuple[int, ...]) -> bool:
    n = max(len(v), len(w))
    if op in ("==", "!="):  # "==550" matches any 550.x
        pre = v[:len(w)] == w
        return pre if op == "==" else not pre
    return _OPS[op](v + (0,) * (n - len(v)), w + (0,) * (n - len(w)))


def match_host(profile: Profile, hw: Any) -> list[str]:
    """Reasons the profile does not match the detected hardware (empty: it matches)."""
    m, why = profile.match, []
    names = [g.name for g in hw.gpus]
    if m.gpu_name:
        if not names:
            why.append(f"match.gpu_name {m.gpu_name}: no GPU detected")
        elif not all(any(fnmatch.fnmatch(n.lower(), p.lower()) for p in m.gpu_name) for n in names):
            why.append(f"match.gpu_name {m.gpu_name}: host has {sorted(set(names))}")
    if m.driver:
        if not hw.driver_version:
            why.append(f"match.driver {m.driver!r}: driver version unknown")
        else:
            v = _ver(hw.driver_version)
            if not all(_cmp(v, op, w) for op, w in parse_range(m.driver)):
                why.append(f"match.driver {m.driver!r}: host has {hw.driver_version}")
    if m.virtualization != "any":
        is_vm = hw.virtualization.is_vm
        if (m.virtualization == "vm") != is_vm:
            why.append(f"match.virtualization {m.virtualization}: host is "
                       f"{'a VM (' + ', '.join(hw.virtualization.evidence) + ')' if is_vm else 'bare metal'}")
    if m.min_gpus and len(names) < m.min_gpus:
        why.append(f"match.min_gpus {m.min_gpus}: host has {len(names)}")
    return why


# -- resolving against a host's knobs ---------------------------------------------------------
def resolve(profile: Profile, knobs: dict[str, Any]) -> tuple[dict[str, KnobSetting], list[KnobSetting]]:
    """(knob name -> the setting that applies, settings that match no knob on this host).
    An exact name beats a pattern; among patterns, the later (child) one wins."""
    out: dict[str, tuple[tuple[int, int], KnobSetting]] = {}
    unmatched = []
    for i, ks in enumerate(profile.knobs):
        exact = not any(c in ks.key for c in "*?[@")
        if exact:
            hits = [ks.key] if ks.key in knobs else []
        elif (m := re.fullmatch(r"pcie\.@(gpus|nics)\.(\w+)", ks.key)):
            # role selectors: every GPU, or every NIC on a GPU's PCIe path (tuner.pci.sysfs)
            role = m.group(1)[:-1]
            hits = [n for n, k in knobs.items() if n.startswith("pcie.") and n.endswith("." + m.group(2))
                    and getattr(getattr(k, "dev", None), "kind", None) == role]
        else:
            hits = [n for n in knobs if fnmatch.fnmatchcase(n, ks.key)]
        if not hits:
            unmatched.append(ks)
        for n in hits:
            rank = (1 if exact else 0, i)
            if n not in out or rank > out[n][0]:
                out[n] = (rank, ks)
    return {n: ks for n, (_, ks) in sorted(out.items())}, unmatched
