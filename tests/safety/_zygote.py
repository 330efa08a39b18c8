"""A pre-imported parent for the crash test: it forks one applying process per request, so each
case costs a fork instead of an interpreter start with numpy and pydantic (the children are real,
separate processes, SIGKILLed like any other).

Protocol on stdin/stdout, one JSON object per line:
  request  {"kind", "root", "state", "variant", "crash_at", "log"}
  answers  {"pid": N}  then  {"pid": N, "status": S}  (S as from os.waitpid)
"""
from __future__ import annotations

import json
import os
import sys

from safety import _crash
from tests.safety import _crash_scenario as scenario


def main() -> None:
    scenario.knobs_for  # noqa: B018  (imports done; warm the sim modules below)
    try:
        import tuner.knobs.registry  # noqa: F401
        import tuner.sim.fake_pynvml  # noqa: F401
        import tuner.host  # noqa: F401
        import tuner.knobs.gpu  # noqa: F401
    except ModuleNotFoundError:
        pass
    import safety.transaction  # noqa: F401
    import safety.watchdog  # noqa: F401

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                dn = os.open(os.devnull, os.O_RDWR)
                os.dup2(dn, 0)
                os.dup2(dn, 1)
                _crash._AT, _crash._n, _crash._LOG = int(req.get("crash_at") or 0), 0, req.get("log")
                scenario.main(req["kind"], req["root"], req["state"], req["variant"])
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "status": status}), flush=True)


if __name__ == "__main__":
    main()
