"""Correctness stage: the candidate against the family's float64 reference, on fresh random
inputs every check. Raises `Rejected(stage="correctness", ...)` at the first failure. What each
check draws is `draws`; the random shapes, `random_shapes`."""
from __future__ import annotations

import functools
import math
import random
import time
from typing import Any, Callable, Optional

import torch

from kernelsearch.families.base import Family, dtype_name
from kernelsearch.harness import guard, ranks, sandbox
from kernelsearch.harness.draws import Draws, copy_into, dispatch_runs, fresh_seed, poison_value
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

    def call(self, args, ghost: bool = False, poison: float = float("nan"),
             grad: str = "grad"):
        """One sandboxed call: allocations filled with `poison`, under grad mode `grad`
        (GRAD_MODES: training code, torch.no_grad, torch.inference_mode)."""
        mod = self.ghost if ghost else self.mod
        if self.library:
            _poison_pool(args)
        box = sandbox.Sandbox({mod.__file__}, value=poison)
        with sandbox.Watch({mod.__file__}) as w, sandbox.LaunchCount() as counted:
            with _grad_mode(grad), box:
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
        return out, counted.count

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


def _grad_mode(mode: str):
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference":
        return torch.inference_mode()
    return torch.enable_grad()


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
                  where: str, poison: float = float("nan"), grad: str = "grad"):
    """One sandboxed call judged on everything a single output shows; returns the output. The
    reference runs after the candidate, on its own buffers: an output allocated into memory
    the reference just freed cannot inherit its answer (and allocations are poisoned)."""
    saved = [_snapshot(a) for a in args]
    out, launches = runner.call(args, poison=poison, grad=grad)
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
    ref = family.reference(*args)
    try:
        compare_poisoned(out, ref, dtype, family, where, poison)
    except Rejected as r:
        if r.rule != "tolerance" or math.isnan(poison):
            raise
        # zeros (or a value the kernel also computes) hide what was never written: the same
        # call with NaN poison names it (the rule does not depend on the poison drawn)
        again, _ = runner.call(args, poison=float("nan"), grad=grad)
        left = int((torch.isnan(again) & ~torch.isnan(ref.to(again.device))).sum()) \
            if isinstance(again, torch.Tensor) and again.shape == ref.shape else 0
        if left:
            raise _fail("unwritten", f"{where}: {left} of {again.numel()} output elements "
                        f"are never written (NaN when allocations are NaN-poisoned); "
                        f"{r.detail}") from None
        raise
    return out


def compare_poisoned(out, ref, dtype: str, family: Family, where: str, poison: float) -> None:
    """`compare`, naming out-of-tolerance elements that still hold the large finite poison
    (never written) `unwritten`, as NaN ones are (a zero may be computed: it stays
    `tolerance`, the detail names the poison)."""
    try:
        compare(out, ref, dtype, family, where)
    except Rejected as r:
        if r.rule == "tolerance" and not math.isnan(poison) and poison != 0.0:
            left = int(((out.detach() == poison) & (ref != poison)).sum())
            if left:
                raise _fail("unwritten", f"{where}: {left} of {out.numel()} output elements "
                            f"still hold the poison {poison:g} the harness filled the output "
                            f"with (never written); {r.detail}") from None
        raise


STRESS_CPU_S = 1.0  # interpreter seconds the repeated-call stage may take (a call is ~30 ms)


def stress(runner: Runner, family: Family, dtypes: list[str], device: str, rng: random.Random,
           calls: Optional[int] = None, log: Optional[list] = None,
           fit: Optional[Callable] = None) -> int:
    """The candidate called many times in a row at the cheap shape (made one it takes by
    `fit`: a library kernel's page size, heads, top-k), as a serving loop does
    (thousands on a GPU; as many as STRESS_CPU_S allows on the interpreter), on the same
    tensors, with a dozen calls at random indices (and the first and last) checked on fresh
    values: a kernel that behaves for its first N calls fails `repeated_calls`. Returns the
    count."""
    shape = tuple(family.cheap or family.tiny_shapes[0])
    shape = tuple(fit(shape)) if fit is not None else shape
    dtype = dtypes[0]
    draws = Draws(family, rng)
    dist = "normal"
    args = draws.scalars_into(family.make_inputs(
        shape, dtype, device, torch.Generator().manual_seed(fresh_seed()), dist))
    t0 = time.perf_counter()
    runner.call(args)
    per = max(time.perf_counter() - t0, 1e-6)
    if calls is None:
        calls = rng.randint(2000, 5000)
        if device != "cuda":
            calls = max(12, min(calls, int(STRESS_CPU_S / per)))  # 11 in a row at least
    # the first call is always checked: a later failure then follows calls that were right
    checked = set(rng.sample(range(calls), min(calls, 12))) | {0, calls - 1}
    for i in range(calls):
        poison = poison_value(next(draws.poison), dtype)
        grad = next(draws.grad)
        if i not in checked:
            runner.call(args, poison=poison, grad=grad)
            continue
        seed = fresh_seed()
        fresh = family.make_inputs(shape, dtype, device, torch.Generator().manual_seed(seed),
                                   dist)
        copy_into(args, fresh)
        args = draws.scalars_into(args)
        where = (f"call {i + 2} of {calls + 1} in a row on the same tensors, shape {shape} "
                 f"{dtype} seed {seed} ({_describe(args, family)}, {grad})")
        try:
            _checked_call(runner, family, args, dtype, device, where, poison, grad)
        except Rejected as r:
            # wrong values after calls that were right: the repetition is what shows it (a
            # structural fault, a foreign type or no launch, keeps its own rule; so does a
            # kernel wrong on the first call, which any check would have seen)
            if r.rule not in ("tolerance", "unwritten", "non_finite") or i == 0:
                raise
            raise _fail("repeated_calls", f"({r.rule}) {r.detail}") from None
    if log is not None:
        log.append(f"stress {calls + 1} calls {shape} {dtype}")
    return calls + 1


def check(runner: Runner, family: Family, shapes: list, dtypes: list[str], device: str,
          seeds: int = 2, log: Optional[list] = None, boundary: Optional[list] = None,
          stress_calls: Optional[int] = None, fit: Optional[Callable] = None) -> list[str]:
    """Every check; returns the list of passed checks (raises Rejected on the first failure).
    `boundary` shapes (Family.boundary_shapes) get one call per dtype each, with every check
    a single output allows; `shapes` get `seeds` draws with the repeat, in-place rewrite and
    ghost checks on top. Every check draws its value distribution, scalars (Family.scalars),
    memory layouts (where dispatch takes them), grad mode and poison from cycles (`Draws`);
    the repeated-call stage (`stress`, stress_calls=0: none) runs at a random point."""
    log = log if log is not None else []
    rng = random.Random(fresh_seed())
    draws = Draws(family, rng)
    ghost_done = False
    plan = [(tuple(s), d) for s in shapes for d in dtypes for _ in range(seeds)]
    stress_at = rng.randint(0, len(plan)) if stress_calls != 0 else -1
    for k in range(len(plan) + 1):
        if k == stress_at:
            stress(runner, family, dtypes, device, rng, stress_calls, log, fit=fit)
        if k == len(plan):
            break
        shape, dtype = plan[k]
        seed = fresh_seed()
        dist = next(draws.dist)
        poison_kind, grad = next(draws.poison), next(draws.grad)
        poison = poison_value(poison_kind, dtype)
        gen = torch.Generator().manual_seed(seed)
        # the last check's tensors go before this one's are drawn: at a 128 x 163,840 MLA point
        # the two caches at once are what does not fit beside another job
        args = out = out2 = out3 = fresh = gout = None
        args = draws.batch_order(draws.scalars_into(
            family.make_inputs(shape, dtype, device, gen, dist)))
        args, kinds = draws.views_of(args)
        where = (f"shape {shape} {dtype} {dist} seed {seed} ({_describe(args, family)}"
                 f"{', ' + ' '.join(kinds) if kinds else ''}, {grad}, poison {poison_kind})")
        out = _checked_call(runner, family, args, dtype, device, where, poison, grad)
        out2, _ = runner.call(args, poison=poison, grad=grad)
        if not bit_equal(out, out2):
            raise _fail("nondeterministic", f"{where}: a second run on the same inputs "
                        "was not bit-identical")
        # same buffers, new values: a result cached on data_ptr shows up here
        gen2 = torch.Generator().manual_seed(seed ^ 0x5EED)
        fresh = family.make_inputs(shape, dtype, device, gen2, dist)
        copy_into(args, fresh)
        out3, _ = runner.call(args, poison=poison, grad=grad)
        compare_poisoned(out3, family.reference(*args), dtype, family,
                         where + " (inputs rewritten in place)", poison)
        if not ghost_done and not runner.library:
            gout, _ = runner.call(args, ghost=True)
            if isinstance(gout, torch.Tensor) and bit_equal(gout, out3):
                raise _fail("ghost_unchanged", f"{where}: with every kernel body "
                            "replaced by a no-op the output did not change")
            ghost_done = True
        log.append(f"{shape} {dtype} {dist}")
    args = out = out2 = out3 = fresh = gout = None  # freed before ranks.after's probe draws
    for shape, rank in ranks.after(family, shapes, boundary):  # then every other input rank
        for dtype in dtypes:
            seed = fresh_seed()
            dist = next(draws.edge_dist)
            poison_kind, grad = next(draws.poison), next(draws.grad)
            args = out = out2 = out3 = fresh = gout = None  # the previous check's tensors
            args, what = ranks.inputs(family, draws, shape, dtype, device, seed, dist, rank,
                                      dispatch_runs)
            where = (f"{what} {tuple(shape)} {dtype} {dist} seed {seed} "
                     f"({_describe(args, family)}, {grad}, poison {poison_kind})")
            _checked_call(runner, family, args, dtype, device, where,
                          poison_value(poison_kind, dtype), grad)
        log.append(f"boundary {tuple(shape)}" if rank is None else f"rank {rank} {tuple(shape)}")
    return log


def _describe(args: tuple, family: Family) -> str:
    """The scalar arguments of a check, for its verdict detail."""
    parts = [f"arg{i}={args[i]:.4g}" for i in family.scalars if i < len(args)]
    return ", ".join(parts) if parts else "no scalars"


def sandbox_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bit_equal(a, b)
