"""Dispatch table: for each (family, dtype, shape bucket) the chosen variant and config and the
shape range it was validated on. Plain data; round-trips through a dict (the `kernels:` section of
a host profile) and JSON."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

VERSION = 1
SOURCE_PREFIX = "src:"  # variant "src:<sha256>": a source from kernelsearch.store, not a shipped file


def source_digest(variant: str) -> Optional[str]:
    """The SHA-256 a `src:` variant names, or None for a shipped variant."""
    return variant[len(SOURCE_PREFIX):] if variant.startswith(SOURCE_PREFIX) else None


class TableError(ValueError):
    """A malformed dispatch table: names the field and what was expected."""


MAX_TABLE_BYTES = 8 << 20  # a table of every family at every shape is a few hundred KiB


def _brief(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


@dataclass
class Entry:
    family: str
    dtype: str
    match: dict[str, int]  # dims that must equal (model dims: cols, N/K, heads, head dim)
    ranges: dict[str, list[int]]  # dim -> [lo, hi], inclusive, validated range
    variant: str
    config: dict[str, Any]
    speedup: Optional[float] = None  # vs the faster torch baseline where measured
    measured: list[dict] = field(default_factory=list)  # shapes timed/checked for this entry
    # the second yardstick: the best installed library kernel's time / this entry's where one
    # was measured (1.0 for an entry that is that library kernel; None: no library offered)
    speedup_vs_library: Optional[float] = None
    # energy beside time (where measured, kernelsearch.energy): joules and mean board watts per
    # call, and the best library kernel's joules / this entry's (>1: this entry uses less)
    energy_j: Optional[float] = None
    mean_w: Optional[float] = None
    energy_vs_library: Optional[float] = None

    def covers(self, dims: dict[str, int]) -> bool:
        for k, v in self.match.items():
            if dims.get(k) != v:
                return False
        for k, (lo, hi) in self.ranges.items():
            if not lo <= dims.get(k, -1) <= hi:
                return False
        return True


@dataclass
class DispatchTable:
    entries: list[Entry] = field(default_factory=list)
    device: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def lookup(self, family: str, dtype: str, dims: dict[str, int]) -> Optional[Entry]:
        for e in self.entries:
            if e.family == family and e.dtype == dtype and e.covers(dims):
                return e
        return None

    def choose(self, family: str, dtype: str, dims: dict[str, int], usable: Any = None,
               objective: Optional[str] = None) -> tuple[str, Optional[Entry], Optional[str]]:
        """What runs a call, in FALLBACK order: ("table", entry, variant) for the first entry
        that covers it and is `usable(entry)` (default: a library entry only where that library
        is found here, a Gluon one only where it is offered: kernelsearch.families.gluon), else ("library", None, variant) for the best library kernel offered at
        the shape, else ("torch", None, None). `objective` (default: the table's
        meta["objective"], else "throughput"): under "energy" an entry gives way to the library
        where it was measured using no less energy than it (`energy_vs_library`)."""
        from kernelsearch.families import get, library as libvars

        if objective is None:
            objective = str(self.meta.get("objective") or "throughput")
        fam = get(family)
        for e in self.entries:
            if e.family == family and e.dtype == dtype and e.covers(dims):
                var = fam.variants.get(e.variant)
                ok = usable(e) if usable is not None else (
                    var is None or not (var.kind == "library" or var.gpu_only)
                    or var.valid(e.config, _shape(fam, dims)))
                if ok and not self._yields(fam, e, dims, dtype, objective):
                    return "table", e, e.variant
        shape = _shape(fam, dims)
        best = libvars.best(fam, shape, dtype) if shape is not None else None
        return ("library", None, best) if best else ("torch", None, None)

    @staticmethod
    def _yields(fam: Any, e: Entry, dims: dict[str, int], dtype: str,
                objective: str = "throughput") -> bool:
        """An entry measured no faster than the best library kernel (speedup_vs_library within
        LIBRARY_MARGIN) gives way to that library wherever it is offered here: a table built
        or shipped without the library must not override it on a host that has it. Under the
        "energy" objective the same, by energy (energy_vs_library) where it was measured."""
        from kernelsearch.families import library as libvars

        x = e.energy_vs_library if objective == "energy" and e.energy_vs_library is not None \
            else e.speedup_vs_library
        if x is None or x > 1 + LIBRARY_MARGIN:
            return False
        var = fam.variants.get(e.variant)
        if var is not None and var.kind == "library":
            return False
        shape = _shape(fam, dims)
        return shape is not None and libvars.best(fam, shape, dtype) is not None

    def to_dict(self) -> dict:
        return {"version": VERSION, "device": self.device, "meta": self.meta,
                "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "table") -> "DispatchTable":
        if not isinstance(d, dict):
            raise TableError(f"{where}: expected a mapping with 'entries', got {type(d).__name__}")
        if d.get("version", VERSION) != VERSION:
            raise TableError(f"{where}.version: expected {VERSION}, got {_brief(d.get('version'))}")
        entries = d.get("entries", [])
        if not isinstance(entries, list):
            raise TableError(f"{where}.entries: expected a list")
        from kernelsearch.families import NAMES, get

        out = []
        for i, e in enumerate(entries):
            w = f"{where}.entries[{i}]"
            if not isinstance(e, dict):
                raise TableError(f"{w}: expected a mapping")
            for k in ("family", "dtype", "variant"):
                if not isinstance(e.get(k), str):
                    raise TableError(f"{w}.{k}: expected a string, got {_brief(e.get(k))}")
            if e["family"] not in NAMES:
                raise TableError(f"{w}.family: unknown family {_brief(e['family'])}; expected one of "
                                 f"{', '.join(NAMES)}")
            fam = get(e["family"])
            sha = source_digest(e["variant"])
            if sha is not None:
                from kernelsearch.store import SHA_RE

                if not SHA_RE.match(sha):
                    raise TableError(f"{w}.variant: expected src:<sha256> (64 lowercase hex "
                                     f"digits), got {_brief(e['variant'])}")
            elif e["variant"] not in fam.variants:
                raise TableError(f"{w}.variant: {e['family']} has no variant {_brief(e['variant'])}; "
                                 f"expected one of {sorted(fam.variants)} or src:<sha256>")
            if e["dtype"] not in fam.dtypes:
                raise TableError(f"{w}.dtype: expected one of {fam.dtypes}, got {_brief(e['dtype'])}")
            cfg = e.get("config", {})
            if sha is not None:  # a stored source's own parameters: constants only
                if not isinstance(cfg, dict) or not all(
                        isinstance(k, str) and isinstance(v, (int, str, bool)) for k, v in cfg.items()):
                    raise TableError(f"{w}.config: expected name: int|str|bool pairs, got {_brief(cfg)}")
            else:
                dims = fam.variants[e["variant"]].dims
                if not isinstance(cfg, dict) or set(cfg) - set(dims):
                    raise TableError(f"{w}.config: expected keys among {sorted(dims)}, got "
                                     f"{_brief(sorted(cfg) if isinstance(cfg, dict) else cfg)}")
                for k, v in cfg.items():
                    if v not in dims[k]:
                        raise TableError(f"{w}.config.{k}: expected one of {dims[k]}, got {_brief(v)}")
            match = e.get("match", {})
            ranges = e.get("ranges", {})
            if not isinstance(match, dict) or not all(
                    k in fam.shape_dims and isinstance(v, int) for k, v in match.items()):
                raise TableError(f"{w}.match: expected integer values for dims of "
                                 f"{fam.shape_dims}, got {_brief(match)}")
            if not isinstance(ranges, dict) or not all(
                    k in fam.shape_dims and isinstance(r, list) and len(r) == 2
                    and all(isinstance(x, int) for x in r) and r[0] <= r[1]
                    for k, r in ranges.items()):
                raise TableError(f"{w}.ranges: expected dim: [lo, hi] integer pairs (lo <= hi) "
                                 f"for dims of {fam.shape_dims}, got {_brief(ranges)}")
            sp = e.get("speedup")
            if sp is not None and (isinstance(sp, bool) or not isinstance(sp, (int, float))):
                raise TableError(f"{w}.speedup: expected a number, got {_brief(sp)}")
            meas = e.get("measured", [])
            if not isinstance(meas, list) or not all(isinstance(m, dict) for m in meas):
                raise TableError(f"{w}.measured: expected a list of mappings, got {_brief(meas)}")
            out.append(Entry(e["family"], e["dtype"], dict(match),
                             {k: list(r) for k, r in ranges.items()}, e["variant"], dict(cfg),
                             e.get("speedup"), list(e.get("measured", [])),
                             e.get("speedup_vs_library"),
                             *(_number(e, k, w) for k in ("energy_j", "mean_w",
                                                          "energy_vs_library"))))
        if not isinstance(d.get("device", ""), str):
            raise TableError(f"{where}.device: expected a string, got {_brief(d['device'])}")
        if not isinstance(d.get("meta", {}), dict):
            raise TableError(f"{where}.meta: expected a mapping, got {_brief(d['meta'])}")
        return cls(out, str(d.get("device", "")), dict(d.get("meta", {})))

    def sources(self) -> list[str]:
        """The SHA-256 digests of the stored sources the entries name (in entry order)."""
        out: list[str] = []
        for e in self.entries:
            sha = source_digest(e.variant)
            if sha and sha not in out:
                out.append(sha)
        return out

    def save(self, path: Union[str, Path]) -> None:
        """Atomically, never through a symlink (kernelsearch.store.atomic_write)."""
        from kernelsearch.store import atomic_write

        atomic_write(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode())

    @classmethod
    def load(cls, path: Union[str, Path]) -> "DispatchTable":
        from safety.inputs import load_json  # regular file, size, UTF-8, depth, no NaN

        p = Path(path)
        d = load_json(p, str(p), limit=MAX_TABLE_BYTES, error=TableError)
        if isinstance(d, dict) and "kernels" in d and "entries" not in d:
            d = d["kernels"]
        return cls.from_dict(d, where=str(p))


# what dispatch runs for a call, first that applies: the table's entry covering it, the best
# installed library kernel offered at its shape, the family's torch op
FALLBACK = ("table", "library", "torch")

#: a searched kernel must beat the best library kernel at its shape by more than this to get
#: an entry (plan) or, in a mixed search, to be measured end to end at all (behind_library)
LIBRARY_MARGIN = 0.02


def _number(e: dict, k: str, where: str) -> Optional[float]:
    v = e.get(k)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
        raise TableError(f"{where}.{k}: expected a non-negative number, got {_brief(v)}")
    return None if v is None else float(v)


def _shape(fam: Any, dims: dict[str, int]) -> Optional[tuple]:
    return tuple(dims[k] for k in fam.shape_dims) if all(k in dims for k in fam.shape_dims) \
        else None


def _within_constraints(fam: Any, r: dict, primary: str, lo: int, hi: int) -> tuple[int, int]:
    """Shrink [lo, hi] along the primary dim to where the variant's own constraints accept the
    config (e.g. matmul/skinny is for M <= 16: a midpoint range towards M = 4096 would run it
    where it was never meant to). Bisection from the measured point; constraints are taken to
    hold on one interval around it."""
    var = fam.variants.get(r["variant"])
    pt = r["dims"][primary]

    def ok(v: int) -> bool:
        d = dict(r["dims"], **{primary: v})
        return bool(var.valid(r["config"], tuple(d[k] for k in fam.shape_dims)))

    if var is None or not ok(pt):
        return lo, hi

    def last_ok(good: int, bad: int) -> int:  # the accepted end nearest `bad`, from `good`
        while abs(bad - good) > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if ok(mid) else (good, mid)
        return good

    return (lo if ok(lo) else last_ok(pt, lo)), (hi if ok(hi) else last_ok(pt, hi))


def _key(variant: str, config: dict, dtype: str) -> str:
    return json.dumps([variant, config, dtype], sort_keys=True)


def largest_point(entry: Entry) -> tuple:
    """The shape at the top of every range of an entry (its exact dims as matched): the point
    a table entry claims that is furthest from anything small."""
    from kernelsearch.families import get

    fam = get(entry.family)
    dims = dict(entry.match, **{k: hi for k, (lo, hi) in entry.ranges.items()})
    return tuple(int(dims[d]) for d in fam.shape_dims)


Evidence = dict[str, set]  # _key(variant, config, dtype) -> shapes correctness-checked


def evidence_of(checked: Any) -> Evidence:
    """Evidence from (variant, config, dtype, shape) records (tuples or dicts)."""
    ev: Evidence = {}
    for c in checked or []:
        v, cfg, dt, shape = (c["variant"], c["config"], c["dtype"], c["shape"]) \
            if isinstance(c, dict) else c
        ev.setdefault(_key(v, cfg, dt), set()).add(tuple(int(x) for x in shape))
    return ev


def uncertified(entries: list[Entry], evidence: Evidence) -> list[tuple[Entry, tuple]]:
    """Entries whose largest point was not correctness-checked for their variant, config and
    dtype, with that point."""
    out = []
    for e in entries:
        pt = largest_point(e)
        if pt not in evidence.get(_key(e.variant, e.config, e.dtype), set()):
            out.append((e, pt))
    return out


def certify(entries: list[Entry], evidence: Evidence) -> list[Entry]:
    """Refuse (TableError) an entry that covers a range whose largest point was never checked:
    a kernel is certified for the sizes it was checked at, not for what lies between them."""
    bad = uncertified(entries, evidence)
    if bad:
        e, pt = bad[0]
        raise TableError(
            f"{e.family} {e.dtype} {e.variant} {json.dumps(e.config, sort_keys=True)}: the entry "
            f"covers {e.ranges} but its largest point {'x'.join(map(str, pt))} was not "
            f"correctness-checked ({len(bad)} such entr{'y' if len(bad) == 1 else 'ies'}); check "
            "it (kernelsearch.harness.check with shapes=[point]) or narrow the range")
    return entries


def build(family_name: str, results: list[dict], margin: float = LIBRARY_MARGIN,
          device: str = "", checked: Any = None,
          objective: str = "throughput") -> list[Entry]:
    """`plan`, then `certify`: every entry's largest point must be among the shapes checked for
    its (variant, config, dtype): `checked` records (see `evidence_of`) and each result's own
    "checked" list of shapes. Raises TableError otherwise."""
    ev = evidence_of(checked)
    for r in [_with_library(r, margin, objective) for r in results]:
        if r.get("variant") is not None:
            for shape in r.get("checked", []):
                ev.setdefault(_key(r["variant"], r["config"], r["dtype"]), set()).add(
                    tuple(int(x) for x in shape))
    return certify(plan(family_name, results, margin, device, objective), ev)


def plan(family_name: str, results: list[dict], margin: float = LIBRARY_MARGIN,
         device: str = "", objective: str = "throughput") -> list[Entry]:
    """Entries from per-shape search results, not yet certified (see `build`). Each result: {"shape", "dtype", "variant",
    "config", "time_s", "baseline_s"} (baseline: the faster torch path), and where a library
    kernel was measured at the shape, "library_variant" and "library_s" (the best one's time).
    A shape gets an entry only where the kernel beats both yardsticks by more than `margin`:
    the torch baseline and the best library kernel. Where the library kernel is the fastest
    (beating torch by the margin) the shape's entry names the library variant instead, so the
    table says what runs there. Its range along the family's primary range dim runs to the
    geometric midpoints between measured shapes (never past the smallest or largest measured
    one, nor past where the variant's constraints reject the config), and neighbours with the
    same winner merge."""
    from kernelsearch.families import get

    fam = get(family_name)
    primary = fam.range_dims[-1]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        dims = fam.dims_dict(tuple(r["shape"]))
        key = (r["dtype"],) + tuple((k, dims[k]) for k in fam.shape_dims if k != primary)
        groups.setdefault(key, []).append(dict(r, dims=dims))
    entries: list[Entry] = []
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["dims"][primary])
        pts = [r["dims"][primary] for r in rs]
        for i, r in enumerate(rs):
            r = _with_library(r, margin, objective)
            if r.get("variant") is None or r["time_s"] * (1 + margin) >= r["baseline_s"]:
                continue
            lo = pts[i] if i == 0 else math.floor(math.sqrt(pts[i - 1] * pts[i])) + 1
            hi = pts[i] if i == len(rs) - 1 else math.floor(math.sqrt(pts[i] * pts[i + 1]))
            lo, hi = min(lo, pts[i]), max(hi, pts[i])
            lo, hi = _within_constraints(fam, r, primary, lo, hi)
            match = {k: r["dims"][k] for k in fam.exact_dims}
            ranges = {k: [r["dims"][k], r["dims"][k]] for k in fam.range_dims if k != primary}
            ranges[primary] = [lo, hi]
            meas = {"shape": list(r["shape"]), "time_us": r["time_s"] * 1e6,
                    "baseline_us": r["baseline_s"] * 1e6}
            lib_x = None
            if r.get("library_s"):
                meas.update(library=r["library_variant"], library_us=r["library_s"] * 1e6)
                lib_x = r["library_s"] / r["time_s"]
            en = {k: r[k] for k in ("energy_j", "mean_w") if r.get(k) is not None}
            meas.update(en)  # per call, where measured (kernelsearch.energy)
            lib_e = r["library_energy_j"] / r["energy_j"] \
                if r.get("library_energy_j") and r.get("energy_j") else None
            prev = entries[-1] if entries else None
            if prev and prev.family == family_name and prev.dtype == r["dtype"] \
                    and prev.variant == r["variant"] and prev.config == r["config"] \
                    and prev.match == match and prev.ranges[primary][1] + 1 == lo \
                    and all(prev.ranges[k] == v for k, v in ranges.items() if k != primary):
                prev.ranges[primary][1] = hi
                prev.measured.append(meas)
                prev.speedup = min(prev.speedup or 1e9, r["baseline_s"] / r["time_s"])
                if lib_x is not None:
                    prev.speedup_vs_library = min(prev.speedup_vs_library or 1e9, lib_x)
                if lib_e is not None:
                    prev.energy_vs_library = min(prev.energy_vs_library or 1e9, lib_e)
                continue
            entries.append(Entry(family_name, r["dtype"], match, ranges, r["variant"],
                                 dict(r["config"]), r["baseline_s"] / r["time_s"], [meas],
                                 lib_x, en.get("energy_j"), en.get("mean_w"), lib_e))
    return entries


def behind_library(verdict: dict, margin: float = LIBRARY_MARGIN) -> Optional[str]:
    """Why an accepted choice of a searched (non-library) variant cannot be worth a table
    entry: the judge timed the best library kernel at its shape (`speedup_vs_library`, the
    library's time / this kernel's, the library's layout conversion counted) and this kernel
    was not more than `margin` faster. None: no library was timed there, the choice is a
    library kernel itself, or it is faster. Where no entry covers a call dispatch runs that
    library kernel, so such an entry could only tie or lose to it."""
    x = verdict.get("speedup_vs_library")
    if verdict.get("kind") == "library" or not x:
        return None
    if x > 1.0 + margin:
        return None
    return (f"x{x:.2f} against {verdict.get('library') or 'the best library kernel'} at this "
            f"shape (needs more than x{1.0 + margin:.2f}): the library kernel runs here instead")


def _with_library(r: dict, margin: float, objective: str = "throughput") -> dict:
    """The result a shape's entry is made from: the searched kernel's where it beats the best
    library kernel measured there by more than `margin`, otherwise the library kernel's. Under
    "energy", where both energies were measured, beating it means using less energy a call."""
    if not r.get("library_s") or not r.get("library_variant"):
        return r
    if r.get("variant") == r["library_variant"]:
        return dict(r, library_s=min(r["library_s"], r["time_s"]))
    ours, lib = r["time_s"], r["library_s"]
    if objective == "energy" and r.get("energy_j") and r.get("library_energy_j"):
        ours, lib = r["energy_j"], r["library_energy_j"]
    if r.get("variant") is not None and ours * (1 + margin) < lib:
        return r
    return dict(r, variant=r["library_variant"], config={}, time_s=r["library_s"],
                energy_j=r.get("library_energy_j"), mean_w=r.get("library_mean_w"),
                checked=r.get("library_checked", []))


def overlaps(a: Entry, b: Entry) -> bool:
    """Same family, dtype and match, and intersecting ranges in every shared dim."""
    if (a.family, a.dtype, a.match) != (b.family, b.dtype, b.match):
        return False
    for k in set(a.ranges) & set(b.ranges):
        (alo, ahi), (blo, bhi) = a.ranges[k], b.ranges[k]
        if ahi < blo or bhi < alo:
            return False
    return True


def trim(e: Entry, n: Entry) -> list[Entry]:
    """What is left of base entry `e` outside new entry `n`: where the two differ in one range
    dim only, the parts of e's range below and above n's (a base entry validated on rows
    363-65536 keeps 363-16383 when a new one takes 16384-65536); otherwise nothing."""
    import dataclasses

    diff = [k for k in e.ranges if e.ranges[k] != n.ranges.get(k)]
    if len(diff) != 1 or set(e.ranges) != set(n.ranges):
        return []
    k = diff[0]
    (lo, hi), (nlo, nhi) = e.ranges[k], n.ranges[k]
    parts = [(lo, nlo - 1)] if lo < nlo else []
    parts += [(nhi + 1, hi)] if hi > nhi else []
    return [dataclasses.replace(e, ranges={**e.ranges, k: [a, b]}) for a, b in parts]


def merge(base: DispatchTable, added: list[Entry], note: str = "") -> DispatchTable:
    """`added` entries replace the base entries they overlap (a base range sticking out on one
    side or both is kept there); the rest of base is kept. Lookups take the first covering
    entry, so new entries go first."""
    import time

    kept = list(base.entries)
    for n in added:
        kept = [part for e in kept for part in ((trim(e, n) if overlaps(e, n) else [e]))]
    meta = dict(base.meta)
    meta[f"update_{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}"] = note or (
        f"merged {len(added)} entries ({', '.join(sorted({e.family for e in added}))}); "
        f"{len(base.entries) - len(kept)} overlapping entries replaced")
    return DispatchTable(list(added) + kept, device=base.device, meta=meta)
