"""The harness's timer sentinels in a process that has already replaced what they watch: inside
vLLM's CPU build `torch.cuda.Event` is a placeholder class with no `record`, and the canary's
first check (which imports the harness) crashed the engine's worker with AttributeError."""
from __future__ import annotations

import subprocess
import sys

from tests.vllmhelpers import ROOT

SCRIPT = """
import torch
class _EventPlaceholder:  # as vLLM's CPU platform leaves torch.cuda.Event
    pass
torch.cuda.Event = _EventPlaceholder
from kernelsearch.harness import sandbox
assert sandbox.patched() == [], sandbox.patched()
_EventPlaceholder.record = lambda self: None     # a candidate adds a timer hook: seen, then undone
assert sandbox.patched() == ["torch.cuda.Event.record"], sandbox.patched()
sandbox.restore()
assert not hasattr(_EventPlaceholder, "record") and sandbox.patched() == []
print("ok")
"""


def test_sentinels_tolerate_a_placeholder_event_and_still_see_a_hook_added_to_it():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
