"""Starting a Python child of this interpreter that may run as root: `argv` and `env`.

A plain `python -m pkg.mod` puts its working directory first on `sys.path` (`python file.py`
the file's folder), ahead of the standard library, and a child started as root imports from
there before it drops privileges (the model process builds its model, 2-3 s of imports, then
becomes the sandbox user). Whoever can write that directory gets code run as root: the sandbox
user owns the model process's work dir, and an operator may start the CLI in /tmp. So every
child the project starts with `sys.executable`:

- runs with `-P` (3.11+: nothing prepended to `sys.path`) and `-s` (no user site-packages); on
  3.10, which has no `-P`, a `-c` stub drops the prepended entry before it imports anything
  but `sys` (builtin);
- gets only the PYTHONPATH entries root can trust (`securefs.check_code_dir`: absolute,
  existing, every directory from / owned by root or by us and not writable by group or others
  unless sticky, and the entry itself writable by nobody else even if sticky: anyone can put a
  `sitecustomize.py` in /tmp, issue 42 item 5);
  the others are dropped and logged, as is a PYTHONPYCACHEPREFIX it cannot trust (a `.pyc`
  there is code too).

The package itself comes from the venv's site-packages (an editable or a plain install) or the
checkout the caller puts on PYTHONPATH (checked like any other entry)."""
from __future__ import annotations

import logging
import os
import sys
from typing import Mapping, Optional

from safety.securefs import UnsafePath, check_code_dir

log = logging.getLogger(__name__)

# 3.10: what `-m` would do, after removing the entry `-c` prepends ('' : the working directory)
_STUB = ("import sys\n"
         "if sys.path and sys.path[0] in ('', '.'):\n"
         "    del sys.path[0]\n"
         "import runpy\n"
         "del sys.argv[0]\n"
         "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def argv(module: str, *args: str, python: Optional[str] = None) -> list[str]:
    """The command line running `module` as `__main__` with no directory of the caller's (its
    working directory, a script's folder) and no user site on its module path."""
    exe = python or sys.executable
    if sys.version_info >= (3, 11):
        return [exe, "-P", "-s", "-m", module, *args]
    return [exe, "-s", "-c", _STUB, module, *args]


def untrusted(path: str) -> Optional[str]:
    """Why `path` may not be on a root child's module path (None: it may)."""
    if not os.path.isabs(path):
        return "not an absolute path (relative to the working directory)"
    try:
        check_code_dir(path)
    except UnsafePath as e:
        return str(e)
    except OSError as e:
        return f"{path}: {e.strerror}"
    return None


def env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with only the PYTHONPATH entries root can trust (see the module doc)."""
    out = dict(environ)
    keep = []
    for p in out.get("PYTHONPATH", "").split(os.pathsep):
        if not p:
            continue
        why = untrusted(p)
        if why:
            log.warning("PYTHONPATH entry %s left off a child's module path: %s", p, why)
        elif p not in keep:
            keep.append(p)
    if keep:
        out["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        out.pop("PYTHONPATH", None)
    pyc = out.get("PYTHONPYCACHEPREFIX")
    if pyc and untrusted(pyc):
        log.warning("PYTHONPYCACHEPREFIX %s not passed to a child: %s", pyc, untrusted(pyc))
        del out["PYTHONPYCACHEPREFIX"]
    return out
