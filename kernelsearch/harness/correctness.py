"""Correctness stage: the candidate against the family's float64 reference, on fresh random
inputs every check. Raises `Rejected(stage="correctness", ...)` at the first failure."""
from __future__ import annotations

import functools
import os
import random
from typing import Any, Optional

import torch

from kernelsearch.families.base import DISTRIBUTIONS, Family, dtype_name
from kernelsearch.harness import guard, sandbox
from kernelsearch.harness.verdict import Rejected


def _fail(rule: str, detail: str, code: str = "incorrect") -> Rejected:
    return Rejected("correctness", code, rule, detail)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(
        {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _overlaps(out: torch.Tensor, args) -> bool:
    if out.numel() == 0:
        return False
    lo = out.data_ptr()
    hi = lo + out.untyped_storage().nbytes()
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel():
            alo = a.untyped_storage().data_ptr()
            ahi = alo + a.untyped_storage().nbytes()
            if lo < ahi and alo < hi:
                return True
    return False


CHUNK = 1 << 24  # elements compared at a time: a 32768x18992 output stays a few float64 GB


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: str, family: Family, where: str) -> None:
    """out against the float64 reference: elementwise atol*rms(ref) + rtol*|ref| and a bound on
    the relative norm error; in chunks, so the largest timed shapes fit the device."""
    atol, rtol, nrm = family.tolerance(dtype)
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    n = r_all.numel()
    parts = [(i, min(n, i + CHUNK)) for i in range(0, n, CHUNK)]
    ref_sq, ref_nan, nan, inf = 0.0, False, 0, False
    for a, b in parts:
        o, r = o_all[a:b].double(), r_all[a:b]
        ref_sq += float(r.pow(2).sum())
        ref_nan = ref_nan or bool(torch.isnan(r).any())
        nan += int(torch.isnan(o).sum())
        inf = inf or bool(torch.isinf(o).any())
    if nan and not ref_nan:
        raise _fail("unwritten", f"{where}: {nan} of {n} output elements are NaN "
                    "(poisoned and never written, or NaN computed)")
    if inf or (nan and ref_nan):
        raise _fail("non_finite", f"{where}: output has inf or NaN where the reference is finite")
    # one scale for the whole output, or each element's own (Family.scale_of: ragged attention)
    scale: Any = max((ref_sq / max(n, 1)) ** 0.5, 1e-30)
    if family.scale_of is not None:
        scale = family.scale_of(ref).clamp_min(1e-30).expand_as(ref).reshape(-1)
    err_sq, nbad, first, worst, worst_i = 0.0, 0, None, -1.0, 0
    for a, b in parts:
        o, r = o_all[a:b].double(), r_all[a:b]
        err = (o - r).abs()
        err_sq += float(err.pow(2).sum())
        sc = scale[a:b] if isinstance(scale, torch.Tensor) else scale
        bad = err > atol * sc + rtol * r.abs()
        k = int(bad.sum())
        if k and first is None:
            first = a + int(bad.nonzero()[0])
        nbad += k
        m = float(err.max()) if err.numel() else 0.0
        if m > worst:
            worst, worst_i = m, a + int(err.argmax())
    rel = err_sq ** 0.5 / max(ref_sq ** 0.5, 1e-30)
    if nbad or rel > nrm:
        i = first if first is not None else worst_i
        raise _fail("tolerance", f"{where}: rel-norm error {rel:.3g} (bound {nrm:g}); "
                    f"{nbad} elements out of tolerance, e.g. flat index {i}: "
                    f"got {float(o_all[i]):.6g}, want {float(r_all[i]):.6g}")


class Runner:
    """Runs one candidate module (and its ghost) under the sandbox."""

    def __init__(self, source: str, config: Optional[dict] = None, library: bool = False):
        from kernelsearch.runtime import ensure_scratch_allocator

        ensure_scratch_allocator()  # device-built TMA descriptors need triton scratch memory
        self.source = source
        self.kernels = guard.launched_kernels(source)
        self.mod = sandbox.load(source, "cand")
        self.files = {self.mod.__file__}
        self.counters = sandbox.instrument(self.mod, self.kernels)
        self.config = dict(config or {})
        self._ghost = None
        # a library variant (kernelsearch.families.library): its kernels are compiled code, so
        # launches are not counted, there is no ghost, and its layout conversions may use torch
        self.library = library

    @property
    def ghost(self):
        if self._ghost is None:
            self._ghost = sandbox.load(guard.ghost_source(self.source), "ghost")
        return self._ghost

    def call(self, args, ghost: bool = False):
        mod = self.ghost if ghost else self.mod
        if self.library:
            _poison_pool(args)
        box = sandbox.Sandbox({mod.__file__})
        before = sum(c.count for c in self.counters)
        with sandbox.Watch({mod.__file__}) as w:
            with box:
                out = mod.forward(*args, **self.config)
        if w.new_threads:
            raise Rejected("correctness", "guard_failed", "thread",
                           f"forward started threads: {w.new_threads}")
        if w.patched:
            sandbox.restore()
            raise Rejected("correctness", "guard_failed", "timer",
                           f"forward replaced harness timers: {w.patched}")
        if box.violations and not self.library:
            raise Rejected("correctness", "guard_failed", "torch_compute",
                           "forward called torch ops beyond allocation and views: "
                           + ", ".join(sorted(set(box.violations))[:8]))
        launches = sum(c.count for c in self.counters) - before
        return out, launches

    def fast_forward(self):
        """The candidate as plain callable (timing): no sandbox, config bound."""
        return functools.partial(self.mod.forward, **self.config)


def _poison_pool(args) -> None:
    """A library allocates its output in its own compiled code, where the sandbox's poisoning of
    allocations cannot reach: hand the CUDA caching allocator a block of 0xFF bytes (NaN in every
    float dtype) to reuse first, so an output element the library leaves unwritten shows as NaN,
    as a candidate's poisoned allocation would."""
    ts = [a for a in args if isinstance(a, torch.Tensor) and a.is_cuda]
    if not ts:
        return
    n = ts[0].numel() * ts[0].element_size()  # the query: about the output's size
    blk = torch.empty(max(4 * n, 1 << 22), dtype=torch.uint8, device=ts[0].device)
    blk.fill_(0xFF)
    del blk


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


SNAPSHOT_BYTES = 256 * 2 ** 20  # inputs above this are fingerprinted, not copied


def fingerprint(t):
    """Identity of a tensor's bits without a copy: the sum and a position-weighted sum of its
    bits as integers, in chunks (a 1 G-element KV cache stays cheap). Non-tensors as they are."""
    if not isinstance(t, torch.Tensor):
        return t
    b = _bits(t).reshape(-1)
    s1 = s2 = 0
    for a in range(0, b.numel(), CHUNK):
        c = b[a:a + CHUNK].to(torch.int64)
        w = torch.arange(a + 1, a + 1 + c.numel(), device=c.device, dtype=torch.int64)
        s1 += int(c.sum())
        s2 += int((c * w).sum())
    return (tuple(t.shape), t.dtype, s1, s2)


def _snapshot(a):
    if isinstance(a, torch.Tensor):
        return a.clone() if a.numel() * a.element_size() <= SNAPSHOT_BYTES else fingerprint(a)
    return a


def _unchanged(a, snap) -> bool:
    if not isinstance(a, torch.Tensor):
        return True
    return sandbox_equal(a, snap) if isinstance(snap, torch.Tensor) else fingerprint(a) == snap


def _checked_call(runner: Runner, family: Family, args: tuple, dtype: str, device: str,
                  where: str):
    """One sandboxed call judged on everything a single output shows; returns the output. The
    reference runs after the candidate, on its own buffers: an output allocated into memory
    the reference just freed cannot inherit its answer (and allocations are NaN-poisoned)."""
    saved = [_snapshot(a) for a in args]
    out, launches = runner.call(args)
    if launches == 0 and not runner.library:
        raise _fail("no_launch", f"{where}: forward returned without launching any kernel")
    if type(out) is not torch.Tensor:
        raise _fail("not_plain_tensor", f"{where}: forward returned "
                    f"{type(out).__name__}, expected a plain torch.Tensor")
    want_shape, want_dtype = family.out_spec(*args)
    if tuple(out.shape) != tuple(want_shape) or out.dtype != want_dtype:
        raise _fail("wrong_shape_or_dtype", f"{where}: got {tuple(out.shape)} "
                    f"{dtype_name(out.dtype)}, want {tuple(want_shape)} {dtype_name(want_dtype)}")
    if out.device.type != torch.device(device).type:
        raise _fail("wrong_device", f"{where}: output on {out.device}")
    for a, s in zip(args, saved):
        if not _unchanged(a, s):
            raise _fail("input_mutated", f"{where}: forward changed an input")
    del saved
    if _overlaps(out, args):
        raise _fail("aliases_input", f"{where}: output shares memory with an input")
    compare(out, family.reference(*args), dtype, family, where)
    return out


def check(runner: Runner, family: Family, shapes: list, dtypes: list[str], device: str,
          seeds: int = 2, log: Optional[list] = None, boundary: Optional[list] = None) -> list[str]:
    """Every check; returns the list of passed checks (raises Rejected on the first failure).
    `boundary` shapes (Family.boundary_shapes) get one call per dtype each, with every check
    a single output allows; `shapes` get `seeds` draws with the repeat, in-place rewrite and
    ghost checks on top."""
    log = log if log is not None else []
    rng = random.Random(_fresh_seed())
    ghost_done = False
    for shape in shapes:
        for dtype in dtypes:
            for _ in range(seeds):
                seed = _fresh_seed()
                dist = rng.choice(DISTRIBUTIONS)
                where = f"shape {tuple(shape)} {dtype} {dist} seed {seed}"
                gen = torch.Generator().manual_seed(seed)
                args = family.make_inputs(tuple(shape), dtype, device, gen, dist)
                out = _checked_call(runner, family, args, dtype, device, where)
                out2, _ = runner.call(args)
                if not bit_equal(out, out2):
                    raise _fail("nondeterministic", f"{where}: a second run on the same inputs "
                                "was not bit-identical")
                # same buffers, new values: a result cached on data_ptr shows up here
                gen2 = torch.Generator().manual_seed(seed ^ 0x5EED)
                fresh = family.make_inputs(tuple(shape), dtype, device, gen2, dist)
                for a, f in zip(args, fresh):
                    if isinstance(a, torch.Tensor):
                        a.copy_(f)
                out3, _ = runner.call(args)
                compare(out3, family.reference(*args), dtype, family,
                        where + " (inputs rewritten in place)")
                if not ghost_done and not runner.library:
                    gout, _ = runner.call(args, ghost=True)
                    if isinstance(gout, torch.Tensor) and bit_equal(gout, out3):
                        raise _fail("ghost_unchanged", f"{where}: with every kernel body "
                                    "replaced by a no-op the output did not change")
                    ghost_done = True
                log.append(f"{tuple(shape)} {dtype} {dist}")
    for shape in boundary or []:
        for dtype in dtypes:
            seed = _fresh_seed()
            dist = rng.choice(DISTRIBUTIONS)
            where = f"boundary shape {tuple(shape)} {dtype} {dist} seed {seed}"
            args = family.make_inputs(tuple(shape), dtype, device,
                                      torch.Generator().manual_seed(seed), dist)
            _checked_call(runner, family, args, dtype, device, where)
        log.append(f"boundary {tuple(shape)}")
    return log


def sandbox_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bit_equal(a, b)


def random_shapes(family: Family, n: int, big: bool = False) -> list:
    """Shapes nobody chose: odd sizes drawn fresh for every check (tiny ones for the CPU)."""
    r = random.Random(_fresh_seed())
    out = []
    for _ in range(n):
        if family.name in ("softmax", "rmsnorm", "swiglu"):
            out.append((r.randint(1, 64 if big else 6), r.randint(1, 20000 if big else 2500)))
        elif family.name == "matmul":
            m = r.choice([r.randint(1, 16), r.randint(17, 700 if big else 40)])
            out.append((m, r.randint(1, 3000 if big else 70), r.randint(1, 3000 if big else 90)))
        elif family.name == "decode_attention":
            hkv = r.randint(1, 8 if big else 2)
            g = r.choice([1, 2, 4, 8])
            out.append((r.randint(1, 4 if big else 2), hkv * g, hkv,
                        r.randint(1, 20000 if big else 150), r.choice([64, 128] if big else [16, 32])))
        elif family.name in ("mla_decode", "mla_sparse_decode"):
            page = r.choice([1, 16, 64])
            L = r.randint(1, 20000 if big else 150)
            shape = (r.randint(1, 8 if big else 3), r.choice([16, 128] if big else [4, 16]), L,
                     page, 1)
            out.append(shape if family.name == "mla_decode"
                       else shape[:4] + (r.choice([64, 2048] if big else [16, 48]), 1))
        elif family.name == "rope":
            out.append((r.randint(1, 300 if big else 4), r.randint(1, 140 if big else 8),
                        2 * r.randint(1, 128 if big else 20)))
        else:  # a family named nowhere above: from what it declares, so none goes unchecked
            out.append(declared_random_shape(family, r, big))
    return out


def declared_random_shape(family: Family, r: random.Random, big: bool) -> tuple:
    """A shape drawn from the family's own declarations: every range dim anywhere from 1 to
    the largest it searches (the tiny shapes on the CPU), the exact (model) dims as one of its
    shapes has them, made valid by its `fit`."""
    shapes = list(family.search_shapes if big else family.tiny_shapes) or list(family.tiny_shapes)
    base = r.choice(shapes)
    top = {d: max(int(s[i]) for s in shapes) for i, d in enumerate(family.shape_dims)}
    shape = tuple(r.randint(1, max(1, top[d])) if d in family.range_dims else int(base[i])
                  for i, d in enumerate(family.shape_dims))
    return tuple(family.fit(shape)) if family.fit is not None else shape
