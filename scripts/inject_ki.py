"""Run the metaltune CLI with one KeyboardInterrupt raised in the main thread right after the
N-th return of a C function (as CPython's eval breaker does when SIGINT arrives while a C call
runs), counted from the first call of a trigger function. An exploration tool, not a test:

    METALTUNE_KI_AT=N METALTUNE_KI_FROM=begin|wait [METALTUNE_KI_ONLY=acquire,execute] \
        python scripts/inject_ki.py apply h200 --probation 300

Prints "ki-injected: <n> <function> at <file>:<line>" to stderr when it fires, and
"ki-events: <count>" when the trigger function returns without it having fired (how many
points there were to choose from; counting stops there). The injected KeyboardInterrupt
does not go through the SIGINT handler: where Python drops it (an at-fork hook, a __del__) the
run goes on, which a real Ctrl-C no longer does (tuner.ops.probation.ctrl_c_remembered).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

AT = int(os.environ.get("METALTUNE_KI_AT", "0"))
FROM = {"begin": ("safety/transaction.py", "begin"), "wait": ("tuner/ops/probation.py", "wait")}[
    os.environ.get("METALTUNE_KI_FROM", "begin")]
ONLY = set(filter(None, os.environ.get("METALTUNE_KI_ONLY", "").split(",")))
state = {"on": False, "n": 0, "fired": False, "frame": None}


def _prof(frame, event, arg):  # noqa: ANN001
    if event == "call" and not state["on"]:
        if frame.f_code.co_name == FROM[1] and frame.f_code.co_filename.endswith(FROM[0]):
            state["on"], state["frame"] = True, frame
        return
    if event == "return" and frame is state["frame"]:  # the trigger function is done: stop
        state["fired"] = True
        sys.setprofile(None)
        print(f"ki-events: {state['n']}", file=sys.stderr, flush=True)
        return
    if event != "c_return" or not state["on"] or state["fired"]:
        return
    name = getattr(arg, "__name__", "?")
    if ONLY and name not in ONLY:
        return
    state["n"] += 1
    if state["n"] == AT:
        state["fired"] = True
        sys.setprofile(None)
        print(f"ki-injected: {AT} {name} at {frame.f_code.co_filename}:{frame.f_lineno} "
              f"({frame.f_code.co_name})", file=sys.stderr, flush=True)
        raise KeyboardInterrupt


from tuner.cli import main  # noqa: E402

sys.setprofile(_prof)
sys.exit(main())
