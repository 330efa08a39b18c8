"""What `apply` says when its transaction does not end confirmed: the policy's refusal with its
way out, a fatal incident with the quarantine it caused and how to see and lift it, and Ctrl-C
with what was rolled back. One error (with its exit code) per outcome, the same through the daemon."""
from __future__ import annotations

from typing import Any, Mapping

from tuner.errors import BadInput, MetaltuneError, OperationFailed


class Interrupted(OperationFailed):
    """Ctrl-C (SIGINT) during an apply: exit 130, as a shell expects of an interrupted command."""

    exit_code = 130


def translate(name: str, e: BaseException, txn: Any, policy: Any,
              knobs: Mapping[str, Any]) -> MetaltuneError:
    from safety.errors import Instability, PolicyDenied, Quarantined
    from tuner.ops import refusals

    if isinstance(e, KeyboardInterrupt):
        return _interrupted(name, txn)
    if isinstance(e, PolicyDenied):  # rate limits are counted from the journal, here
        if isinstance(e, Quarantined) or not getattr(e, "refusals", None):
            return OperationFailed(f"apply {name}: {e}")
        return OperationFailed(refusals.policy_message(name, e.refusals, policy, knobs))
    msg = f"apply {name}: {e}"
    if isinstance(e, Instability):
        msg += f"; transaction {txn.id} {txn.state.replace('_', ' ')}" + _quarantine(txn)
    err = BadInput if getattr(e, "exit_code", 1) == 2 else OperationFailed
    return err(msg)


def _quarantine(txn: Any) -> str:
    try:
        q = txn.journal.is_quarantined(txn.key)
    except Exception:  # noqa: BLE001 - the message is still worth giving without it
        q = None
    if q is None:
        return ""
    return (f"; this change set is quarantined (entry #{q['id']}): apply refuses it until "
            f"`metaltune quarantine clear {q['id']}`; `metaltune quarantine list` shows it")


def _interrupted(name: str, txn: Any) -> Interrupted:
    """Roll back what is in probation now (the watchdog would, later); say what happened."""
    if txn.state == "probation":
        try:
            txn.rollback("interrupted by the operator (Ctrl-C)")
        except Exception as e:  # noqa: BLE001 - the watchdog still rolls it back at the deadline
            return Interrupted(f"apply {name}: interrupted (Ctrl-C); rolling back transaction "
                               f"{txn.id} failed here ({e}): its watchdog rolls it back at the "
                               "deadline; `metaltune status` shows it")
    if txn.state == "new":
        return Interrupted(f"apply {name}: interrupted (Ctrl-C) before anything was written")
    if txn.state == "confirmed":
        return Interrupted(f"apply {name}: interrupted (Ctrl-C) after transaction {txn.id} was "
                           "confirmed: it stays applied (`metaltune rollback` undoes it)")
    return Interrupted(f"apply {name}: interrupted (Ctrl-C); transaction {txn.id} "
                       f"{txn.state.replace('_', ' ')}: the host has its values from before "
                       "the apply")
