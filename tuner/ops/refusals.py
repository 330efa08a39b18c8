"""What `apply` says when the policy or the quarantine refuses a change: each rule named once,
with the knobs it refuses, then the way out (which file and key to edit, or `--policy FILE`).
A refusal is exit 1 (the operation was rejected); the message is the same through the daemon."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

#: the policy `apply` uses when it exists instead of the shipped default (tuner.ops.apply)
ETC_POLICY = Path("/etc/metaltune/policy.yaml")


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def policy_message(profile: str, refusals: Iterable[Any], policy: Any,
                   knobs: Optional[Mapping[str, Any]] = None) -> str:
    """`refusals`: safety.policy.Refusal objects (knob, value, rule, failed); `policy`: the
    safety.policy.Policy that refused them (or its source path); `knobs`: to tell which of them
    take effect only after a reboot (their rule then needs `allow_reboot_effect: true`)."""
    source = policy if isinstance(policy, str) else policy.source
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
    edits = [_edit(rule, rs, None if isinstance(policy, str) else policy, knobs or {})
             for rule, rs in groups.items()]
    lines.append("  way out: " + way_out(source, "; ".join(edits)))
    return "\n".join(lines)


def _edit(rule: str, rs: list[Any], policy: Any, knobs: Mapping[str, Any]) -> str:
    """The edit of the policy that lets these changes through, all of it: a `forbidden:`
    pattern wins over every rule, so removing it alone, or adding a rule alone, is not enough
    when the other is missing; a change that takes effect on reboot needs `allow_reboot_effect`."""
    from safety.restore import effect_of

    names = sorted({r.knob for r in rs})
    later = {n for n in names if n in knobs and effect_of(knobs[n]) != "now"}
    reboot = "allow_reboot_effect: true"

    def add_rule(ns: list[str]) -> str:
        flag = f", {reboot}" if later & set(ns) else ""
        return ("add a rule under `rules:` for " + ", ".join(ns)
                + f" (e.g. `- {{knob: \"{ns[0]}\"{flag}}}`)"
                + (" (it takes effect on reboot)" if flag else ""))

    if rule.startswith("forbidden "):
        out = f"remove {rule[len('forbidden '):]} from `forbidden:`"
        hits = {n: (policy.rule_for(n) if policy is not None else None) for n in names}
        missing = [n for n, h in hits.items() if h is None]
        if missing:
            out += " and " + add_rule(missing)
        stiff = sorted({f"rule #{h[0]} (knob {h[1].knob!r})" for n, h in hits.items()
                        if h is not None and n in later and not h[1].allow_reboot_effect})
        if stiff:
            out += f" and set `{reboot}` in " + ", ".join(stiff)
        return out
    if rule == "no rule":
        return add_rule(names)
    if any("allow_reboot_effect is false" in r.failed for r in rs):
        return f"set `{reboot}` in {rule} (these changes take effect on reboot)"
    return f"widen {rule} so it allows these values (what it refused is named above)"


def way_out(source: str, edits: str = "add a rule under `rules:` for these knobs") -> str:
    from safety.policy import POLICY_DIR

    if Path(source).resolve().parent == POLICY_DIR.resolve():  # a shipped policy: never edited
        return (f"copy {source} to {ETC_POLICY} (apply uses it when it exists) and in the copy "
                f"{edits}; or pass `--policy FILE` (e.g. {POLICY_DIR / 'permissive.yaml'} on a "
                "dedicated tuning host); `apply --dry-run` shows the whole plan")
    return f"edit {source}: {edits}; or pass `--policy FILE`; `apply --dry-run` shows the whole plan"


def quarantine_message(profile: str, entry: dict[str, Any]) -> str:
    return (f"apply {profile}: this change set is quarantined since a fatal incident in its "
            f"probation ({entry['reason']}; transaction {entry['txn_id']}); nothing was written. "
            f"`metaltune quarantine list` shows it; `metaltune quarantine clear {entry['id']}` lets "
            "it be tried again")
