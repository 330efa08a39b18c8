"""What `apply` says when the policy or the quarantine refuses a change: each rule named once,
with the knobs it refuses, then the way out (which file and key to edit, or `--policy FILE`).
A refusal is exit 1 (the operation was rejected); the message is the same through the daemon."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

#: the policy `apply` uses when it exists instead of the shipped default (tuner.ops.profile)
ETC_POLICY = Path("/etc/metaltune/policy.yaml")


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def policy_message(profile: str, refusals: Iterable[Any], source: str) -> str:
    """`refusals`: safety.policy.Refusal objects (knob, value, rule, failed)."""
    groups: dict[str, list[Any]] = {}
    for r in refusals:
        groups.setdefault(r.rule, []).append(r)
    n = sum(len(g) for g in groups.values())
    lines = [f"apply {profile}: the policy refuses {n} change(s); nothing was written "
             f"(policy: {source})"]
    for rule, rs in groups.items():
        fails = {r.failed for r in rs}
        if len(fails) == 1:  # forbidden / no rule / a rate limit: the same reason for every knob
            lines.append(f"  {rule} - {fails.pop()}: "
                         + ", ".join(f"{r.knob} = {_value(r.value)}" for r in rs))
        else:
            lines.append(f"  {rule}: " + "; ".join(f"{r.knob} = {_value(r.value)} ({r.failed})"
                                                   for r in rs))
    lines.append("  way out: " + way_out(source))
    return "\n".join(lines)


def way_out(source: str) -> str:
    from safety.policy import POLICY_DIR

    keys = "add a rule under `rules:` (or drop the `forbidden:` pattern) for these knobs"
    if Path(source).resolve().parent == POLICY_DIR.resolve():  # a shipped policy: never edited
        return (f"copy {source} to {ETC_POLICY} (apply uses it when it exists) and {keys}, or "
                f"pass `--policy FILE` (e.g. {POLICY_DIR / 'permissive.yaml'} on a dedicated "
                "tuning host); `apply --dry-run` shows the whole plan")
    return (f"edit {source}: {keys}, or pass `--policy FILE`; `apply --dry-run` shows the "
            "whole plan")


def quarantine_message(profile: str, entry: dict[str, Any]) -> str:
    return (f"apply {profile}: this change set is quarantined since a fatal incident in its "
            f"probation ({entry['reason']}; transaction {entry['txn_id']}); nothing was written. "
            f"`metaltune quarantine list` shows it; `metaltune quarantine clear {entry['id']}` lets "
            "it be tried again")
