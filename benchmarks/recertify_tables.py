"""Re-certify shipped dispatch tables: every entry judged for correctness (no timing) at its range
ends, its midpoints and a point of every octave inside (the judge's `ranges`), in its own dtype,
variant and config, on the device this runs on. Needs only torch, triton and numpy.

    python3 benchmarks/recertify_tables.py --out DIR --tables h200.json,h200-mla.json \
        [--workers 8] [--gpu-gib 128] [--deadline-s 380] [--budget h200.json=60,...]
    python3 benchmarks/recertify_tables.py --dry-run ...   # the plan only: points, memory, order
    python3 benchmarks/recertify_tables.py --apply RUN.json  # provenance into the tables

Each entry is one job in a pool of long-lived worker processes (shipped variants are the
project's own code: judged in the worker, `isolate=False`). Jobs go cheapest first within a
table, tables in the order given, each table's jobs started only within its time budget; a job
starts only while the memory estimates of the running jobs leave room for its own (a 128 x 160k
MLA point peaked at 108 GiB on the H200: one such job at a time), and one that runs out of
memory anyway is run again alone. Rows are written as they finish (`recertify-h200.jsonl`), so
a run cut at its deadline keeps what it reached; jobs never started are "not reached", jobs cut
"not finished"."""
from __future__ import annotations

import argparse
import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TABLES = ROOT / "host_profiles" / "kernels"  # --table-dir for another (the CPU smoke test)
GIB = 2 ** 30
SMALL_GIB = 4.0  # a job this small may start ahead of a larger one waiting for memory
CONTEXT_GIB = 0.75  # a worker's CUDA context and Triton scratch, outside torch's allocator


def entries_of(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    return doc.get("entries") or doc.get("kernels", {}).get("entries", [])


def corner(fam, e: dict, end: int) -> tuple:
    """An entry's shape with every range dim at its low (0) or high (1) end, the exact dims as
    matched, the rest at the family's cheap shape (as `Family.range_shapes` builds its points)."""
    d = dict(zip(fam.shape_dims, fam.cheap or fam.tiny_shapes[0]))
    d.update(e["match"])
    d.update({k: int(r[end]) for k, r in e["ranges"].items()})
    s = tuple(int(d[k]) for k in fam.shape_dims)
    return tuple(fam.fit(s)) if fam.fit is not None else s


def judge_ranges(e: dict) -> list[dict]:
    """The entry's range, and its top corner as a range of one point (range_shapes moves one dim
    at a time from the low corner: with two range dims the all-high corner is not among them)."""
    rs = [{"match": dict(e["match"]), "ranges": {k: list(r) for k, r in e["ranges"].items()}}]
    if len(e["ranges"]) > 1:
        rs.append({"match": dict(e["match"]),
                   "ranges": {k: [int(r[1]), int(r[1])] for k, r in e["ranges"].items()}})
    return rs


def points(fam, e: dict, rng: random.Random) -> list[tuple]:
    """The shapes the judge checks for an entry (random points drawn here as the judge would)."""
    out = [corner(fam, e, 0)]
    for r in judge_ranges(e):
        for s in fam.range_shapes(r["match"], r["ranges"], rng):
            if s not in out:
                out.append(s)
    return out


def input_bytes(fam, shape: tuple, dtype: str) -> tuple[float, float]:
    """(bytes of the inputs, bytes of the largest one) at a shape: what the judge allocates."""
    from kernelsearch.families.base import element_size

    el = element_size(dtype)
    d = fam.dims_dict(shape)
    if fam.name.startswith("mla"):
        mb = -(-d["L"] // d["P"])
        kv = (d["B"] * mb + max(1, mb // 4)) * d["P"] * 576 * el
        return kv + d["B"] * d["H"] * 576 * el, kv
    if fam.name in ("softmax", "rmsnorm", "swiglu"):
        one = d["rows"] * d["cols"] * el
        return one * (2 if fam.name == "swiglu" else 1), one
    b = float(fam.bytes_moved(shape, el))
    return b, b


def peak_gib(fam, pts: list[tuple], dtype: str) -> float:
    """The judge's device memory at an entry's largest point, estimated from the peaks measured
    in issue 24's third H200 run (`max_memory_reserved` of each job): an MLA check peaked at up
    to 7 times its largest bf16 cache (128 x 163,840: 108 GiB, 4.8 times; the float32 draw held
    two copies then and the previous point's cache was still alive, both fixed since, so this
    over-estimates now), a row-wise one at up to 20 times its largest input (the float64
    reference and its temporaries); else 8 times the bytes moved."""
    worst = 0.0
    for s in pts:
        tot, big = input_bytes(fam, s, dtype)
        if fam.name.startswith("mla"):
            need = 7 * big + (tot - big) + 1.5 * GIB
        elif fam.name in ("softmax", "rmsnorm", "swiglu"):
            need = 22 * big + 0.5 * GIB
        else:
            need = 8 * tot + 0.5 * GIB
        worst = max(worst, need)
    return worst / GIB


# the cost model, from issue 24's first H200 run (h200-graphs.json, 36 entries: 0.2-4.6 s each,
# ~1 s a 65536 x 8192 point): row-wise points are bound by the float64 reference and the chunked
# comparison (~1 GB of inputs a second), MLA points by drawing and fingerprinting the cache
PER_POINT_S = 0.1
PER_ENTRY_S = 2.0  # the first call of a config: Triton compiles (often a disk-cache hit)
BYTES_PER_S = {"mla": 10e9, "rows": 1e9, "other": 3e9}


def cost_s(fam, pts: list[tuple], dtype: str) -> float:
    """Rough seconds of one entry: the order jobs run in and the budget a run needs (the low
    corner is checked with repeats: about four calls)."""
    kind = "mla" if fam.name.startswith("mla") else "rows" if fam.name in (
        "softmax", "rmsnorm", "swiglu") else "other"
    b = sum(input_bytes(fam, s, dtype)[0] for s in pts) + input_bytes(fam, pts[0], dtype)[0] * 3
    return PER_ENTRY_S + PER_POINT_S * (len(pts) + 3) + b / BYTES_PER_S[kind]


def simulate(jobs: list[dict], workers: int, gpu_gib: float) -> dict[str, float]:
    """When each table would finish under the cost model and `run`'s admission rule (no
    deadline): what --dry-run prints to choose workers and budgets."""
    room = gpu_gib - workers * CONTEXT_GIB
    pending, running, t, end = list(jobs), [], 0.0, {}

    def fits(j):
        used = sum(r["mem_gib"] for _, r in running)
        return not running if j["mem_gib"] >= room else used + j["mem_gib"] <= room

    while pending or running:
        while pending and len(running) < workers:
            pick = pending[0] if fits(pending[0]) else next(
                (j for j in pending[1:16] if j["mem_gib"] <= SMALL_GIB and fits(j)), None)
            if pick is None:
                break
            pending.remove(pick)
            running.append((t + pick["est_s"], pick))
        running.sort(key=lambda x: x[0])
        t, j = running.pop(0)
        end[j["table"]] = max(end.get(j["table"], 0.0), t)
    return end


def plan(tables: list[str], rng: random.Random, first: tuple = (),
         large_first: tuple = ()) -> list[dict]:
    """Every entry of every table, in the order run: `first` ("TABLE:I" labels) ahead, then by
    table, cheapest first (largest first in `large_first` tables: their largest jobs bound the
    run's length, and jobs of a few GiB fill the workers beside them)."""
    from kernelsearch.families import get

    jobs = []
    for ti, name in enumerate(tables):
        path = TABLES / name
        for i, e in enumerate(entries_of(path)):
            fam = get(e["family"])
            pts = points(fam, e, rng)
            jobs.append({"table": name, "table_rank": ti, "entry": i, "family": e["family"],
                         "variant": e["variant"], "dtype": e["dtype"], "config": e["config"],
                         "match": e["match"], "ranges": e["ranges"],
                         "n_points": len(pts), "largest": max(
                             pts, key=lambda s: input_bytes(fam, s, e["dtype"])[0]),
                         "mem_gib": round(peak_gib(fam, pts, e["dtype"]), 2),
                         "est_s": round(cost_s(fam, pts, e["dtype"]), 1)})
    jobs.sort(key=lambda j: (f"{j['table']}:{j['entry']}" not in first, j["table_rank"],
                             -j["est_s"] if j["table"] in large_first else j["est_s"]))
    return jobs


def run_entry(job: dict, device: str) -> dict:
    """One entry judged in this worker: the low corner checked with repeats (determinism,
    in-place rewrite, the ghost), every other range point once (all a single output shows)."""
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import check

    fam = get(job["family"])
    e = {k: job[k] for k in ("match", "ranges")}
    cuda = device == "cuda" and torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.time()
    v = check(job["family"], fam.variants[job["variant"]].file, job["config"], device=device,
              isolate=False, timing=False, dtypes=[job["dtype"]], shapes=[corner(fam, e, 0)],
              seeds=1, random_shapes=0, boundary=False, stress_calls=0,
              ranges=judge_ranges(e))
    peak = torch.cuda.max_memory_reserved() / GIB if cuda else 0.0
    if cuda:
        torch.cuda.empty_cache()
    from kernelsearch.table import Entry

    ent = Entry(job["family"], job["dtype"], job["match"], job["ranges"], job["variant"],
                job["config"])
    inside = [s for s in v.checked_shapes if ent.covers(fam.dims_dict(tuple(s)))]
    return dict({k: job[k] for k in ("table", "entry", "family", "variant", "dtype", "match",
                                     "ranges", "mem_gib", "est_s")},
                code=v.code, rule=v.rule, device=v.device, seconds=round(time.time() - t, 1),
                peak_gib=round(peak, 2), points=[list(s) for s in inside],
                n_checked=len(v.checked_shapes), detail=v.detail[:400], pid=os.getpid())


def _init_worker() -> None:
    import torch

    torch.set_num_threads(2)  # CPU-side input drawing in every worker: no oversubscription


OOM = "exception:OutOfMemoryError"


def run(jobs: list[dict], out: Path, workers: int, gpu_gib: float, deadline_s: float,
        budgets: dict[str, float], device: str) -> dict:
    import multiprocessing as mp

    t0 = time.time()
    order = [j["table"] for j in jobs]
    tables = list(dict.fromkeys(order))
    cut, acc = {}, 0.0  # the time after which a table's jobs no longer start
    for name in tables:
        acc += budgets.get(name, deadline_s)
        cut[name] = min(acc, deadline_s)
    room = gpu_gib - workers * CONTEXT_GIB
    def pool() -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                      initializer=_init_worker)

    ex = pool()
    pending = list(jobs)
    running: dict[cf.Future, dict] = {}
    rows: list[dict] = []
    skipped: list[dict] = []
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "recertify-h200.jsonl").open("w")

    def used() -> float:
        return sum(j["mem_gib"] for j in running.values())

    def fits(j: dict) -> bool:
        if j.get("alone") or j["mem_gib"] >= room:
            return not running
        return not any(r.get("alone") for r in running.values()) and used() + j["mem_gib"] <= room

    while (pending or running) and time.time() - t0 < deadline_s:
        now = time.time() - t0
        for j in [j for j in pending if now > cut[j["table"]]]:
            pending.remove(j)
            skipped.append(dict(j, code="not_reached", rule="table_budget"))
        while pending and len(running) < workers:
            head = pending[0]
            pick = head if fits(head) else None if head.get("alone") else next(
                (j for j in pending[1:16] if j["mem_gib"] <= SMALL_GIB and fits(j)), None)
            if pick is None:
                break
            pending.remove(pick)
            pick["started_s"] = round(time.time() - t0, 1)
            try:
                running[ex.submit(run_entry, pick, device)] = pick
            except BrokenProcessPool:  # a worker died: a new pool, the job again
                ex = pool()
                running[ex.submit(run_entry, pick, device)] = pick
        if not running:
            continue
        done, _ = cf.wait(list(running), timeout=1.0, return_when=cf.FIRST_COMPLETED)
        for f in done:
            job = running.pop(f)
            try:
                row = f.result()
            except Exception as e:  # noqa: BLE001 - a worker's failure is a row, not the end
                row = dict({k: job[k] for k in ("table", "entry", "family", "variant", "dtype",
                                                 "match", "ranges", "mem_gib", "est_s")},
                           code="error", rule=type(e).__name__, detail=str(e)[:400])
            row.update(started_s=job["started_s"], done_s=round(time.time() - t0, 1))
            again = row["rule"] == OOM or row["rule"] == "BrokenProcessPool"
            if again and not job.get("alone"):  # once more, alone on the device
                pending.insert(0, dict(job, alone=True, first_try=row))
            else:
                if job.get("first_try"):
                    row["first_try"] = {k: job["first_try"][k] for k in ("code", "rule", "peak_gib")
                                        if k in job["first_try"]}
                rows.append(row)
            log.write(json.dumps(row, default=str) + "\n")
            log.flush()
            print(f"{row['done_s']:6.1f}s {row['table']:<17} #{row['entry']:<3} "
                  f"{row['family']}/{row['variant']:<8} {row['code']:<12} {row['rule']:<26} "
                  f"{row.get('seconds', 0):6.1f}s peak {row.get('peak_gib', 0):6.2f} GiB "
                  f"(est {row['mem_gib']:.2f} GiB, {row['est_s']:.0f} s) "
                  f"{len(row.get('points', []))} pts", flush=True)
    cut_off = [dict(j, code="not_finished", rule="deadline") for j in running.values()]
    skipped += [dict(j, code="not_reached", rule="deadline") for j in pending]
    for p in list(getattr(ex, "_processes", {}).values()):  # cut jobs: end our own workers
        p.kill()
    ex.shutdown(wait=False, cancel_futures=True)
    log.close()
    return {"seconds": round(time.time() - t0, 1), "workers": workers, "gpu_gib": gpu_gib,
            "deadline_s": deadline_s, "budgets": budgets, "rows": rows,
            "not_finished": cut_off, "not_reached": skipped}


def report(res: dict, out: Path, device_name: str) -> str:
    res["device"] = device_name
    res["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "recertify-h200.json").write_text(json.dumps(res, indent=1, default=str))
    lines = ["| table | entry | family/variant | dtype | match | ranges | code | rule | points | "
             "s | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(res["rows"] + res["not_finished"],
                    key=lambda r: (r["table"], r["entry"])):
        if r["code"] != "accepted":
            lines.append(f"| {r['table']} | {r['entry']} | {r['family']}/{r['variant']} | "
                         f"{r['dtype']} | {r['match']} | {r['ranges']} | {r['code']} | "
                         f"{r['rule']} | {len(r.get('points', []))} | {r.get('seconds', '')} | "
                         f"{r.get('peak_gib', '')} |")
    by: dict[str, dict[str, int]] = {}
    for r in res["rows"] + res["not_finished"] + res["not_reached"]:
        k = "accepted" if r["code"] == "accepted" else r["code"] if r["code"] in (
            "not_reached", "not_finished") else "rejected"
        by.setdefault(r["table"], {}).setdefault(k, 0)
        by[r["table"]][k] += 1
    pts = sum(len(r.get("points", [])) for r in res["rows"])
    peak = max((r.get("peak_gib", 0) for r in res["rows"]), default=0)
    lines.append("\n" + "; ".join(f"{t}: " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
                                   for t, c in by.items())
                 + f". {pts} points inside the entries checked, largest job peak {peak:.1f} GiB, "
                 f"{res['seconds']:.0f} s with {res['workers']} workers on {device_name}")
    text = "\n".join(lines)
    (out / "recertify-h200.md").write_text(text + "\n")
    return text


def apply(run_json: Path, stamp_by: str) -> list[str]:
    """Provenance from a run into the tables: each accepted entry's `measured` gets a
    {"recertified": {on, at, by, points, verdict}} record (the table format's list of shapes
    checked for an entry; points as "BxHxL..." strings); the table's `meta` a line saying what
    was re-certified. Entries the
    run rejected are removed (the meta line says which). Returns what it did, a line a table."""
    res = json.loads(run_json.read_text())
    said = []
    by_table: dict[str, list[dict]] = {}
    for r in res["rows"]:
        by_table.setdefault(r["table"], []).append(r)
    for name, rows in sorted(by_table.items()):
        path = TABLES / name
        doc = json.loads(path.read_text())
        ents = doc["entries"]
        gone = []
        for r in rows:
            e = ents[r["entry"]]
            same = all(e[k] == r[k] for k in ("family", "variant", "dtype", "match", "ranges"))
            if not same:
                raise SystemExit(f"{name} entry {r['entry']} changed since the run: re-run it")
            if r["code"] == "accepted":
                e["measured"] = [m for m in e.get("measured", []) if "recertified" not in m]
                e["measured"].append({"recertified": {
                    "verdict": "accepted", "on": r["device"], "at": res["at"], "by": stamp_by,
                    "points": ["x".join(map(str, pt)) for pt in r["points"]]}})
            else:
                gone.append(r["entry"])
        rejected = [f"#{i} {ents[i]['family']}/{ents[i]['variant']} {ents[i]['match']} "
                    f"{ents[i]['ranges']}: {next(r for r in rows if r['entry'] == i)['code']}/"
                    f"{next(r for r in rows if r['entry'] == i)['rule']}" for i in gone]
        doc["entries"] = [e for i, e in enumerate(ents) if i not in set(gone)]
        n_ok = len(rows) - len(gone)
        untouched = len(ents) - len(rows)
        doc["meta"][f"recertified_{res['at'][:16]}Z"] = (
            f"{n_ok} of {len(ents)} entries re-certified on {res['device']} ({stamp_by}): "
            "correctness in the entry's dtype, variant and config at its range ends, "
            "midpoints and a fixed and a random point of every octave inside; each entry's "
            "points are in its measured[].recertified"
            + (f"; {untouched} entries not reached in that run" if untouched else "")
            + (f"; removed as rejected: {'; '.join(rejected)}" if rejected else ""))
        raw = path.read_text()
        text = json.dumps(doc, indent=1) + ("\n" if raw.endswith("\n") else "")
        from kernelsearch.table import DispatchTable

        DispatchTable.from_dict(json.loads(text), where=name)  # still a valid table
        path.write_text(text)
        said.append(f"{name}: {n_ok} re-certified, {len(gone)} removed, {untouched} not reached")
    return said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--tables", default="h200.json,h200-mla.json,h200-graphs.json",
                    help="comma list of host_profiles/kernels/ files, in the order run")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--gpu-gib", type=float, default=128.0,
                    help="device memory the jobs' estimates may add up to")
    ap.add_argument("--deadline-s", type=float, default=380.0)
    ap.add_argument("--budget", default="",
                    help="per-table seconds, e.g. h200.json=60,h200-mla.json=260: a table's jobs "
                         "start only within its share (cumulative, in table order)")
    ap.add_argument("--first", default="",
                    help="comma list of TABLE:INDEX entries to run ahead of the rest")
    ap.add_argument("--large-first", default="",
                    help="comma list of tables whose entries run largest first")
    ap.add_argument("--table-dir", default=None, help="where the tables are (default: shipped)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--apply", default=None, help="a run's recertify-h200.json: write provenance")
    ap.add_argument("--by", default="benchmarks/recertify_tables.py")
    a = ap.parse_args()
    global TABLES
    if a.table_dir:
        TABLES = Path(a.table_dir)
    if a.apply:
        for line in apply(Path(a.apply), a.by):
            print(line)
        return 0
    names = [n for n in a.tables.split(",") if n]
    missing = [n for n in names if not (TABLES / n).is_file()]
    if missing or a.workers < 1:
        print(f"recertify_tables: no such table {missing}" if missing else
              "recertify_tables: --workers must be positive", file=sys.stderr)
        return 2
    try:
        budgets = {k: float(v) for k, v in (x.split("=") for x in a.budget.split(",") if x)}
    except ValueError:
        print("recertify_tables: --budget takes NAME=SECONDS,...", file=sys.stderr)
        return 2
    jobs = plan(names, random.Random(0), tuple(x for x in a.first.split(",") if x),
                tuple(x for x in a.large_first.split(",") if x))
    if a.dry_run:
        for j in jobs:
            print(f"{j['table']:<17} #{j['entry']:<3} {j['family']}/{j['variant']:<8} "
                  f"{json.dumps(j['ranges']):<36} {j['n_points']:3d} pts largest "
                  f"{'x'.join(map(str, j['largest'])):<24} mem {j['mem_gib']:6.2f} GiB "
                  f"est {j['est_s']:5.1f} s")
        end = simulate(jobs, a.workers, a.gpu_gib)
        for t in names:
            js = [j for j in jobs if j["table"] == t]
            print(f"{t}: done at {end.get(t, 0):.0f} s with {a.workers} workers (model)")
            print(f"{t}: {len(js)} entries, {sum(j['n_points'] for j in js)} points, "
                  f"{sum(j['est_s'] for j in js):.0f} job-seconds, largest job "
                  f"{max(j['mem_gib'] for j in js):.1f} GiB")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = os.environ.get("REDTEAM_DEVICE", "cuda")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("recertify_tables: no CUDA device here (REDTEAM_DEVICE=cpu for the interpreter)",
              file=sys.stderr)
        return 2
    name = f"cuda:{torch.cuda.get_device_name(0)}" if device == "cuda" else "cpu-interpreter"
    res = run(jobs, out, a.workers, a.gpu_gib, a.deadline_s, budgets, device)
    print(report(res, out, name), flush=True)
    sys.stdout.flush()
    bad = [r for r in res["rows"] if r["code"] != "accepted"]
    os._exit(1 if bad else 0)  # workers cut at the deadline were killed above


if __name__ == "__main__":
    sys.exit(main())
