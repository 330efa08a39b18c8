"""One list of reason codes: the kernel judge's codes (kernelsearch, which cannot import tuner)
are trial reasons with the same meaning, so a kernel rejection is stored, counted and shown as
the judge named it."""
from __future__ import annotations

from kernelsearch.harness.verdict import CODES
from tuner.trial import REASONS


def test_every_judge_rejection_is_a_trial_reason_with_the_judges_text():
    rejections = {c: t for c, t in CODES.items() if c != "accepted"}
    assert rejections and {c: REASONS.get(c) for c in rejections} == rejections
