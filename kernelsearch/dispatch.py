"""Runtime dispatch for model code:

    from kernelsearch import dispatch
    dispatch.install(table)                 # DispatchTable, its dict form, a path; None clears
    y = dispatch.call("rmsnorm", x, weight, eps)   # or dispatch.rmsnorm(x, weight, eps)

A call whose (family, dtype, shape) falls inside a validated range of the installed table runs
that kernel; anything else (no table, another shape, a CPU tensor, an odd layout) runs the plain
torch op. Tables are measured on each family's input layout (matmul: b = W.t(), as F.linear),
so a call with another layout (a row-major [K, N] b) runs torch too: a kernel judged and timed on
one layout can be several times slower on another. Lookups are cached per argument dtypes,
shapes, strides and devices, so the steady-state cost is one dict lookup.

An entry whose variant is `src:<sha256>` names a kernel source in a `kernelsearch.store`
(`install(table, store=DIR)`, default `store.default_root()`); nothing else is ever loaded. At
install each such source is read from the store and re-hashed, re-guarded, and re-judged for
correctness (in a child process, at the entries' range ends, midpoints and a random point of
every octave inside: `judge(ranges=...)`) when this GPU, driver or triton version is not one it
was judged on. A source that fails any of these is refused: its entries
run torch, `refused()` says why and the reason is logged. Installed kernels stay verified:
the kernel canary (`kernelsearch.canary`) replays a sample of real calls against the family's
reference and removes an entry that computes wrong (`incidents()`)."""
from __future__ import annotations

import functools
import importlib
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

from kernelsearch.table import DispatchTable, source_digest

log = logging.getLogger("kernelsearch.dispatch")

_table: Optional[DispatchTable] = None
_cache: dict[tuple, Optional[Callable]] = {}
_stats: dict[str, int] = {"kernel": 0, "fallback": 0}
_calls: dict[str, int] = {}  # family -> calls through `call` (kernel or fallback)
_sources: dict[str, Callable] = {}  # sha256 -> the stored source's forward (installed table's)
_refused: dict[str, str] = {}  # sha256 -> why its entries run torch
_loaded: dict[tuple, Callable] = {}  # (store root, sha256) -> forward: loaded once per process
_store_root: Optional[Path] = None  # where the installed table's sources came from
_incidents: list[dict] = []  # what the kernel canary caught in this process
_canary: Any = None  # kernelsearch.canary.Canary, made at the first install of a table
_canary_state: dict[tuple, list] = {}  # entry -> the canary's [calls, last replay]


def install(table: Union[None, DispatchTable, dict, str, Path],
            store: Union[None, str, Path] = None) -> Optional[DispatchTable]:
    """Install a dispatch table (None clears it). Returns the installed table. `store`: the
    kernel source store `src:` entries are loaded from (default `store.default_root()`)."""
    global _table, _store_root, _canary
    from kernelsearch.canary import Canary

    canary = Canary.from_env()  # a bad setting is refused before the table changes
    if table is None:
        _table = None
    elif isinstance(table, DispatchTable):
        _table = table
    elif isinstance(table, dict):
        _table = DispatchTable.from_dict(table.get("kernels", table) if "entries" not in table
                                         else table)
    else:
        _table = DispatchTable.load(table)
    _cache.clear()
    _sources.clear()
    _refused.clear()
    _canary = canary if canary.enabled else None  # off: not even the per-call count
    _canary_state.clear()
    _store_root = None
    if _table is not None and _table.sources():
        _load_sources(_table, store)
    return _table


def refused() -> dict[str, str]:
    """Stored sources the installed table names that run torch instead, and why."""
    return dict(_refused)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _uses(table: DispatchTable, sha: str, config: Optional[dict] = None) -> list:
    """The entries naming stored source `sha` (with `config`, when one is given)."""
    return [e for e in table.entries if source_digest(e.variant) == sha
            and (config is None or json_key(e.config) == json_key(config))]


def _rejudge_ranges(table: DispatchTable, sha: str,
                    config: Optional[dict] = None) -> list[dict]:
    """The table ranges the source serves, as the judge's `ranges` (each checked at its ends,
    its midpoint and a random point of every octave inside: a kernel right at the ends of
    8-65,536 rows and wrong at 5,001-8,000 is refused)."""
    out: list[dict] = []
    for e in _uses(table, sha, config):
        r = {"match": dict(e.match), "ranges": {k: list(v) for k, v in e.ranges.items()}}
        if r not in out:
            out.append(r)
    return out


def _rejudge_shapes(table: DispatchTable, sha: str,
                    config: Optional[dict] = None) -> list[tuple]:
    """Correctness at the ends of every range the source is used on (its largest point too)."""
    from kernelsearch.families import get

    out: list[tuple] = []
    for e in _uses(table, sha, config):
        fam = get(e.family)
        for end in (0, 1):
            d = {k: r[end] for k, r in e.ranges.items()}
            d.update(e.match)
            if all(k in d for k in fam.shape_dims):
                s = tuple(d[k] for k in fam.shape_dims)
                if s not in out:
                    out.append(s)
    return out


def _load_sources(table: DispatchTable, store_dir: Union[None, str, Path]) -> None:
    from kernelsearch import store as st

    global _store_root
    store = st.SourceStore(store_dir if store_dir is not None else st.default_root())
    _store_root = store.root
    for sha in table.sources():
        key = (str(store.root), sha)
        try:
            _sources[sha] = _loaded[key] if key in _loaded else _load_one(table, store, sha)
            _loaded[key] = _sources[sha]
        except Exception as e:  # noqa: BLE001 - any failure: torch runs, and we say why
            _refused[sha] = f"{type(e).__name__}: {e}" if not isinstance(e, st.StoreError) else str(e)
            log.warning("kernel source src:%s refused, its entries run torch: %s", sha[:12],
                        _refused[sha])


def _load_one(table: DispatchTable, store: Any, sha: str) -> Callable:
    from kernelsearch import store as st
    from kernelsearch.harness import guard, sandbox

    source = store.source(sha)  # re-hashed: a changed file raises StoreError
    rec = store.record(sha)
    if rec.quarantined:
        raise st.StoreError(f"quarantined {rec.quarantined.get('at', '')} (it computed wrong in "
                            f"use: {str(rec.quarantined.get('why', ''))[:200]})")
    fams = {e.family for e in table.entries if source_digest(e.variant) == sha}
    if fams != {rec.family}:
        raise st.StoreError(f"table uses it for {sorted(fams)}; it was judged for {rec.family}")
    bad = guard.check_source(source)
    if bad:
        raise st.StoreError(f"static guard: {bad[0]}")
    dev = _device()
    env = st.environment(dev)
    if not rec.judged_on(env):
        why = ", ".join(f"{k} {rec.env.get(k)!r} -> {env.get(k)!r}"
                        for k in st.env_differs(rec.env, env)) or "its record is another host's"
        log.warning("kernel source src:%s was not judged here (%s): re-judging", sha[:12], why)
        v = judge_here(table, sha, rec.family, source, dev)
        if not v.accepted:
            raise st.StoreError(f"re-judged on {env['gpu']}: {v.code}/{v.rule}: "
                                f"{v.detail[:300]}")
        try:
            store.add_judgement(sha, v.to_dict(), env)
        except (OSError, st.StoreError) as e:  # a read-only store: judged again next time
            log.info("kernel source src:%s: re-judgement not recorded: %s", sha[:12], e)
    return sandbox.load(source, "src").forward


def judge_here(table: DispatchTable, sha: str, family: str, source: str, device: str) -> Any:
    """This host's judgement of a stored source for the entries of `table` that name it: the
    judge (guard, then correctness in a sandboxed child at the ends, midpoints and interior
    points of every range it is used on with that config) for each config it runs with. The
    first rejection, or the last verdict."""
    from kernelsearch.harness import check

    configs = {json_key(e.config): e.config for e in _uses(table, sha)}
    v = None
    for cfg in configs.values() or [{}]:
        v = check(family, source, cfg, device=device, timing=False,
                  shapes=_rejudge_shapes(table, sha, cfg) or None,
                  ranges=_rejudge_ranges(table, sha, cfg) or None)
        if not v.accepted:
            return v
    return v


def json_key(d: dict) -> str:
    import json

    return json.dumps(d, sort_keys=True)


def installed() -> Optional[DispatchTable]:
    return _table


def stats() -> dict[str, int]:
    """How many calls ran a table kernel and how many fell back to torch, since the process
    started (callers take differences)."""
    return dict(_stats)


def calls() -> dict[str, int]:
    """Calls through `call` per family since the process started, kernel and fallback alike
    (what an engine integration reports to show its ops are on the model's path)."""
    return dict(_calls)


def _usable(family: str, args) -> bool:
    """Kernels run on CUDA tensors (or anywhere under the Triton interpreter), all on one device;
    decode attention also needs unit stride along the head dim (the others handle any layout)."""
    import torch

    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if not ts:
        return False
    dev = ts[0].device
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if any(t.device != dev for t in ts):
        return False
    return family != "decode_attention" or all(t.stride(-1) == 1 for t in ts)


@functools.lru_cache(maxsize=None)
def _forward(family: str, variant: str) -> Callable:
    """The variant's module, imported by the name its file has under kernelsearch/families (a
    variant may share another family's file: mla_decode_mtp's `fitted` is mla_decode's)."""
    from kernelsearch.families import get

    var = get(family).variants.get(variant)
    name = f"kernelsearch.families.{family}.{variant}"
    if var is not None:
        rel = Path(var.file).resolve().relative_to(Path(__file__).resolve().parent / "families")
        name = "kernelsearch.families." + ".".join(rel.with_suffix("").parts)
    return importlib.import_module(name).forward


def _key(family: str, args) -> tuple:
    """What a lookup depends on: each tensor argument's dtype, shape, strides and device (the
    table, the layout and _usable are functions of these). Cheaper than working out the
    family's shape and layout, which only a cache miss does."""
    import torch

    return (family,) + tuple((a.dtype, a.shape, a.stride(), a.get_device())
                             if isinstance(a, torch.Tensor) else None for a in args)


def _resolve(family: str, args) -> Optional[tuple[Callable, Any, Optional[list]]]:
    """(the kernel with its config bound, its table entry, its canary state), or None: torch."""
    key = _key(family, args)
    try:
        return _cache[key]
    except KeyError:
        pass
    hit = _lookup(family, args)
    _cache[key] = hit
    return hit


def _lookup(family: str, args) -> Optional[tuple[Callable, Any, Optional[list]]]:
    from kernelsearch.families import get
    from kernelsearch.families.base import dtype_name

    fam = get(family)
    try:
        shape = tuple(int(v) for v in fam.shape_of(*args))
        dtype = dtype_name(args[0].dtype)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None  # not a shape this family's kernels take: torch handles it
    if family == "matmul" and (args[0].dim() != 2 or args[1].dim() != 2):
        return None
    layout = fam.layout_of(*args) if fam.layout_of is not None else ""
    if _table is None or layout != fam.layout or not _usable(family, args):
        return None
    # FALLBACK order (kernelsearch.table): the entry covering the call, the best installed
    # library kernel offered at its shape (on CUDA tensors), then torch (None)
    how, e, variant = _table.choose(family, dtype, fam.dims_dict(shape))
    if how == "library" and not args[0].is_cuda:
        return None
    if e is None:  # the library fallback: no entry, so nothing for the canary to remove
        return None if variant is None else (_forward(family, variant), None, None)
    sha = source_digest(e.variant)
    if sha is not None:  # a stored source: only if install loaded and verified it
        fwd = _sources.get(sha)
        return None if fwd is None else (functools.partial(fwd, **e.config), e,
                                         _ckey(e, shape))
    return functools.partial(_forward(family, e.variant), **e.config), e, _ckey(e, shape)


def bucket(shape: tuple) -> tuple:
    """A shape's bucket: the octave of every dim (its bit length)."""
    return tuple(int(v).bit_length() for v in shape)


def _ckey(e: Any, shape: tuple) -> list:
    """The canary's state of an entry in a shape bucket (one per entry and `bucket`, shared by
    the shapes in it; found once per cached lookup, not per call): the first call in every
    bucket an entry serves is replayed, so a kernel wrong only for a band of sizes no judge's
    draw met is caught at its first call there (issue 42, item 3)."""
    k = (e.family, e.variant, json_key(e.config), e.dtype, bucket(shape))
    if k not in _canary_state:
        _canary_state[k] = _canary.state() if _canary is not None else [0, 0.0]
    return _canary_state[k]


def call(family: str, *args: Any) -> Any:
    _calls[family] = _calls.get(family, 0) + 1
    hit = _resolve(family, args) if _table is not None else None
    if hit is None:
        _stats["fallback"] += 1
        from kernelsearch.families import get

        return get(family).torch_default(*args)
    fn, entry, key = hit
    _stats["kernel"] += 1
    from kernelsearch.runtime import ensure_scratch_allocator

    ensure_scratch_allocator()  # device-built TMA descriptors need triton scratch memory
    out = fn(*args)
    if _canary is not None and key is not None and _canary.due(key):
        from kernelsearch.families import get

        fam = get(family)
        why = _canary.check(key, fam, args, out)
        if why is not None:
            _caught(fam, entry, args, why)
            _stats["fallback"] += 1
            return fam.torch_default(*args)
    return out


def _caught(fam: Any, entry: Any, args: tuple, why: str) -> None:
    """The canary saw `entry` compute wrong: remove it (a stored source: every entry of it, as
    the source is quarantined; a shipped variant: that entry only, its dtype and shape bucket:
    the variant's other dtypes and buckets were judged on their own), record the incident,
    quarantine the source, tell the listeners."""
    global _table
    import time

    from kernelsearch import canary

    sha = source_digest(entry.variant)
    gone = (lambda e: source_digest(e.variant) == sha) if sha else (lambda e: e == entry)
    assert _table is not None
    removed = [e for e in _table.entries if gone(e)]
    _table = DispatchTable([e for e in _table.entries if not gone(e)], device=_table.device,
                           meta=dict(_table.meta))
    _cache.clear()
    shape = [int(v) for v in fam.shape_of(*args)]
    incident = {"kind": "canary_failure", "family": fam.name, "variant": entry.variant,
                "source_sha256": sha, "config": dict(entry.config), "shape": shape,
                "dtype": str(args[0].dtype).replace("torch.", ""), "detail": why[:1000],
                "removed_entries": len(removed),
                "removed": [{"dtype": e.dtype, "match": dict(e.match),
                             "ranges": {k: list(v) for k, v in e.ranges.items()}}
                            for e in removed[:16]],
                "store": str(_store_root) if _store_root is not None else None,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if sha:
        _sources.pop(sha, None)
        for k in [k for k in _loaded if k[1] == sha]:
            del _loaded[k]
        _refused[sha] = f"kernel canary: computed wrong in use at {shape}: {why[:300]}"
        incident["quarantined"] = _quarantine(sha, why, incident)
    _incidents.append(incident)
    log.error("kernel canary: %s %s%s computed wrong at %s (%s); %d table entries removed, "
              "the calls run the fallback", fam.name, entry.variant,
              f" (src:{sha[:12]})" if sha else "", shape, why[:300], len(removed))
    canary.notify(incident)


def _quarantine(sha: str, why: str, incident: dict) -> str:
    from kernelsearch import store as st

    if _store_root is None:
        return "no store"
    try:
        st.SourceStore(_store_root).quarantine(sha, f"kernel canary: {why}", incident)
        return str(_store_root)
    except (OSError, st.StoreError) as e:  # a read-only store (the model runs unprivileged)
        log.error("kernel canary: src:%s not quarantined in %s: %s", sha[:12], _store_root, e)
        return f"not recorded: {e}"


def incidents() -> list[dict]:
    """What the kernel canary caught in this process (each also logged and sent to
    `canary.listeners`)."""
    return list(_incidents)


def canary_stats() -> dict[str, Any]:
    c = _canary
    return {} if c is None else {"enabled": c.enabled, "rate": c.rate,
                                 "interval_s": c.interval_s, "replays": c.replays}


def softmax(x):
    return call("softmax", x)


def rmsnorm(x, weight, eps: float = 1e-6):
    return call("rmsnorm", x, weight, eps)


def swiglu(gate, up):
    return call("swiglu", gate, up)


def matmul(a, b):
    return call("matmul", a, b)


def decode_attention(q, k, v):
    return call("decode_attention", q, k, v)


def rope(x, cos, sin):
    return call("rope", x, cos, sin)


def mla_decode(q, kv_cache, block_table, seq_lens, scale: float):
    """Absorbed MLA decode over a paged latent cache (kernelsearch.families.mla_decode)."""
    return call("mla_decode", q, kv_cache, block_table, seq_lens, scale)


def mla_sparse_decode(q, kv_cache, block_table, seq_lens, indices, scale: float):
    """Sparse MLA decode over the top-k `indices` (kernelsearch.families.mla_sparse_decode)."""
    return call("mla_sparse_decode", q, kv_cache, block_table, seq_lens, indices, scale)


def resolve(family: str, *args: Any) -> Optional[Callable]:
    """The kernel `call` would run for these arguments (the variant's forward with its config
    bound, a functools.partial), or None where it would run torch; runs nothing and counts
    nothing. For callers that hand a kernel more than the family signature (the static-cache
    attention op passes filled lengths): they `count` what they ran."""
    hit = _resolve(family, args) if _table is not None else None
    return None if hit is None else hit[0]


def count(kind: str) -> None:
    """Record one call that a `resolve` caller ran ("kernel") or handed to torch ("fallback")."""
    _stats[kind] += 1
