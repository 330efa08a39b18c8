"""The rows of `metaltune trials`: what each trial changed, how it ended, and what it measured,
with the gain named by its metric (tokens/J under the energy objective, tokens/s otherwise,
speed for a kernel config) and tokens/s beside tokens/J, so a trial refused for losing
throughput does not read as a plain "+49%". One place for the table, the CSV and the chart."""
from __future__ import annotations

from typing import Any, Optional

COLUMNS = ("#", "run", "verdict", "reason", "gain", "tok/s", "tok/J", "W", "candidate")
ENERGY_OBJECTIVES = ("energy",)


def gain_metric(trial: dict[str, Any], run: dict[str, Any]) -> str:
    """The metric a trial's gain is a ratio of."""
    meta = run.get("meta") or {}
    objective = ((trial.get("measurements") or {}).get("decision") or {}).get("objective") \
        or meta.get("objective") or "throughput"
    if objective in ENERGY_OBJECTIVES:
        return "tok/J"
    if run.get("kind") == "search-kernel" or (trial.get("candidate") or {}).get("kernel"):
        return "speed"
    m = _candidate(trial) or meta.get("baseline") or {}
    return m.get("unit") or m.get("metric") or "throughput"


def _candidate(trial: dict[str, Any]) -> Optional[dict[str, Any]]:
    ms = trial.get("measurements") or {}
    raw = ms.get("candidate") or (ms.get("holistic") or {}).get("candidate")
    if isinstance(raw, list):
        raw = raw[0] if raw else None
    return raw if isinstance(raw, dict) else None


def tokens_per_s(trial: dict[str, Any]) -> Optional[float]:
    """The candidate's tokens/s (its headline median), when it was measured in tokens/s."""
    m = _candidate(trial)
    if m and m.get("unit") == "tok/s" and isinstance(m.get("value"), (int, float)):
        return float(m["value"])
    return None


def tokens_per_j(trial: dict[str, Any]) -> Optional[float]:
    """Geometric mean over sizes, as the keep rule weighs them (per size in --json)."""
    vals = list(((trial.get("energy") or {}).get("tok_per_j") or {}).values())
    if not vals:
        return None
    from tuner.workloads.stats import geomean

    return float(geomean(vals))


def watts(trial: dict[str, Any]) -> Optional[float]:
    """The highest size's mean board watts, as a power budget is held."""
    vals = list(((trial.get("energy") or {}).get("watts") or {}).values())
    return float(max(vals)) if vals else None


def describe(candidate: dict[str, Any]) -> str:
    desc = ", ".join(f"{k}={v}" for k, v in (candidate.get("knobs") or {}).items())
    if candidate.get("kernel"):
        k = candidate["kernel"]
        desc = (desc + " " if desc else "") + f"kernel {k['family']}/{k.get('variant')} {k.get('config')}"
    if candidate.get("runtime"):
        desc += f" runtime {candidate['runtime']}"
    return desc


def measured_columns(res: dict[str, Any]) -> bool:
    """Show tok/s, tok/J and W when either was measured: by a trial in the window, or by the run
    it belongs to (its start), so a window of refused trials still shows the columns."""
    runs = {r["id"]: r for r in res.get("runs", [])}
    for tr in res["trials"]:
        if tokens_per_s(tr) is not None or tokens_per_j(tr) is not None:
            return True
        base = (runs.get(tr["run_id"], {}).get("meta") or {}).get("baseline") or {}
        if base.get("unit") == "tok/s" or base.get("per_size_tok_per_j"):
            return True
    return False


def rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the trials table; the measured columns only where something was."""
    runs = {r["id"]: r for r in res.get("runs", [])}
    metrics = {gain_metric(tr, runs.get(tr["run_id"], {})) for tr in res["trials"]}
    one = metrics.pop() if len(metrics) == 1 else None
    show = measured_columns(res)
    cols = [c for c in COLUMNS if show or c not in ("tok/s", "tok/J", "W")]
    cols[cols.index("gain")] = f"gain ({one})" if one else "gain"
    out = []
    for tr in res["trials"]:
        gain = f"{tr['gain']:+.2%}" if tr.get("gain") is not None else ""
        if gain and not one:
            gain += " " + gain_metric(tr, runs.get(tr["run_id"], {}))
        row = [str(tr["number"]), tr["run_id"][-6:], tr["verdict"], tr["reason"], gain]
        if show:
            tps, tpj, w = tokens_per_s(tr), tokens_per_j(tr), watts(tr)
            row += [f"{tps:.4g}" if tps is not None else "", f"{tpj:.3g}" if tpj is not None else "",
                    f"{w:.0f}" if w is not None else ""]
        out.append(row + [describe(tr["candidate"])])
    return cols, out


def print_rows(cols: list[str], table: list[list[str]], title: str, wide: bool) -> None:
    """Fit the terminal: every column but the candidate keeps its width, the candidate is cut
    with an ellipsis (`--wide`: nothing cut, lines as long as they need)."""
    import shutil

    from rich.console import Console

    if len({r[1] for r in table}) == 1 and not wide:  # one run: named in the title instead
        title = f"{title}, run {table[0][1]}"
        cols, table = cols[:1] + cols[2:], [r[:1] + r[2:] for r in table]
    widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(cols)]
    if wide:
        return Console(width=10 ** 4).print(_table(cols, table, widths, title), crop=False)
    term = shutil.get_terminal_size((100, 24)).columns
    over = sum(w + 3 for w in widths) + 1 - term
    # the candidate gives way first (down to 12), then the reason (down to 12)
    for i, least in ((len(cols) - 1, 12), (cols.index("reason"), 12)):
        if over > 0 and widths[i] > least:
            cut = min(over, widths[i] - least)
            widths[i] -= cut
            over -= cut
            table = [r[:i] + [_cut(r[i], widths[i])] + r[i + 1:] for r in table]
    Console(width=term).print(_table(cols, table, widths, title))


def _table(cols: list[str], table: list[list[str]], widths: list[int], title: Optional[str]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for c, w in zip(cols, widths):
        t.add_column(c, no_wrap=True, min_width=w, max_width=w)
    for r in table:
        t.add_row(*r)
    return t


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def tradeoff_points(res: dict[str, Any]) -> list[dict[str, Any]]:
    """(trial, tokens/s, tokens/J, verdict) for each trial that measured both."""
    out = []
    for tr in res["trials"]:
        tps, tpj = tokens_per_s(tr), tokens_per_j(tr)
        if tps is not None and tpj is not None:
            out.append({"run_id": tr["run_id"], "number": tr["number"], "tok_per_s": tps,
                        "tok_per_j": tpj, "verdict": tr["verdict"], "reason": tr["reason"]})
    return out


def run_starts(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each run's start (its baseline measurement) where it measured both, for the chart."""
    out = []
    seen = {tr["run_id"] for tr in res["trials"]}
    for r in res.get("runs", []):
        base = (r.get("meta") or {}).get("baseline") or {}
        tpj = list((base.get("per_size_tok_per_j") or {}).values())
        if r["id"] in seen and base.get("unit") == "tok/s" and tpj:
            from tuner.workloads.stats import geomean

            out.append({"run_id": r["id"], "tok_per_s": float(base["value"]),
                        "tok_per_j": float(geomean(tpj))})
    return out


def tradeoff_chart(points: list[dict[str, Any]], path: Any, title: str,
                   starts: Optional[list[dict[str, Any]]] = None) -> Any:
    """tokens/s against tokens/J, one point a trial, coloured by verdict, each numbered, and
    each run's start as a star (the Zeus view: how much speed each joule saved cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours = {"kept": "tab:green", "reverted": "tab:grey", "rolled_back": "tab:red",
               "rejected": "tab:orange"}
    for verdict in sorted({p["verdict"] for p in points}):
        sel = [p for p in points if p["verdict"] == verdict]
        ax.scatter([p["tok_per_j"] for p in sel], [p["tok_per_s"] for p in sel],
                   label=verdict, color=colours.get(verdict, "tab:blue"))
    if starts:
        ax.scatter([s["tok_per_j"] for s in starts], [s["tok_per_s"] for s in starts],
                   marker="*", s=160, color="black", label="start")
    for p in points:
        ax.annotate(str(p["number"]), (p["tok_per_j"], p["tok_per_s"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens/J")
    ax.set_ylabel("tokens/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
