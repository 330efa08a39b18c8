"""Experiments behind softmax/split at 32768x18992 bf16 on the H200 (events, L2 flushed, two
input sets rotated): how the row is held (two or three power-of-two pieces, bf16 registers, a
persistent grid prefetching the next row) and, on the two-piece kernel, store hints, ftz
exponentials, 32-bit offsets and a no-exponential diagnostic (the structure's own ceiling).
Prints us, % of a copy of the same bytes, registers per thread and the max error.

    python3 benchmarks/experiments/softmax_18992.py --set pieces OUT_DIR
    python3 benchmarks/experiments/softmax_18992.py --set hints OUT_DIR

Results of 2026-11-30: benchmarks/results/softmax-18992-{pieces,hints}-h200-2026-11-30.log and
benchmarks/results/kernels-h200-2026-11-30.md (section 4)."""
import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _split3(X, Y, n_cols, sx, sy, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr,
            NATIVE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    L: tl.constexpr = 1.4426950408889634
    ca = tl.arange(0, A)
    cb = A + tl.arange(0, B)
    ma = ca < n_cols
    mb = cb < n_cols
    xa = tl.load(X + row * sx + ca, mask=ma, other=-float("inf"), eviction_policy="evict_first")
    xb = tl.load(X + row * sx + cb, mask=mb, other=-float("inf"), eviction_policy="evict_first")
    if not NATIVE:
        xa = xa.to(tl.float32)
        xb = xb.to(tl.float32)
    m = tl.maximum(tl.max(xa.to(tl.float32), axis=0), tl.max(xb.to(tl.float32), axis=0))
    if C > 0:
        cc = A + B + tl.arange(0, C)
        mc = cc < n_cols
        xc = tl.load(X + row * sx + cc, mask=mc, other=-float("inf"), eviction_policy="evict_first")
        if not NATIVE:
            xc = xc.to(tl.float32)
        m = tl.maximum(m, tl.max(xc.to(tl.float32), axis=0))
    ml = m * L
    if NATIVE:
        s = tl.sum(tl.exp2(xa.to(tl.float32) * L - ml), axis=0) + tl.sum(tl.exp2(xb.to(tl.float32) * L - ml), axis=0)
        if C > 0:
            s += tl.sum(tl.exp2(xc.to(tl.float32) * L - ml), axis=0)
        inv = 1.0 / s
        tl.store(Y + row * sy + ca, (tl.exp2((xa.to(tl.float32) - m) * L) * inv).to(Y.dtype.element_ty), mask=ma)
        tl.store(Y + row * sy + cb, (tl.exp2((xb.to(tl.float32) - m) * L) * inv).to(Y.dtype.element_ty), mask=mb)
        if C > 0:
            tl.store(Y + row * sy + cc, (tl.exp2((xc.to(tl.float32) - m) * L) * inv).to(Y.dtype.element_ty), mask=mc)
    else:
        ea = tl.exp2(xa * L - ml)
        eb = tl.exp2(xb * L - ml)
        s = tl.sum(ea, axis=0) + tl.sum(eb, axis=0)
        if C > 0:
            ec = tl.exp2(xc * L - ml)
            s += tl.sum(ec, axis=0)
        inv = 1.0 / s
        tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma)
        tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb)
        if C > 0:
            tl.store(Y + row * sy + cc, (ec * inv).to(Y.dtype.element_ty), mask=mc)


@triton.jit
def _persist(X, Y, n_rows, n_cols, sx, sy, A: tl.constexpr, B: tl.constexpr):
    pid = tl.program_id(0)
    npr = tl.num_programs(0)
    L: tl.constexpr = 1.4426950408889634
    ca = tl.arange(0, A)
    cb = A + tl.arange(0, B)
    ma = ca < n_cols
    mb = cb < n_cols
    r0 = pid.to(tl.int64)
    lim = tl.where(r0 < n_rows, n_cols, 0)
    xa = tl.load(X + r0 * sx + ca, mask=ca < lim, other=-float("inf"), eviction_policy="evict_first")
    xb = tl.load(X + r0 * sx + cb, mask=cb < lim, other=-float("inf"), eviction_policy="evict_first")
    row = r0
    for _ in range(pid, n_rows, npr):
        nx = row + npr
        nlim = tl.where(nx < n_rows, n_cols, 0)
        pa = tl.load(X + nx * sx + ca, mask=ca < nlim, other=-float("inf"), eviction_policy="evict_first")
        pb = tl.load(X + nx * sx + cb, mask=cb < nlim, other=-float("inf"), eviction_policy="evict_first")
        fa = xa.to(tl.float32)
        fb = xb.to(tl.float32)
        m = tl.maximum(tl.max(fa, axis=0), tl.max(fb, axis=0))
        ea = tl.exp2((fa - m) * L)
        eb = tl.exp2((fb - m) * L)
        inv = 1.0 / (tl.sum(ea, axis=0) + tl.sum(eb, axis=0))
        tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma)
        tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb)
        xa = pa
        xb = pb
        row = nx


@triton.jit
def _ex2ftz(x):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _split(X, Y, n_cols, sx, sy, A: tl.constexpr, B: tl.constexpr, MODE: tl.constexpr,
           STORE: tl.constexpr, I64: tl.constexpr):
    if I64:
        row = tl.program_id(0).to(tl.int64)
    else:
        row = tl.program_id(0)
    L: tl.constexpr = 1.4426950408889634
    ca = tl.arange(0, A)
    cb = A + tl.arange(0, B)
    ma = ca < n_cols
    mb = cb < n_cols
    xa = tl.load(X + row * sx + ca, mask=ma, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
    xb = tl.load(X + row * sx + cb, mask=mb, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
    m = tl.maximum(tl.max(xa, axis=0), tl.max(xb, axis=0))
    if MODE == 0:
        ea = tl.exp2((xa - m) * L)
        eb = tl.exp2((xb - m) * L)
    elif MODE == 1:
        ea = _ex2ftz((xa - m) * L)
        eb = _ex2ftz((xb - m) * L)
    else:  # diagnostic: no exponential (wrong result), the structure's own ceiling
        ea = tl.where(ma, xa - m, 0.0)
        eb = tl.where(mb, xb - m, 0.0)
    inv = 1.0 / (tl.sum(ea, axis=0) + tl.sum(eb, axis=0))
    if STORE == 0:
        tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma)
        tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb)
    elif STORE == 1:
        tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma, eviction_policy="evict_first")
        tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb, eviction_policy="evict_first")
    else:
        tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma, cache_modifier=".cs")
        tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb, cache_modifier=".cs")


def pieces(n, k):
    out = []
    rest = n
    for i in range(k - 1):
        p = triton.next_power_of_2(rest)
        if p > rest:
            p //= 2
        out.append(p)
        rest -= p
    out.append(triton.next_power_of_2(max(rest, 1)) if rest > 0 else 0)
    while len(out) < 3:
        out.append(0)
    return out


def candidates(kind: str, N: int, R: int, nsm: int):
    """(name, launch(x, y) -> compiled kernel) for one experiment set."""
    out = []
    if kind == "pieces":
        for k in (2, 3):
            a, b, c = pieces(N, k)
            for native in (0, 1):
                for nw in (8, 16, 32):
                    cfg = dict(A=a, B=b, C=c, NATIVE=native, num_warps=nw)
                    out.append((f"split{k} native={native} nw={nw} ({a}+{b}+{c})",
                                lambda x, y, cfg=cfg: _split3[(R,)](x, y, N, N, N, **cfg)))
        a, b, _ = pieces(N, 2)
        for per_sm in (1, 2):
            for nw in (16, 32):
                for st in (1, 3):
                    g = min(R, nsm * per_sm)
                    out.append((f"persist per_sm={per_sm} nw={nw} stages={st}",
                                lambda x, y, g=g, nw=nw, st=st: _persist[(g,)](
                                    x, y, R, N, N, N, A=a, B=b, num_warps=nw, num_stages=st)))
    else:
        for mode in (0, 1, 2):  # exp2, ex2.approx.ftz, no exponential (diagnostic)
            for store in (0, 1, 2):  # plain, evict_first, .cs
                for i64 in (1, 0):
                    if mode == 2 and (store or not i64):
                        continue
                    for nw in (16, 32):
                        cfg = dict(A=16384, B=4096, MODE=mode, STORE=store, I64=i64, num_warps=nw)
                        out.append((f"mode={mode} store={store} i64={i64} nw={nw}",
                                    lambda x, y, cfg=cfg: _split[(R,)](x, y, N, N, N, **cfg)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=("pieces", "hints"), required=True)
    ap.add_argument("out_dir")
    args = ap.parse_args()
    R, N = 32768, 18992
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    xs = [torch.randn(R, N, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    ys = [torch.empty_like(x) for x in xs]
    flush = torch.empty(int(256e6), dtype=torch.int8, device="cuda")
    ref = torch.softmax(xs[0][:64].double(), -1)

    def timeit(fn, reps=21):
        st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        fn(xs[0], ys[0])
        torch.cuda.synchronize()
        for i in range(reps):
            flush.zero_()
            st[i].record()
            fn(xs[i % 2], ys[i % 2])
            en[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(st, en))

    copy_us = timeit(lambda x, y: y.copy_(x))
    print(f"copy {copy_us:.1f} us, torch.softmax {timeit(lambda x, y: torch.softmax(x, -1)):.1f} us",
          flush=True)
    rows = [{"name": "copy", "us": copy_us}]
    for name, fn in candidates(args.set, N, R, nsm):
        try:
            k = fn(xs[0], ys[0])
            torch.cuda.synchronize()
            err = (ys[0][:64].double() - ref).abs().max().item()
            us = timeit(fn)
            print(f"{name:55s} {us:8.1f} us {copy_us / us * 100:5.1f}% copy regs={k.n_regs} "
                  f"spills={k.n_spills} err={err:.1e}", flush=True)
            rows.append({"name": name, "us": us, "pct_copy": copy_us / us, "regs": k.n_regs,
                         "spills": k.n_spills, "err": err})
        except Exception as e:  # noqa: BLE001 - an experiment that fails to compile is a row
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"name": name, "error": str(e)[:500]})
    with open(os.path.join(args.out_dir, f"softmax-18992-{args.set}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
