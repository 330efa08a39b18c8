"""The compare child: `python -m tuner.compare.run --json [--sim-root DIR] [--repeats N] [--quick]`.

Collects host facts, runs the benchmark suite (or, on a simulated host, derives the numbers from
the sim's model) and prints one JSON document on stdout; progress goes to stderr. The same module
runs locally, over SSH on a remote host and against `sim://DIR`. Standard library + torch/numpy
only: it must run on a GPU host that has no pydantic, paramiko or typer.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import sys
import time
from typing import Any

SCHEMA = "metaltune.compare.run/1"


def collect(sim_root: str | None = None, repeats: int = 7, quick: bool = False,
            only: set[str] | None = None, seed: int | None = None,
            log: Any = None, facts_only: bool = False, serving: str | None = None) -> dict[str, Any]:
    from tuner.compare import facts as factsmod
    from tuner.compare import suite
    from tuner.host import open_host

    log = log or (lambda s: print(f"[compare] {s}", file=sys.stderr, flush=True))
    unknown = (only or set()) - set(suite.METRICS) - {"serving"}
    if unknown:
        raise ValueError(f"--only: unknown metrics {sorted(unknown)}; known: {list(suite.METRICS)}")
    t0 = time.time()
    host = open_host("sim" if sim_root else "real", sim_root)
    cfg = suite.Config(repeats=repeats, quick=quick, only=only)
    if facts_only or only == {"serving"}:  # `--only serving`: the serving rows alone
        facts, metrics = factsmod.collect(host), []
    elif host.backend == "sim":
        from tuner.compare import simbench

        facts = factsmod.collect(host)
        metrics = simbench.run(host, facts, cfg, seed)
    else:
        metrics = suite.run_all(cfg, log)
        # read after the benchmarks: an idle GPU trains its PCIe link down (Gen1 at idle)
        facts = factsmod.collect(host)
    host.close()
    if serving is not None and not facts_only:  # the engine runs here, on a sim target too
        from tuner.compare import serving as serving_rows

        metrics += serving_rows.metrics(serving, repeats, log)
    return {
        "schema": SCHEMA,
        "hostname": socket.gethostname(),
        "backend": host.backend,
        "sim_root": str(host.root) if host.backend == "sim" else None,
        "started": dt.datetime.fromtimestamp(t0, dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - t0, 2),
        "python": platform.python_version(),
        "software": _software(host.backend == "real"),
        "config": {"repeats": repeats, "quick": quick, "only": sorted(only) if only else None,
                   "serving": serving},
        "facts": facts,
        "notes": [simbench_note()] if host.backend == "sim" else [],
        "metrics": [m.as_dict() for m in metrics],
    }


def simbench_note() -> str:
    from tuner.compare.simbench import NOTE

    return NOTE


def _software(real: bool) -> dict[str, str | None]:
    """Installed versions (metadata only: a sim run must not pay for importing torch)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("torch", "triton", "numpy", "nvidia-ml-py"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    if real and "torch" in sys.modules:  # the suite imported it already
        out["cuda"] = sys.modules["torch"].version.cuda
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.compare.run", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the result as JSON (the only format)")
    p.add_argument("--sim-root", default=os.environ.get("METALTUNE_SIM_ROOT") or None)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small sizes (smoke runs, CI)")
    p.add_argument("--only", default=None, help="comma-separated metric names")
    p.add_argument("--seed", type=int, default=None, help="noise seed (simulated hosts)")
    p.add_argument("--facts-only", action="store_true", help="host facts, no benchmarks")
    p.add_argument("--serving", default=None, help="the serving workload's ARGS (as vllm:ARGS)")
    a = p.parse_args(argv)
    if a.repeats < 2:
        print("--repeats: expected 2 or more (a spread needs two samples)", file=sys.stderr)
        return 2
    only = {s.strip() for s in a.only.split(",") if s.strip()} if a.only else None
    try:
        res = collect(a.sim_root, a.repeats, a.quick, only, a.seed, facts_only=a.facts_only,
                      serving=a.serving)
    except ValueError as e:
        print(f"tuner.compare.run: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from tuner.errors import MetaltuneError

        if isinstance(e, MetaltuneError):
            print(f"tuner.compare.run: error: {e}", file=sys.stderr)
            return e.exit_code
        raise
    json.dump(res, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
