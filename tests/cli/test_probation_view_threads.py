"""The probation view's thread imports nothing (the rare hang after Ctrl-C in `apply`).

Seen with scripts/stress_ctrlc.py: a Ctrl-C while `apply`'s main thread imported a module
landed in importlib's module-lock cleanup, a weakref callback, which swallows the
KeyboardInterrupt and leaves the global import lock held by the main thread; the view's thread,
importing the journal modules for its first poll at that moment, waited for that lock for good,
and the main thread waited for the module the view was importing. Both threads stuck, the Ctrl-C
gone: no exit, no output. So everything the view's thread runs is imported before it starts, in
the caller's thread. Checked in a fresh interpreter (a test process has it all imported)."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from safety import Journal

REPO = Path(__file__).resolve().parents[2]

VIEW = r"""
import json, sys, threading, time
from pathlib import Path

seen = []

class Spy:  # records which thread imports what
    def find_spec(self, name, path=None, target=None):
        seen.append([threading.current_thread().name, name])
        return None

sys.meta_path.insert(0, Spy())
from tuner.cli.probation_view import ProbationView
from tuner.ops.settings import Settings

out = open(sys.argv[2], "w")
with ProbationView(Settings(state_dir=Path(sys.argv[1]), backend="sim", sim_root=None),
                   "apply profile ", stream=out):
    time.sleep(1.5)  # several polls: the transaction is seen and shown
out.close()
print(json.dumps(sorted({n for t, n in seen if t == "probation-view"})))
"""


def test_the_view_thread_imports_nothing_while_it_shows_a_probation(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    j = Journal(state / "journal.db")
    ch = [{"knob": "os.numa_balancing", "identity": "host", "effect": "now", "before": 1,
           "after": 0, "value": 1}]
    tid = j.begin_txn("apply profile h200", None, ch, ch, deadline=time.time() + 330,
                      probation_s=330)
    assert j.start_probation(tid, time.time() + 330)
    j.close()
    with sqlite3.connect(state / "journal.db") as c:  # begun after the view starts
        c.execute("UPDATE txns SET created = created + 3600")
    shown = tmp_path / "shown.txt"
    r = subprocess.run([sys.executable, "-c", VIEW, str(state), str(shown)], cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "transaction 1: in probation for 300s" in shown.read_text(), shown.read_text()
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], r.stdout
