"""`metaltune kernel check|families` and `metaltune search kernel`.

torch/triton are imported inside the commands (the CLI starts without them); candidates are
judged in a child process by kernelsearch's harness."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.common import settings
from tuner.cli.numbers import finite
from tuner.errors import BadInput

kernel_app = typer.Typer(help="Check kernel candidates; list kernel families.",
                         no_args_is_help=True)


def _family(name: str) -> str:
    from kernelsearch.families import NAMES

    if name not in NAMES:
        raise BadInput(f"--family: unknown kernel family {name!r}; expected one of "
                       f"{', '.join(NAMES)}")
    return name


def _device(device: Optional[str]) -> str:
    if device is None:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise BadInput(f"--device: expected 'cpu' or 'cuda', got {device!r}")
    return device


def _shape(text: str, family: str) -> tuple:
    from kernelsearch.families import get

    dims = get(family).shape_dims
    try:
        vals = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        vals = ()
    if len(vals) != len(dims) or min(vals) < 1:
        raise BadInput(f"--shape {text!r}: expected {'x'.join(dims)} as positive integers "
                       f"joined by 'x' for {family}")
    return vals


@kernel_app.command("check")
def check_cmd(
    family: str = typer.Option(..., "--family", help="softmax|rmsnorm|swiglu|matmul|decode_attention"),
    candidate: Path = typer.Option(..., "--candidate", help="Candidate module (.py) defining forward(...)."),
    config: Optional[str] = typer.Option(None, "--config", help="JSON object of keyword arguments for forward."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu (Triton interpreter) or cuda; default: cuda if present."),
    dtype: Optional[list[str]] = typer.Option(None, "--dtype", help="Dtypes to check; repeatable."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", help="Extra shape to check, e.g. 4096x8192; repeatable."),
    timeout_s: float = typer.Option(300.0, "--timeout", callback=finite(0.1, 86400), help="Seconds before the candidate process is killed."),
    mem_limit_mb: int = typer.Option(6144, "--mem-limit-mb", help="Resident memory limit of the candidate process."),
    no_timing: bool = typer.Option(False, "--no-timing", help="Stop after correctness."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Judge a candidate: static guard, correctness against the float64 reference, timing (with
    the physical-floor check), in a child process with a timeout and a memory limit.
    Exit 0 accepted, 1 rejected, 2 bad input."""
    _family(family)
    if not candidate.is_file():
        raise BadInput(f"--candidate {candidate}: no such file")
    if candidate.suffix != ".py":
        raise BadInput(f"--candidate {candidate}: expected a Python module (.py)")
    cfg = None
    if config:
        try:
            cfg = json.loads(config)
        except json.JSONDecodeError as e:
            raise BadInput(f"--config: not valid JSON ({e.msg})") from None
        if not isinstance(cfg, dict):
            raise BadInput("--config: expected a JSON object of keyword arguments")
    dev = _device(device)
    from kernelsearch.families import get

    fam = get(family)
    for d in dtype or []:
        if d not in fam.dtypes:
            raise BadInput(f"--dtype {d!r}: {family} takes one of {', '.join(fam.dtypes)}")
    shapes = [_shape(s, family) for s in shape or []]
    from kernelsearch.harness import check
    from kernelsearch.harness.timing import H200

    kw = {}
    if shapes:
        kw["shapes"] = shapes + [tuple(s) for s in (fam.tiny_shapes if dev == "cpu" else [])]
    v = check(family, candidate, cfg, device=dev, timeout_s=timeout_s, mem_limit_mb=mem_limit_mb,
              dtypes=list(dtype) if dtype else None, timing=not no_timing,
              ceilings=H200 if dev == "cuda" else None, **kw)
    if as_json:
        print(json.dumps(dict(v.to_dict(), family=family, candidate=str(candidate),
                              device=dev), indent=2))
    else:
        from rich.console import Console

        c = Console(soft_wrap=True)
        color = "green" if v.accepted else "red"
        c.print(f"[{color}]{v.verdict}[/{color}]  stage={v.stage}  code={v.code}"
                + (f"  rule={v.rule}" if v.rule else "") + f"  ({v.seconds:.1f}s)")
        if v.detail:
            c.print(v.detail, markup=False)
        for key, t in v.timings.items():
            c.print(f"  {key}: median {t['median_us']:.2f} us ({t['mode']}), "
                    f"{t['GBps']:.1f} GB/s, {t['TFLOPs']:.3f} TFLOP/s"
                    + (f", x{t['speedup_vs_torch']:.2f} vs torch" if "speedup_vs_torch" in t else ""))
    if not v.accepted:
        raise typer.Exit(1)


@kernel_app.command("families")
def families_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Kernel families: signature, dtypes, variants and the size of their search space."""
    from kernelsearch.families import all_families

    rows = []
    for f in all_families():
        shape = f.search_shapes[0]
        rows.append({"family": f.name, "signature": f.signature, "dtypes": list(f.dtypes),
                     "variants": {n: list(v.dims) for n, v in f.variants.items()},
                     "shape_dims": list(f.shape_dims), "bound": f.bound,
                     "grid_at_first_search_shape": len(f.space(shape))})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['family']:<17} {r['signature']:<28} {r['bound']:<7} "
              f"variants: {', '.join(r['variants'])}  grid: {r['grid_at_first_search_shape']}")


def search_kernel_cmd(
    ctx: typer.Context,
    family: str = typer.Option(..., "--family", help="softmax|rmsnorm|swiglu|matmul|decode_attention"),
    budget: int = typer.Option(20, "--budget", help="Measured configs per shape bucket."),
    proposer: str = typer.Option("optuna", "--proposer", help="random|grid|coordinate|optuna"),
    seed: int = typer.Option(0, "--seed"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu (Triton interpreter) or cuda."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", help="Shape bucket, e.g. 65536x8192; repeatable (default: the family's search shapes)."),
    table: Optional[Path] = typer.Option(None, "--table", help="Where to write the dispatch table (JSON)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Search a kernel family's parameter space per shape bucket with a proposer; every
    candidate is judged by the harness in a child process; trials go to the trial store and the
    winners that beat the torch op become a dispatch table."""
    _family(family)
    from tuner.proposers import names

    if proposer not in names() or proposer == "llm":
        raise BadInput(f"--proposer: expected one of random, grid, coordinate, optuna; got "
                       f"{proposer!r}")
    dev = _device(device)
    shapes = [_shape(s, family) for s in shape] if shape else None
    s = settings(ctx)
    state = s.ensure_state_dir()
    from tuner.search.kernel import run_kernel_search

    def progress(t):
        if not as_json:
            k = t.candidate.kernel
            obj = f"{1e6 / t.objective:.2f} us" if t.objective else "-"
            print(f"  [{k.shape_bucket}] #{t.number} {k.variant} {json.dumps(k.config)}: "
                  f"{t.verdict}/{t.reason} {obj}", flush=True)

    res = run_kernel_search(state, family, budget=budget, proposer=proposer, seed=seed,
                            device=dev, shapes=shapes, table_out=table, on_trial=progress)
    if as_json:
        print(json.dumps(res, indent=2, default=str))
        return
    for b in res["buckets"]:
        best = b["best"]
        print(f"{family} {'x'.join(map(str, b['shape']))}: "
              + (f"best {best['variant']} {json.dumps(best['config'])} "
                 f"{best['time_s'] * 1e6:.2f} us"
                 + (f" (x{best['speedup_vs_torch']:.2f} vs torch)" if best.get("speedup_vs_torch") else "")
                 if best else "no accepted config")
              + f"  [{b['evaluations']} measured, {b['asks']} asked]")
    print(f"run {res['run_id']}: dispatch table with {res['entries']} entries -> {res['table']}")


def register(app: typer.Typer) -> None:
    app.add_typer(kernel_app, name="kernel")
    from tuner.cli.search_cmd import search_app

    search_app.command("kernel")(search_kernel_cmd)
