"""`python -m tuner.daemon.child OP JSON_ARGS`: run one operation in a child of the daemon (a
search: heavy imports, a long run, and its own writer lock) and print its result as the last line
of stdout. Never calls back into the daemon (METALTUNE_NO_DAEMON is set by the parent)."""
from __future__ import annotations

import json
import os
import signal
import sys


def main(argv: list[str]) -> int:
    # "-": the arguments on stdin (a candidate's source may exceed one argv string)
    raw = sys.stdin.read() if argv[1:] == ["-"] else argv[1] if len(argv) > 1 else "{}"
    op, args = argv[0], json.loads(raw)
    os.environ.setdefault("METALTUNE_NO_DAEMON", "1")
    # SIGTERM from the daemon: unwind normally so open transactions roll back in `finally`
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    from tuner import ops
    from tuner.errors import MetaltuneError
    from tuner.ops.settings import Settings
    from pathlib import Path

    sim = os.environ.get("METALTUNE_SIM_ROOT")
    settings = Settings(state_dir=Path(os.environ.get("METALTUNE_STATE_DIR", "/var/lib/metaltune")),
                        backend=os.environ.get("METALTUNE_BACKEND"), sim_root=Path(sim) if sim else None)
    try:
        from tuner.ops.args import call

        res = call(op, ops.get(op), settings, args)
        out, code = res, 0
    except KeyboardInterrupt:
        out, code = {"ok": False, "error": "stopped", "exit_code": 1}, 1
    except MetaltuneError as e:
        out, code = {"ok": False, "error": str(e), "exit_code": e.exit_code}, e.exit_code
    except Exception as e:
        code = getattr(e, "exit_code", 1)
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "exit_code": code}
    sys.stdout.write("\n" + json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
