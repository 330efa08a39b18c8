"""Reading a run: per proposer, the share of trials by outcome, the spend per kept change and the
gain over time (`metaltune trials --stats`), as data and as a PNG chart.

Outcomes (`outcome(t)`): `kept`; `lost` (measured and reverted: worse, within the noise, a
micro win that lost end to end, a size that regressed); `rolled_back` (an incident); and for
rejections the reason code, with the judge's rule for `incorrect` (`incorrect/tolerance`) and
`guard` for any guard rule. Every trial has exactly one outcome, so the shares add up to 1.
The gain over time is the compounded gain of the kept changes over the run's start,
prod(1 + gain) - 1, after each trial."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Optional

from tuner.proposers.llm.cost import TOKEN_FIELDS
from tuner.trial import Trial
from tuner.workloads.stats import geomean

_RULE = re.compile(r"([A-Za-z_][A-Za-z0-9_:]*): ")


def _rule(t: Trial) -> str:
    judge = t.measurements.get("judge") or {}
    if judge.get("rule"):
        return str(judge["rule"])
    failed = next((g for g in t.gates if not g.passed and g.code == t.reason), None)
    m = _RULE.match(failed.detail) if failed else None
    return m.group(1) if m else ""


def outcome(t: Trial) -> str:
    if t.verdict == "kept":
        return "baseline" if t.reason == "baseline" else "kept"
    if t.verdict == "reverted":
        return "lost"
    if t.verdict == "rolled_back":
        return "rolled_back"
    if t.reason == "guard_failed":
        return "guard"
    if t.reason == "incorrect":
        rule = _rule(t)
        return f"incorrect/{rule}" if rule else "incorrect"
    return t.reason


def proposer_of(t: Trial, runs: dict[str, dict[str, Any]]) -> str:
    return (t.candidate.proposer if t.candidate.proposer not in ("", "start") else None) \
        or str((runs.get(t.run_id) or {}).get("meta", {}).get("proposer") or "?")


def stats(trials: Iterable[Trial], runs: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    by_run = {r["id"]: r for r in runs or []}
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        groups.setdefault(proposer_of(t, by_run), []).append(t)
    out: dict[str, Any] = {}
    for name, ts in groups.items():
        counts: dict[str, int] = {}
        for t in ts:
            counts[outcome(t)] = counts.get(outcome(t), 0) + 1
        kept = counts.get("kept", 0)
        tokens = sum(sum((t.cost or {}).get(f, 0.0) for f in TOKEN_FIELDS) for t in ts)
        usd = sum((t.cost or {}).get("usd", 0.0) for t in ts)
        priced = any("usd" in (t.cost or {}) for t in ts)
        gain, t0, curve, tpj, energy = 1.0, ts[0].started_at, [], None, []
        for i, t in enumerate(ts, 1):
            if t.verdict == "kept" and t.reason != "baseline" and t.gain is not None:
                gain *= 1.0 + t.gain
            if t.verdict == "kept" and (t.energy or {}).get("tok_per_j"):
                tpj = geomean(list(t.energy["tok_per_j"].values()))
            curve.append({"trial": i, "elapsed_s": round(t.started_at + t.duration_s - t0, 3),
                          "gain": gain - 1.0})
            if tpj is not None:  # tokens/J of the settings kept so far (energy measured)
                energy.append({"trial": i, "tok_per_j": tpj})
        out[name] = {
            "trials": len(ts), "counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
            "shares": {k: n / len(ts) for k, n in counts.items()}, "kept": kept,
            "tokens": tokens, "usd": usd if priced else None,
            "tokens_per_kept": tokens / kept if kept and tokens else None,
            "usd_per_kept": usd / kept if kept and priced else None,
            "best_gain": gain - 1.0, "gain_over_time": curve, "tok_per_j_over_time": energy,
        }
    return out


def chart(per_proposer: dict[str, Any], path: Path, title: str = "trials") -> Path:
    """Two panels: outcome shares per proposer (stacked), compounded gain after each trial; a
    third where energy was measured: tokens/J of the kept settings after each trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(per_proposer)
    cats = sorted({c for p in per_proposer.values() for c in p["counts"]},
                  key=lambda c: (c != "kept", c != "lost", c))
    energy = any(p.get("tok_per_j_over_time") for p in per_proposer.values())
    fig, axes = plt.subplots(1, 3 if energy else 2, figsize=(18 if energy else 12, 4.5))
    ax1, ax2 = axes[0], axes[1]
    if energy:
        for n in names:
            cur = per_proposer[n].get("tok_per_j_over_time") or []
            if cur:
                axes[2].step([p["trial"] for p in cur], [p["tok_per_j"] for p in cur],
                             where="post", label=n)
        axes[2].set_xlabel("trial")
        axes[2].set_ylabel("tokens/J of the kept settings")
        axes[2].set_title("energy over time")
        axes[2].legend(fontsize=8)
    left = [0.0] * len(names)
    cmap = plt.get_cmap("tab20")
    for i, c in enumerate(cats):
        vals = [per_proposer[n]["shares"].get(c, 0.0) for n in names]
        ax1.barh(names, vals, left=left, label=c, color=cmap(i % 20))
        left = [a + b for a, b in zip(left, vals)]
    ax1.set_xlim(0, 1)
    ax1.set_xlabel("share of trials")
    ax1.set_title("outcome by proposer")
    ax1.legend(fontsize=7, loc="lower right")
    for n in names:
        cur = per_proposer[n]["gain_over_time"]
        ax2.step([0] + [p["trial"] for p in cur], [0.0] + [100 * p["gain"] for p in cur],
                 where="post", label=n)
    ax2.set_xlabel("trial")
    ax2.set_ylabel("gain of kept changes over the start (%)")
    ax2.set_title("best gain over time")
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
