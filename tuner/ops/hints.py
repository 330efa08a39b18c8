"""The next commands `apply` and `status` suggest, made so that following them works: a profile
applied from a file is verified by its path (its `name:` alone finds nothing on the profile search
path), and the journal's label of its transaction carries that path for `status` to name later."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

#: the label an applied profile's transaction carries, then " from PATH" for a file profile
APPLY_LABEL = "apply profile "
_FROM = " from "


def verify_arg(name: str, path: Optional[str], dirs: list[Path]) -> str:
    """What `metaltune verify` takes to find this profile again: its name when the name finds
    this very file on the search path, else the file's absolute path."""
    from tuner import profiles
    from tuner.errors import BadInput

    if not path:
        return name
    try:
        if profiles.find(name, dirs).resolve() == Path(path).resolve():
            return name
    except (BadInput, OSError):
        pass
    return str(Path(path).resolve())


def label_name(prof: Any, dirs: list[Path]) -> str:
    """The part of the label after APPLY_LABEL: "NAME", or "NAME from PATH"."""
    arg = verify_arg(prof.name, prof.path, dirs)
    return prof.name if arg == prof.name else f"{prof.name}{_FROM}{arg}"


def from_label(label: str) -> Optional[dict[str, str]]:
    """{"name", "verify"} of an apply label, None for another label."""
    if not label.startswith(APPLY_LABEL):
        return None
    rest = label[len(APPLY_LABEL):]
    name, sep, path = rest.partition(_FROM)
    name = name.split(" ")[0]
    return {"name": name, "verify": path if sep and path else name}


def verify_command(arg: str) -> str:
    return f"metaltune verify {shlex.quote(arg)}"
