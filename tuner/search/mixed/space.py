"""The joint search space of a mixed search: host knobs + runtime settings + kernel slots.

- host: one dimension per knob over the domain the device reports (`SearchSpace.for_knobs`);
- runtime: `runtime.<setting>` over a few values (the holistic workload's `Runtime` fields);
- kernels: one slot per (family, dtype, shape) the workload actually calls (traced by running it
  once), `kernel.<family>.<dtype>.<shape>`, a categorical over "torch" (no table entry) and up to
  `max_choices - 1` valid (variant, config) choices of the family's space at that shape. No two
  choices of a slot run the same kernel there (`Slot.runs`): with no entry dispatch runs the best
  installed library kernel, so an entry naming that library would be an A/B that changes nothing.
  A slot's incumbent is what dispatch runs with the start table (`Slot.covered_by`): an entry
  measured behind the library found here gives way to it, so the incumbent there is the library,
  and the tables the search builds keep such entries as measured (`Incumbent.table`).

Dimensions are interleaved by kind (host, runtime, kernel, host, ...) so a coordinate sweep meets
every kind early. A point maps to a Candidate holding only what differs from the incumbent
(`knobs`, `runtime`, `kernels`); the incumbent moves when a trial is kept, so the mapping reads it
live. Kernel slots become dispatch-table entries validated on exactly their shape.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from tuner.knobs.base import values_equal
from tuner.proposers.base import Dim, Point, SearchSpace
from tuner.trial import Candidate, KernelChoice
from tuner.workloads.llama import RUNTIME_DIMS  # noqa: F401 - where searches import it from
from tuner.workloads.trace import trace_kernel_calls  # noqa: F401 - likewise

TORCH = "torch"
#: a host dimension's value for "as found at the start" where that value has no point in the
#: knob's search domain (unlocked clocks): without it every candidate would pin some clock, and
#: a kernel-only trial would carry a host change with it
AS_FOUND = "as-found"


def label(variant: Optional[str], config: dict[str, Any]) -> str:
    """A slot value: "torch" or e.g. `row{"ROWS":1,"num_warps":4}`."""
    if variant is None:
        return TORCH
    return variant + json.dumps(config, sort_keys=True, separators=(",", ":"))


def parse_label(value: str) -> tuple[Optional[str], dict[str, Any]]:
    if value == TORCH:
        return None, {}
    i = value.index("{")
    return value[:i], json.loads(value[i:])


@dataclass(frozen=True)
class Slot:
    family: str
    dtype: str
    shape: tuple[int, ...]
    choices: tuple[str, ...]  # labels, the one that runs what no entry runs first
    variants: Optional[tuple[str, ...]] = None  # the only variants this slot's call path runs

    @property
    def bucket(self) -> str:
        return f"{self.dtype}:{'x'.join(map(str, self.shape))}"

    @property
    def name(self) -> str:
        return f"kernel.{self.family}.{self.bucket}"

    def choice(self, value: str) -> KernelChoice:
        v, cfg = parse_label(value)
        return KernelChoice(family=self.family, variant=v, config=cfg, shape_bucket=self.bucket)

    def entry(self, value: str) -> Any:
        """The dispatch-table entry for a kernel choice: this exact shape, nothing else. It has
        no `speedup_vs_library`, so dispatch runs it even where a library is found."""
        from kernelsearch.families import get
        from kernelsearch.table import Entry

        v, cfg = parse_label(value)
        fam = get(self.family)
        dims = fam.dims_dict(self.shape)
        return Entry(self.family, self.dtype, {k: dims[k] for k in fam.exact_dims},
                     {k: [dims[k], dims[k]] for k in fam.range_dims}, v or "", dict(cfg),
                     measured=[{"shape": list(self.shape), "by": "metaltune search mixed"}])

    def narrowed(self, table: Any) -> list[Any]:
        """`table`'s entries that cover this shape, in order, each narrowed to it and keeping
        what was measured (`speedup`, `speedup_vs_library`, `measured`): at this shape dispatch
        does with them exactly what it does with `table` (an entry measured behind the library
        still gives way to it here, and still runs where the library is absent)."""
        import copy
        from dataclasses import replace

        from kernelsearch.families import get

        if not table:
            return []
        fam = get(self.family)
        dims = fam.dims_dict(self.shape)
        return [replace(copy.deepcopy(e), match={k: dims[k] for k in fam.exact_dims},
                        ranges={k: [dims[k], dims[k]] for k in fam.range_dims})
                for e in table.entries
                if e.family == self.family and e.dtype == self.dtype and e.covers(dims)]

    def runs(self, value: str) -> str:
        """What dispatch runs at this shape (the only one a slot serves) for choice `value`, as a
        label: its entry's choice where dispatch uses the entry, else the best installed library
        kernel offered here (no entry: "torch" runs that; an entry naming a library not found),
        else "torch". Choices that run the same are one choice (kernelsearch.table.FALLBACK;
        on CUDA tensors, the only ones library kernels take)."""
        from kernelsearch.families import get
        from kernelsearch.table import DispatchTable

        _, e, variant = DispatchTable([] if value == TORCH else [self.entry(value)]).choose(
            self.family, self.dtype, get(self.family).dims_dict(self.shape))
        return label(variant, e.config if e is not None else {})

    def covered_by(self, table: Any) -> str:
        """The label of the entry dispatch runs at this shape with `table`
        (`DispatchTable.choose`), or "torch" where it falls back: no entry covers the shape,
        or the one that does gives way to the library found here, or names one not found."""
        from kernelsearch.families import get

        if not table:
            return TORCH
        _, e, _ = table.choose(self.family, self.dtype, get(self.family).dims_dict(self.shape))
        return TORCH if e is None else label(e.variant, e.config)


# -- which kernel calls the workload makes ---------------------------------------------------


def kernel_slots(calls: Iterable[tuple[str, str, tuple[int, ...]]], families: Optional[list[str]],
                 max_choices: int = 6, start_table: Any = None,
                 sources: Optional[dict[str, list[tuple[str, dict[str, Any]]]]] = None,
                 suggest: Sequence[Any] = (),
                 variants: Optional[dict[str, Sequence[str]]] = None) -> list[Slot]:
    """Slots for the traced calls of `families` (all when None) in a dtype the family takes
    (on the CPU: Triton's interpreter runs them). Choices: "torch", the start table's choice,
    the best library kernel this host offers at the shape (kernelsearch.families.library),
    the choice of each `suggest` table (the tables shipped for this GPU) that covers the shape,
    the family's stored sources (`sources`: family -> [("src:<sha256>", config)], see
    `stored_sources`), then evenly spaced valid configs of the family's space at that shape.
    The suggested choices count towards `max_choices` but are never cut: a table measured for
    this GPU is the first thing worth measuring. `variants` (family -> names) limits a family to
    the variants the workload's call path runs (the HF patch's static-cache attention runs only
    flashdec): any other choice would be measured as the torch path, a no-op change. A choice
    that runs what an earlier one runs (`Slot.runs`) is left out: where the library is found,
    "torch" (no entry) and the library's own entry are one choice, the start table's when it is
    one of them, else the library's (it says what runs)."""
    from kernelsearch.families import get, library
    from tuner.proposers.classic import spread

    out = []
    for family, dtype, shape in sorted(set(calls)):
        if families is not None and family not in families:
            continue
        fam = get(family)
        if dtype not in fam.dtypes:
            continue
        allowed = tuple((variants or {}).get(family, ())) or None
        configs = [label(v, c) for v, c in fam.space(shape) if allowed is None or v in allowed]
        if not configs:
            continue
        slot = Slot(family, dtype, tuple(shape), (), allowed)
        start = slot.covered_by(start_table)
        # the best installed library kernel at this shape: the yardstick, never cut
        lib = [x for x in (label(n, {}) for n in library.offered(fam, shape, dtype)[:1])
               if x in configs]
        nothing = slot.runs(TORCH)  # what runs with no entry
        first = start if slot.runs(start) == nothing else next(
            (x for x in lib if slot.runs(x) == nothing), TORCH)
        picks: list[str] = []
        ran: set[str] = set()  # what the picks run

        def add(x: str) -> None:
            r = slot.runs(x)
            if r not in ran:
                ran.add(r)
                picks.append(x)

        for x in [first, start] + lib:
            add(x)
        for t in suggest:
            v = slot.covered_by(t)
            if v.startswith("src:") or v in configs:
                add(v)  # a config outside the slot's configs would fail the gate
        for x in [label(v, c) for v, c in (sources or {}).get(family, [])]:
            if len(picks) >= max_choices - 1:
                break
            add(x)
        rest = [c for c in configs if slot.runs(c) not in ran]
        picks += spread(rest, max(0, max_choices - len(picks)))
        out.append(Slot(family, dtype, tuple(shape), tuple(picks), allowed))
    return out


def suggested_point(slots: Sequence[Slot], incumbent: dict[str, str],
                    suggest: Sequence[Any]) -> dict[str, str]:
    """{slot name: label} of the suggestion tables' choices where they differ from the
    incumbent's (the first table covering a slot decides it): one candidate that applies the
    shipped table to every slot it covers, measured before the proposer's own."""
    out = {}
    for s in slots:
        for t in suggest:
            v = s.covered_by(t)
            if v != TORCH:
                if v in s.choices and v != incumbent.get(s.name, TORCH):
                    out[s.name] = v
                break
    return out


def stored_sources(store: Any) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every source in a kernelsearch store the judge accepted, by family, newest first, as
    slot choices ("src:<sha256>", its config): each is judged again at the slot's shape."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for r in reversed(store.list()):
        if r.verdict.get("verdict") == "accepted" and not r.quarantined:
            out.setdefault(r.family, []).append((f"src:{r.sha256}", dict(r.config)))
    return out


# -- the incumbent and the space -------------------------------------------------------------


@dataclass
class Incumbent:
    """What a mixed trial is measured against: host knob values, the workload's runtime, each
    kernel slot's choice. Dicts are shared with the evaluators and updated in place."""

    host: dict[str, Any]
    runtime: dict[str, Any]
    kernels: dict[str, str]  # slot name -> label
    base_entries: list[Any] = field(default_factory=list)  # table entries of unsearched families
    # slot name -> (its label at the start, the start table's entries there: Slot.narrowed)
    start: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)

    @classmethod
    def at_start(cls, host: dict[str, Any], runtime: dict[str, Any], slots: Iterable[Slot],
                 start_table: Any = None) -> "Incumbent":
        """The incumbent before any trial: each slot's choice is what dispatch runs there with
        the start table (an entry that gives way to the library is not what runs)."""
        slots = list(slots)
        searched = {s.family for s in slots}
        start = {s.name: (s.covered_by(start_table), s.narrowed(start_table)) for s in slots}
        return cls(host, runtime, {n: v for n, (v, _) in start.items()},
                   [e for e in (start_table.entries if start_table else [])
                    if e.family not in searched], start)

    def table(self, kernels: Optional[dict[str, str]] = None, slots: Iterable[Slot] = ()) -> Any:
        """A DispatchTable: each slot's entry, then the unsearched entries. A slot still at its
        start choice keeps the start table's entries there as measured (their
        `speedup_vs_library` decides whether they give way to a library); any other non-torch
        choice is a new entry, which runs."""
        from kernelsearch.table import DispatchTable

        choice = self.kernels if kernels is None else kernels
        entries: list[Any] = []
        for s in slots:
            v = choice.get(s.name, TORCH)
            if s.name in self.start and v == self.start[s.name][0]:
                entries += self.start[s.name][1]
            elif v != TORCH:
                entries.append(s.entry(v))
        return DispatchTable(entries + list(self.base_entries))


def kinds_of(c: Candidate) -> list[str]:
    """Which kinds a candidate touches: host, runtime, kernel."""
    out = []
    if c.knobs:
        out.append("host")
    if c.runtime:
        out.append("runtime")
    if c.kernels or c.kernel is not None:
        out.append("kernel")
    return out


@dataclass
class JointSpace:
    knobs: dict[str, Any]
    runtime_dims: dict[str, list[Any]]
    slots: list[Slot]
    incumbent: Incumbent
    space: SearchSpace = field(init=False)
    _asked: dict[int, tuple[Candidate, Point]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        inc = self.incumbent
        self.host = SearchSpace.for_knobs(self.knobs, start=inc.host)
        self.doms = {d.name: self.knobs[d.name].limits() for d in self.host.dims}
        self.as_found = {d.name: inc.host.get(d.name) for d in self.host.dims
                         if self.doms[d.name].to_search(inc.host.get(d.name)) is None}
        self.host_dims = [Dim(d.name, [AS_FOUND] + list(d.values)) if d.name in self.as_found
                          else d for d in self.host.dims]
        self.by_bucket = {(s.family, s.bucket): s for s in self.slots}
        rt = [Dim(f"runtime.{k}", list(v)) for k, v in self.runtime_dims.items()]
        ks = [Dim(s.name, list(s.choices)) for s in self.slots]
        groups = [self.host_dims, rt, ks]
        dims = [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]
        self.space = SearchSpace(dims, self.to_candidate, self.from_candidate,
                                 start=self.incumbent_point(partial=True))

    # point -> candidate: what differs from the incumbent
    def to_candidate(self, p: Point) -> Candidate:
        inc = self.incumbent
        full = {d.name: self.as_found[d.name] if p[d.name] == AS_FOUND
                else self.doms[d.name].from_search(p[d.name]) for d in self.host_dims}
        c = Candidate(
            knobs={n: v for n, v in full.items() if not values_equal(v, inc.host.get(n))},
            runtime={k: p[f"runtime.{k}"] for k in self.runtime_dims
                     if p[f"runtime.{k}"] != inc.runtime.get(k)},
            kernels=[s.choice(p[s.name]) for s in self.slots
                     if p[s.name] != inc.kernels.get(s.name, TORCH)],
        )
        self._asked[id(c)] = (c, dict(p))  # tell() gets this very object back
        return c

    def incumbent_point(self, partial: bool = False) -> Optional[Point]:
        """The incumbent as a point; a host value with no search equivalent (unlocked clocks)
        has none: left out when `partial`, else None."""
        inc = self.incumbent
        p: Point = {}
        for d in self.host_dims:
            v = self._host_value(d, inc.host.get(d.name))
            if v is None:
                if partial:
                    continue
                return None
            p[d.name] = v
        for k in self.runtime_dims:
            p[f"runtime.{k}"] = inc.runtime.get(k)
        for s in self.slots:
            p[s.name] = inc.kernels.get(s.name, TORCH)
        return p

    def from_candidate(self, c: Candidate) -> Optional[Point]:
        asked = self._asked.get(id(c))
        if asked is not None and asked[0] is c:
            return dict(asked[1])
        # a candidate from elsewhere (the LLM proposer): its changes over the incumbent point
        p = self.incumbent_point(partial=True) or {}
        try:
            for n, v in c.knobs.items():
                d = next(d for d in self.host_dims if d.name == n)
                hv = self._host_value(d, v)
                if hv is None:
                    return None
                p[n] = hv
            for k, v in c.runtime.items():
                if f"runtime.{k}" in self.space.names:
                    p[f"runtime.{k}"] = v
            for k in c.kernels:
                s = self.by_bucket[(k.family, k.shape_bucket or "")]
                p[s.name] = label(k.variant, k.config)
        except (StopIteration, ValueError, KeyError, TypeError):
            return None
        return p if set(p) == set(self.space.names) else None

    def _host_value(self, d: Dim, value: Any) -> Any:
        """A knob value as this dimension's point value (AS_FOUND for the start's own value
        where the domain has no point for it), or None."""
        if d.name in self.as_found and values_equal(value, self.as_found[d.name]):
            return AS_FOUND
        v = self.doms[d.name].to_search(value)
        return None if v is None or v not in d.values else d.values[d.index(v)]

    def kernel_changes(self, c: Candidate) -> dict[str, str]:
        """{slot name: label} for the candidate's shipped-variant kernel choices that change what
        runs at their slot (`Slot.runs`; KeyError for a choice no slot has: the gate catches it
        first). A candidate from outside the space naming the library the incumbent's fallback
        already runs changes nothing: the duplicate gate turns it away."""
        out = {}
        for k in c.kernels:
            s = self.by_bucket[(k.family, k.shape_bucket or "")]
            v, inc = label(k.variant, k.config), self.incumbent.kernels.get(s.name, TORCH)
            if v != inc and s.runs(v) != s.runs(inc):
                out[s.name] = v
        return out

    def slot(self, name: str) -> Slot:
        return next(s for s in self.slots if s.name == name)
