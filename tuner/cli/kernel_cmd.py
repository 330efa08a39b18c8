"""`metaltune kernel check|families|list|show` and `metaltune search kernel`.

`search kernel` and `kernel check` run the "search_kernel" and "kernel_check" operations through
`tuner.cli.common.invoke` (the daemon when one runs, else this process); their options are their
options models' fields (tuner.cli.model_options), checked by the model as the socket's arguments
are. `kernel check` reads the candidate file here and passes its text. The others read.
torch/triton are imported inside the commands (the CLI starts without them)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.common import live_help, settings
from tuner.cli.model_options import model_command
from tuner.errors import BadInput
from tuner.ops.kernel_check import KernelCheckOptions
from tuner.search.options import KernelSearchOptions

kernel_app = typer.Typer(help="Check kernel candidates; list kernel families and stored kernels.",
                         no_args_is_help=True)
def _family(name: str) -> str:
    """The options models' family check (tuner.search.options), as a flag's bad input."""
    from tuner.search.options import _family as known

    try:
        return known(name)
    except ValueError as e:
        raise BadInput(f"--family: {e}") from None


def _show_verdict(res: dict, o: object) -> None:
    from kernelsearch.harness.verdict import Verdict

    from rich.console import Console

    v = Verdict.from_dict(res)
    c = Console(soft_wrap=True)
    color = "green" if v.accepted else "red"
    c.print(f"[{color}]{v.verdict}[/{color}]  stage={v.stage}  code={v.code}"
            + (f"  rule={v.rule}" if v.rule else "") + f"  ({v.seconds:.1f}s)")
    if v.detail:
        c.print(v.detail, markup=False)
    c.print(f"  on {v.device}: {len(v.checked_shapes)} shapes checked"
            + (f", {len(v.skipped_shapes)} boundary shapes left to the GPU "
               f"({', '.join('x'.join(map(str, s)) for s in v.skipped_shapes)})"
               if v.skipped_shapes else "")
            + (f"; timed at {', '.join('x'.join(map(str, s)) for s in v.timed_shapes)}"
               if v.timed_shapes else ""), markup=False)
    if v.summary.get("timing", "gpu") != "gpu":
        c.print(f"  timing: {v.summary['timing']}", markup=False)
    for key, t in v.timings.items():
        c.print(f"  {key}: median {t['median_us']:.2f} us ({t['mode']}), "
                f"{t['GBps']:.1f} GB/s, {t['TFLOPs']:.3f} TFLOP/s"
                + (f", x{t['speedup_vs_torch']:.2f} vs torch" if "speedup_vs_torch" in t else "")
                + (f", x{t['speedup_vs_library']:.2f} vs {t['library']}"
                   if "speedup_vs_library" in t else ""))


def _candidate_name(typed: dict) -> None:
    typed["name"] = typed["source"]  # the path as typed, before its parser reads the text


#: its options are KernelCheckOptions' fields (tuner.cli.model_options); the CLI reads the file
#: (as the invoking user) and runs "kernel_check" on its text through tuner.cli.common.invoke:
#: the daemon when one runs, else this process
check_cmd = kernel_app.command("check")(model_command(
    KernelCheckOptions, "kernel_check", _show_verdict,
    """Judge a candidate: static guard, correctness against the float64 reference, timing (with
    the physical-floor check), in a child process with a timeout and a memory limit.
    Exit 0 accepted, 1 rejected, 2 bad input.""",
    prepare=_candidate_name, failed=lambda res: res.get("verdict") != "accepted"))


@kernel_app.command("families")
def families_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Kernel families: signature, dtypes, variants (library ones: offered only where their
    library imports; Gluon ones only on an sm_90 GPU without TRITON_INTERPRET) and the size of
    their search space; then the libraries found here."""
    from kernelsearch import libraries
    from kernelsearch.families import all_families, gluon, library

    why = libraries.unsafe_ext()
    if why:  # never loaded: say so before anything else
        raise BadInput(why)
    rows = []
    for f in all_families():
        shape = f.search_shapes[0]
        rows.append({"family": f.name, "signature": f.signature, "dtypes": list(f.dtypes),
                     "variants": {n: list(v.dims) for n, v in f.variants.items()},
                     "library_variants": library.report(f),
                     "gpu_only_variants": {n: gluon.why_not() or "offered"
                                           for n, v in f.variants.items() if v.gpu_only},
                     "shape_dims": list(f.shape_dims), "bound": f.bound,
                     "grid_at_first_search_shape": len(f.space(shape))})
    libs = libraries.report()
    if as_json:
        print(json.dumps({"families": rows, "libraries": libs}, indent=2))
        return
    for r in rows:
        lv = {x["variant"]: x["status"] for x in r["library_variants"]}
        gv = r["gpu_only_variants"]
        names = [n + (f" (library, {lv[n]})" if n in lv else "")
                 + (f" (gluon, sm_90 only: {gv[n]})" if n in gv else "")
                 for n in r["variants"]]
        print(f"{r['family']:<17} {r['signature']:<28} {r['bound']:<7} "
              f"variants: {', '.join(names)}  grid: {r['grid_at_first_search_shape']}")
    for x in libs:
        print(f"library {x['name']}: {x['status']}" + (f" {x['version']}" if x["version"] else "")
              + (f" ({x['reason']})" if x["reason"] else "")
              + (f"; to install: {x['install']}" if x["status"] != "present" else ""))


def _show_kernel_search(res: dict, o: KernelSearchOptions) -> None:
    if o.proposer == "llm":
        _print_sources(res)
    else:
        _print_buckets(o.family, res)


#: its options are KernelSearchOptions' fields (tuner.cli.model_options); run through
#: tuner.cli.common.invoke: the daemon when one runs, else this process
search_kernel_cmd = model_command(
    KernelSearchOptions, "search_kernel", _show_kernel_search,
    """Search a kernel family per shape bucket with a proposer; every candidate is judged by the
    harness in a child process; trials go to the trial store and the winners become a dispatch
    table. `--proposer llm` writes whole kernel sources: each one the judge accepts is stored
    (`metaltune kernel list`) and goes into the table as `src:<sha256>` where it beats the
    incumbent beyond the noise.""")


def _print_buckets(family: str, res: dict) -> None:
    for t in res.get("trial_log", []):  # one line per trial, then one per bucket
        obj = f"{t['time_us']:.2f} us" if t["time_us"] else "-"
        print(f"  [{t['bucket']}] #{t['number']} {t['variant']} {json.dumps(t['config'])}: "
              f"{t['verdict']}/{t['reason']} {obj}")
    for b in res["buckets"]:
        best = b["best"]
        print(f"{family} {'x'.join(map(str, b['shape']))}: "
              + (f"best {best['variant']} {json.dumps(best['config'])} "
                 f"{best['time_s'] * 1e6:.2f} us"
                 + (f" (x{best['speedup_vs_torch']:.2f} vs torch)" if best.get("speedup_vs_torch") else "")
                 + (f" (x{best['speedup_vs_library']:.2f} vs {best['library']})"
                    if best.get("speedup_vs_library") else " (no library kernel offered)")
                 if best else "no accepted config")
              + f"  [{b['evaluations']} measured, {b['asks']} asked]")
        s = b.get("summary")
        if s and s.get("start") is not None:
            line = f"  {s['metric']}: {s['start']:.4g} -> {s['kept']:.4g} {s['unit']}" \
                if s.get("kept") is not None else f"  {s['metric']}: {s['start']:.4g} {s['unit']}, nothing kept"
            if s["unit"] != "us" and s["time_us"]["start"] is not None:
                line += f"; time a call {s['time_us']['start']:.4g} -> {s['time_us']['kept'] or 0:.4g} us"
            print(line + f" (first measured -> kept; objective {s['objective']})")
    print(f"run {res['run_id']}: dispatch table with {res['entries']} entries -> {res['table']}")


def _print_sources(res: dict) -> None:
    print(f"run {res['run_id']}: {res['trials']} trials, {res['kept']} kept {res['by_reason']}"
          + (f"; stopped: {res['stopped']}" if res["stopped"] else "")
          + f"; ${res['cost'].get('usd', 0.0):.4f}")
    print(f"dispatch table with {res['entries']} entries ({len(res['sources'])} stored sources) "
          f"-> {res['table']}")


def _kernel_store(ctx: typer.Context):
    from tuner.search.sources import store_in

    return store_in(settings(ctx).state_dir)


@kernel_app.command("list")
def list_cmd(ctx: typer.Context, family: Optional[str] = typer.Option(None, "--family", help="Only sources of this family."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Stored kernel sources (content-addressed, from `search kernel --proposer llm` or a
    profile) with their provenance: family, where they were judged, on which shapes."""
    if family:
        _family(family)
    recs, bad = _scan(_kernel_store(ctx))
    recs = [r for r in recs if not family or r.family == family]
    rows = [{"sha256": r.sha256, "family": r.family, "config": r.config,
             "verdict": r.verdict.get("verdict"), "gpu": r.env.get("gpu"),
             "driver": r.env.get("driver"), "torch": r.env.get("torch"),
             "triton": r.env.get("triton"), "checked": len(r.checked), "timed": r.timed,
             "stored_at": r.stored_at, "run_id": r.origin.get("run_id"),
             "trial": r.origin.get("trial"), "ideas": r.origin.get("ideas", []),
             "rejudged_on": [j.get("env", {}).get("gpu") for j in r.judgements],
             "imported": bool(r.imported_at), "quarantined": r.quarantined or None}
            for r in recs]
    if as_json:
        print(json.dumps({"kernels": rows, "unreadable": [{"file": f, "error": e}
                                                          for f, e in bad]}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"stored kernels ({_kernel_store(ctx).root})")
    for col in ("sha256", "family", "config", "judged on", "timed", "stored", "run/trial"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["sha256"][:16], r["family"], json.dumps(r["config"]),
                  f"{r['gpu']} {r['driver']} torch {r['torch']} triton {r['triton']}",
                  ", ".join("x".join(map(str, s)) for s in r["timed"]), r["stored_at"],
                  f"{r['run_id'] or '-'}/{r['trial'] or '-'}")
    Console().print(t)


def _scan(store):
    """The store's records; each unreadable one named on stderr (one line each), an unsafe
    store an error (exit 1): never an empty list that hides why."""
    import sys

    from kernelsearch.store import StoreError
    from tuner.errors import OperationFailed

    try:
        recs, bad = store.scan()
    except StoreError as e:
        raise OperationFailed(f"kernel store unsafe, not read: {e}") from None
    for f, why in bad:
        print(f"skipped unreadable record {why if why.startswith(f) else f + ': ' + why}",
              file=sys.stderr)
    return recs, bad


@kernel_app.command("show")
def show_cmd(ctx: typer.Context, sha: str = typer.Argument(..., help="SHA-256 (or a unique prefix of at least 8 hex digits)."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One stored kernel: its record (verdict, shapes checked and timed, environment, origin,
    re-judgements) and its source, re-hashed before it is shown (exit 1 if it no longer
    matches its digest)."""
    from kernelsearch.store import StoreError

    store = _kernel_store(ctx)
    if len(sha) < 8 or any(ch not in "0123456789abcdef" for ch in sha):
        raise BadInput(f"SHA {sha!r}: expected at least 8 lowercase hex digits")
    recs, bad = _scan(store)
    hits = [r.sha256 for r in recs if r.sha256.startswith(sha)]
    broken = [why for f, why in bad if Path(f).stem.startswith(sha)]
    if broken and not hits:
        from tuner.errors import OperationFailed

        raise OperationFailed(broken[0])
    if len(hits) != 1:
        raise BadInput(f"SHA {sha!r}: " + ("no stored kernel has it" if not hits else
                                          f"ambiguous ({len(hits)} stored kernels start so)"))
    rec = store.record(hits[0])
    try:
        source, ok = store.source(rec.sha256), ""
    except StoreError as e:
        source, ok = "", str(e)
    if as_json:
        print(json.dumps({**rec.to_dict(), "source": source, "error": ok or None}, indent=2))
    else:
        print(f"src:{rec.sha256}  {rec.family}  config {json.dumps(rec.config)}")
        v = rec.verdict
        print(f"verdict {v.get('verdict')} ({v.get('detail', '')}) on {rec.env.get('gpu')}, "
              f"driver {rec.env.get('driver') or '-'}, torch {rec.env.get('torch')}, "
              f"triton {rec.env.get('triton')}; stored {rec.stored_at}")
        print("checked: " + ", ".join("x".join(map(str, s)) for s in rec.checked))
        print("timed:   " + ", ".join("x".join(map(str, s)) for s in rec.timed))
        if rec.origin:
            o = rec.origin
            print(f"origin: run {o.get('run_id')} trial {o.get('trial')} by {o.get('proposer')}"
                  + (f"; ideas: {o['ideas']}" if o.get("ideas") else ""))
        for j in rec.judgements:
            print(f"re-judged {j.get('at')} on {j.get('env', {}).get('gpu')}: "
                  f"{j.get('verdict')} {j.get('code')}")
        if rec.imported_at:
            print(f"imported {rec.imported_at} (its verdict and env are the exporting host's)")
        if rec.quarantined:
            print(f"QUARANTINED {rec.quarantined.get('at')}: {rec.quarantined.get('why')}")
        print(source if not ok else f"REFUSED: {ok}", end="" if source.endswith("\n") else "\n")
    if ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(kernel_app, name="kernel")
    from tuner.cli.search_cmd import search_app

    search_app.command("kernel")(search_kernel_cmd)
    for cmd in (check_cmd, search_kernel_cmd):  # every family kernelsearch has, as it has them
        live_help(cmd, "family", _families)
    live_help(search_kernel_cmd, "proposer",
              lambda: "|".join(_proposer_names())
              + " (llm writes kernel sources)")


def _proposer_names() -> list[str]:
    from tuner.proposers import names

    return names()


def _families() -> str:
    from kernelsearch.families import NAMES

    return "|".join(NAMES)
