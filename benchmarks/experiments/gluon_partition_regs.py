"""Where a warp-specialized Gluon kernel's registers go, partition by partition: compiled for
sm_90 on the CPU (Triton 3.6, the H200's; no GPU needed), its SASS cut at every USETMAXREG (the
setmaxnreg a partition runs under), and each piece's register budget, highest register used,
local-memory spill stores / loads and HGMMA counted. ptxas's "Used N registers" is the launch
figure (the kernel-wide .maxnreg: 168 for 12 warps); code after a setmaxnreg.inc may use more,
and this says whether it does and where the spills are. Reading a table (Triton 3.6's layout):
each worker partition's piece starts at its own setmaxnreg (a consumer: HGMMA > 0; the loader:
40); the default partition runs the kernel's prologue at 256, then its own code at what the
workers leave it (12 warps share 384 x 168 registers); the 120s are the workers' dispatch loop.
The kernels without a loader warp (8 warps, launched at 240) give each consumer 240. "In the
HGMMA span": the spills between a piece's first and last HGMMA (its loop); "ptxas": the
whole kernel's spill bytes as ptxas -v counts them.

    PYTHONPATH=.venv/triton-gluon:. .venv/bin/python benchmarks/experiments/gluon_partition_regs.py

(without TRITON_INTERPRET). Prints a table a kernel, and --json a file with the same rows."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def regions(sass: str) -> list[dict]:
    """The SASS cut at each USETMAXREG: a row a piece, in address order."""
    lines = sass.splitlines()
    cuts = [i for i, ln in enumerate(lines) if "USETMAXREG" in ln]
    rows = []
    for a, b in zip([0] + cuts, cuts + [len(lines)]):
        seg = lines[a:b]
        m = re.search(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", lines[a]) \
            if a in cuts else None
        regs = [int(x) for ln in seg for x in re.findall(r"\bR(\d+)\b", ln)]
        mm = [i for i, ln in enumerate(seg) if "HGMMA" in ln]
        loop = seg[mm[0]:mm[-1]] if mm else []  # between its first and last HGMMA: the loop
        rows.append({"op": m.group(1).lower() if m else "entry",
                     "budget": int(m.group(2), 16) if m else None,
                     "instructions": sum(bool(re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln))
                                         for ln in seg),
                     "max_reg": max(regs, default=-1) + 1,
                     "stl": sum(" STL" in ln for ln in seg), "ldl": sum(" LDL" in ln for ln in seg),
                     "hgmma": sum("HGMMA" in ln for ln in seg),
                     "stl_mma": sum(" STL" in ln for ln in loop),
                     "ldl_mma": sum(" LDL" in ln for ln in loop)})
    return [r for r in rows if r["instructions"] > 8]  # the handoffs between setmaxnregs


def compiled(fn, sig: dict, attrs: dict, consts: dict, maxnreg: int | None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nv
    from triton.experimental import gluon

    opts = {"num_warps": consts["num_warps"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    ck = triton.compile(gluon._runtime.GluonASTSource(fn, signature=sig, attrs=attrs,
                                                      constexprs=consts),
                        target=GPUTarget("cuda", 90, 32), options=opts)
    exe = os.path.join(os.path.dirname(nv.get_ptxas(90).path), "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    head = [ln.strip() for ln in ck.asm["ptx"].splitlines()
            if ln.startswith((".maxnreg", ".reqntid", ".maxntid"))]
    return head, regions(sass), ptxas_spills(ck.asm["ptx"])


def ptxas_spills(ptx: str) -> dict:
    """ptxas -v's whole-kernel figures for this PTX: stack frame, spill store / load bytes."""
    from triton.backends.nvidia import compiler as nv

    with tempfile.NamedTemporaryFile(suffix=".ptx", mode="w") as f:
        f.write(ptx)
        f.flush()
        r = subprocess.run([nv.get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o",
                            os.devnull], capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                  r.stderr + r.stdout)
    return dict(zip(("stack", "stores", "loads"), map(int, m.groups()))) if m else {}


def sparse_sig() -> tuple[dict, dict]:
    sig = {"Q": "*bf16", "KV": "*bf16", "RW": "*i32", "BT": "*i32", "SL": "*i32", "O": "*bf16",
           "Op": "*fp32", "Lp": "*fp32"}
    sig.update({k: "i32" for k in ("H", "topk", "n_splits", "split_len")})
    sig["qk_scale"] = "fp32"
    sig.update({k: "i32" for k in ("nrows", "cap", "sqb", "sqh", "srb", "sbt", "sob", "soh")})
    return sig, {(i,): [["tt.divisibility", 16]] for i in list(range(8)) + [15, 16, 17, 19, 20]}


def dense_sig() -> tuple[dict, dict]:
    from triton.experimental.gluon import language as gl

    lay = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    sig = {"Q": "*bf16", "kv_desc": f"tensordesc<bf16[64, 64],{lay}>", "BT": "*i32",
           "SL": "*i32", "O": "*bf16", "Op": "*fp32", "Lp": "*fp32"}
    sig.update({k: "i32" for k in ("H", "n_splits", "split_len")})
    sig["qk_scale"] = "fp32"
    sig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")})
    return sig, {(i,): [["tt.divisibility", 16]] for i in [0, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15]}


def kernels() -> list[tuple[str, object, tuple, dict, int | None]]:
    fams = ROOT / "kernelsearch" / "families"
    sp = _load(fams / "mla_sparse_decode" / "gluon_pingpong.py", "probe_sparse_pp")
    dn = _load(fams / "mla_decode" / "gluon_pingpong.py", "probe_dense_pp")
    ssig, dsig = sparse_sig(), dense_sig()
    base = {"PAGE": 64, "POS": True, "STAGES": 2, "ONE": False, "num_warps": 4}
    out = [(f"sparse gluon_pingpong LOADERS {lw} P_SMEM {int(ps)} (shipped)", sp._sparse_pingpong,
            ssig, dict(base, LOADERS=lw, P_SMEM=ps), 168) for lw, ps in ((2, False), (4, True))]
    dc = {"PAGE": 64, "STAGES": 2, "ONE": False, "PROBE": 0, "num_warps": 4}
    out.append(("dense gluon_pingpong (shipped)", dn._mla_pingpong, dsig, dc, 168))
    ah = _load(ROOT / "benchmarks" / "experiments" / "gluon_ahead.py", "probe_ahead")
    out.append(("dense, S issued ahead (experiment gluon_ahead.py)", ah._mla_ahead, dsig, dc, 168))
    # issue 45: the seesaw (benchmarks/experiments/gluon_seesaw.py) in both orders, with the
    # loader warp (as above) and without it (8 warps, 240 registers a warpgroup, FlashMLA's
    # layout), beside issue 35's ping-pong without its loader warp (the same 240)
    ss = _load(ROOT / "benchmarks" / "experiments" / "gluon_seesaw.py", "probe_seesaw")
    sc = {"PAGE": 64, "STAGES": 2, "ONE": False, "num_warps": 4}
    for loader in (1, 0):
        for lean, what in ((0, "FlashMLA's order"), (1, "LEAN")):
            out.append((f"dense seesaw LEAN {lean} ({what}) LOADER {loader} (experiment "
                        "gluon_seesaw.py)", ss._mla_seesaw, dsig,
                        dict(sc, LEAN=lean, LOADER=loader), 168 if loader else 240))
    nl = _load(ROOT / "benchmarks" / "experiments" / "mla_pingpong_noloader.py", "probe_noloader")
    out.append(("dense ping-pong without its loader warp (experiment mla_pingpong_noloader.py)",
                nl._mla_pingpong, dsig, dc, 240))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gluon_partition_regs: unset TRITON_INTERPRET (Gluon compiles, never interprets)",
              file=sys.stderr)
        return 2
    doc = []
    for name, fn, (sig, attrs), consts, maxnreg in kernels():
        sig = dict(sig, **{k: "constexpr" for k in consts})
        try:
            head, rows, spills = compiled(fn, sig, attrs, consts, maxnreg)
        except Exception as ex:  # noqa: BLE001 - a probe: report the kernel that did not build
            print(f"\n{name}: did not compile: {type(ex).__name__}: {str(ex)[:400]}")
            doc.append({"kernel": name, "error": f"{type(ex).__name__}: {str(ex)[:400]}"})
            continue
        print(f"\n{name}  ({' '.join(head)}; ptxas: {spills.get('stores')} bytes spill "
              f"stores, {spills.get('loads')} loads)")
        print("| piece | setmaxnreg | instructions | registers used | spill st / ld "
              "| of which in the HGMMA span | HGMMA |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['op']} | {r['budget'] or '-'} | {r['instructions']} | {r['max_reg']} | "
                  f"{r['stl']} / {r['ldl']} | {r['stl_mma']} / {r['ldl_mma']} | {r['hgmma']} |")
        doc.append({"kernel": name, "ptx_head": head, "ptxas_spills": spills, "pieces": rows})
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
