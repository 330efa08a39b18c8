"""The comparison report: each metric side by side for every target, the ratio of each target to
the first (the baseline) with a bootstrap confidence interval (or "within noise"), Welch's p, and
which host facts differ. Written as JSON, Markdown, PNG charts (matplotlib, Agg) and one
self-contained HTML page with the charts embedded as base64 PNG."""
from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
from pathlib import Path
from typing import Any

from tuner.compare.stats import ratio_ci, summary

SCHEMA = "metaltune.compare.report/1"
#: facts shown side by side, in this order (dotted keys reach into nested dicts)
FACT_KEYS = [
    "virtualisation", "hypervisor", "container", "gpu_passthrough", "gpu_name", "gpu_count", "driver",
    "gpu0_pcie_gen", "gpu0_pcie_width", "gpu0_pcie_max_gen", "gpu0_pcie_max_width",
    "gpu0_relaxed_ordering", "gpu0_max_read_request_bytes", "gpu0_max_payload_bytes",
    "iommu.enabled", "numa_nodes", "gpu0_numa_node", "cpu_model", "cpu_count", "mem_total_gib",
    "kernel", "backend",
]
#: relative noise floor: a difference smaller than this is never called out
NOISE_FLOOR = 0.01


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)  # type: ignore[assignment]
    return d


def build(results: list[dict[str, Any]], labels: list[str], confidence: float = 0.95) -> dict[str, Any]:
    """`results`: one child JSON per target (tuner.compare.run); the first is the baseline."""
    if len(results) != len(labels) or not results:
        raise ValueError("one label per result, at least one result")
    base = labels[0]
    names: list[str] = []
    by_target: list[dict[str, dict[str, Any]]] = []
    for r in results:
        ms = {m["name"]: m for m in r.get("metrics", [])}
        by_target.append(ms)
        names += [n for n in ms if n not in names]
    metrics = []
    for name in names:
        first = next(ms[name] for ms in by_target if name in ms)
        row: dict[str, Any] = {"name": name, "unit": first["unit"],
                               "higher_is_better": first["higher_is_better"], "targets": [],
                               "comparisons": []}
        for label, ms in zip(labels, by_target):
            m = ms.get(name)
            if m is None:
                row["targets"].append({"target": label, "skipped": "not measured"})
                continue
            row["targets"].append({"target": label, "skipped": m.get("skipped"), "error": m.get("error"),
                                   "samples": m.get("samples", []), "summary": summary(m.get("samples", [])),
                                   "params": m.get("params", {})})
        a = row["targets"][0].get("samples") or []
        for t in row["targets"][1:]:
            b = t.get("samples") or []
            if len(a) < 2 or len(b) < 2:
                row["comparisons"].append({"target": t["target"], "baseline": base, "verdict": "not comparable",
                                           "why": "needs 2+ samples on both sides"})
                continue
            ci = ratio_ci(a, b, confidence, min_rel=NOISE_FLOOR)
            row["comparisons"].append({"target": t["target"], "baseline": base, **ci.as_dict(),
                                       "verdict": _verdict(ci.ratio, ci.within_noise, row["higher_is_better"])})
        metrics.append(row)
    facts = [r.get("facts", {}) for r in results]
    fact_rows = []
    for key in FACT_KEYS:
        vals = [_get(f, key) for f in facts]
        if all(v is None for v in vals):
            continue
        fact_rows.append({"fact": key, "values": vals, "differs": len({json.dumps(v) for v in vals}) > 1})
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline": base, "targets": labels, "confidence": confidence, "noise_floor": NOISE_FLOOR,
        "metrics": metrics, "facts": fact_rows,
        "facts_differing": [r["fact"] for r in fact_rows if r["differs"]],
        "evidence": {lab: r.get("facts", {}).get("evidence", []) for lab, r in zip(labels, results)},
        "notes": {lab: r.get("notes", []) for lab, r in zip(labels, results) if r.get("notes")},
        "runs": [{k: r.get(k) for k in ("hostname", "backend", "sim_root", "started", "duration_s",
                                        "python", "software", "config")} for r in results],
    }


def _verdict(ratio: float, within: bool, hib: bool) -> str:
    if within:
        return "within noise"
    better = ratio > 1 if hib else ratio < 1
    pct = abs(ratio - 1) * 100
    return f"{'better' if better else 'worse'} by {pct:.1f}%"


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _cell(t: dict[str, Any]) -> str:
    if t.get("skipped") or t.get("error"):
        return f"skipped: {t.get('skipped') or t.get('error')}"
    s = t["summary"]
    if not s.get("n"):
        return "–"
    return f"{_fmt(s['median'])} ± {s['cv'] * 100:.1f}% (n={s['n']})"


def _cmp_cell(c: dict[str, Any]) -> str:
    if "ratio" not in c:
        return c["verdict"]
    return f"{c['ratio']:.3f} [{c['low']:.3f}, {c['high']:.3f}] {c['verdict']}"


def markdown(rep: dict[str, Any], charts: dict[str, str] | None = None) -> str:
    labels = rep["targets"]
    lines = [f"# metaltune compare: {' vs '.join(labels)}", "",
             f"Created {rep['created']}. Baseline: `{rep['baseline']}`. Cells: median ± relative "
             f"spread (stdev/mean) over n repeats. Ratio = target median / baseline median, with a "
             f"{int(rep['confidence'] * 100)}% bootstrap interval; \"within noise\" when the interval "
             f"holds 1 (or the difference is under {rep['noise_floor'] * 100:.0f}%).", "",
             "## Metrics", ""]
    head = ["metric", "unit"] + [f"`{t}`" for t in labels]
    head += [f"ratio `{t}`/`{labels[0]}` [CI]" for t in labels[1:]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in rep["metrics"]:
        unit = m["unit"] + (" ↑" if m["higher_is_better"] else " ↓")
        cells = [m["name"], unit] + [_cell(t) for t in m["targets"]] + [_cmp_cell(c) for c in m["comparisons"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Host facts", ""]
    head = ["fact"] + [f"`{t}`" for t in labels] + (["differs"] if len(labels) > 1 else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in rep["facts"]:
        row = [f["fact"]] + [_fmt(v) for v in f["values"]] + (["**yes**" if f["differs"] else ""] if len(labels) > 1 else [])
        lines.append("| " + " | ".join(row) + " |")
    if len(labels) > 1:
        lines += ["", "Facts that differ: " + (", ".join(f"`{k}`" for k in rep["facts_differing"]) or "none")]
    lines += ["", "## Runs", ""]
    for lab, run in zip(labels, rep.get("runs", [])):
        sw = run.get("software") or {}
        lines.append(f"- `{lab}`: host {run.get('hostname')}, started {run.get('started')}, "
                     f"{run.get('duration_s')} s, Python {run.get('python')}, "
                     + ", ".join(f"{k} {v}" for k, v in sw.items() if v)
                     + f"; repeats {(run.get('config') or {}).get('repeats')}"
                     + (" (quick sizes)" if (run.get("config") or {}).get("quick") else ""))
    if rep.get("notes"):
        lines += ["", "## Notes", ""] + [f"- `{lab}`: {n}" for lab, ns in rep["notes"].items() for n in ns]
    lines += ["", "## How the facts were read", ""]
    for lab, ev in rep["evidence"].items():
        lines.append(f"- `{lab}`: " + "; ".join(ev))
    if charts:
        lines += ["", "## Charts", ""] + [f"![{n}]({p})" for n, p in charts.items()]
    return "\n".join(lines) + "\n"


def charts(rep: dict[str, Any]) -> dict[str, bytes]:
    """PNG bytes: `metrics.png` (medians with min–max per target) and, for 2+ targets,
    `ratios.png` (ratio to the baseline with its interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}
    ms = [m for m in rep["metrics"] if any(t.get("summary", {}).get("n") for t in m["targets"])]
    if ms:
        cols = 3
        rows = (len(ms) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        for ax, m in zip(axes.flat, ms):
            labs, meds, lo, hi = [], [], [], []
            for t in m["targets"]:
                s = t.get("summary", {})
                labs.append(t["target"])
                med = s.get("median", 0.0) if s.get("n") else 0.0
                meds.append(med)
                lo.append(med - s.get("min", med) if s.get("n") else 0)
                hi.append(s.get("max", med) - med if s.get("n") else 0)
            ax.bar(range(len(labs)), meds, yerr=[lo, hi], capsize=4,
                   color=[f"C{i}" for i in range(len(labs))])
            ax.set_xticks(range(len(labs)), [lab[-18:] for lab in labs], fontsize=7)
            ax.set_title(f"{m['name']} ({m['unit']}{' ↑' if m['higher_is_better'] else ' ↓'})", fontsize=9)
        for ax in list(axes.flat)[len(ms):]:
            ax.axis("off")
        fig.tight_layout()
        out["metrics.png"] = _png(fig, plt)
    comps = [(m["name"], c) for m in rep["metrics"] for c in m["comparisons"] if "ratio" in c]
    if comps:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(comps) + 1.2))
        ys = list(range(len(comps)))
        for y, (name, c) in zip(ys, comps):
            color = "grey" if c["within_noise"] else ("C2" if c["verdict"].startswith("better") else "C3")
            ax.errorbar([c["ratio"]], [y], xerr=[[c["ratio"] - c["low"]], [c["high"] - c["ratio"]]],
                        fmt="o", color=color, capsize=3)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yticks(ys, [f"{n} ({c['target'][-16:]})" for n, c in comps], fontsize=7)
        ax.set_xlabel(f"ratio to {rep['baseline']} (grey: within noise, green: better, red: worse)")
        ax.invert_yaxis()
        fig.tight_layout()
        out["ratios.png"] = _png(fig, plt)
    return out


def _png(fig: Any, plt: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def html_page(rep: dict[str, Any], pngs: dict[str, bytes]) -> str:
    """One file, no external resources: tables plus charts as data: URIs."""
    import re

    md = markdown(rep)
    body: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if not table:
            return
        rows = [r.strip().strip("|").split(" | ") for r in table if not re.fullmatch(r"\|(---\|)+", r.strip())]
        body.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in rows[0]) + "</tr></thead><tbody>"
                    + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
                    + "</tbody></table>")
        table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("- "):
            body.append(f"<p class=ev>{_inline(line[2:])}</p>")
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    flush()
    for name, data in pngs.items():
        b64 = base64.b64encode(data).decode()
        body.append(f'<h2>{html.escape(name)}</h2><img alt="{html.escape(name)}" src="data:image/png;base64,{b64}">')
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}th{background:#eee}"
             "p.ev{font-size:12px;color:#444}img{max-width:100%}code{background:#f4f4f4}")
    title = html.escape("metaltune compare: " + " vs ".join(rep["targets"]))
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{title}</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


def _inline(s: str) -> str:
    import re

    s = html.escape(s)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)


def write(rep: dict[str, Any], results: list[dict[str, Any]], outdir: Path) -> dict[str, Path]:
    """report.json (with each target's raw run), report.md, report.html, metrics.png, ratios.png."""
    outdir.mkdir(parents=True, exist_ok=True)
    pngs = charts(rep)
    files: dict[str, Path] = {}
    for name, data in pngs.items():
        (outdir / name).write_bytes(data)
        files[name] = outdir / name
    doc = dict(rep, raw=results)
    _atomic(outdir / "report.json", json.dumps(doc, indent=1, default=str) + "\n")
    _atomic(outdir / "report.md", markdown(rep, {n: n for n in pngs}))
    _atomic(outdir / "report.html", html_page(rep, pngs))
    files.update({n: outdir / n for n in ("report.json", "report.md", "report.html")})
    return files


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
