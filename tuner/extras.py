"""Which optional dependency group (`pip install 'metaltune[NAME]'`) provides which import, so a
command that needs one fails with one line naming it; and the check that the top-level `safety`
package is metaltune's own, not PyPI's `safety` (a vulnerability scanner of the same import name).

`pip install metaltune` is the daemon's core (NVML, SSH, Redfish, the CLI, the journal, host searches
on optuna). Kernel work, the LLM proposer, Hugging Face models and report charts are extras."""
from __future__ import annotations

import sys
from typing import Optional

#: top-level module -> the extra that installs it (pyproject.toml [project.optional-dependencies])
EXTRA_OF = {
    "torch": "kernels",
    "triton": "kernels",
    "anthropic": "llm",
    "transformers": "hf",
    "matplotlib": "reports",
}


def missing_extra(e: ModuleNotFoundError) -> Optional[str]:
    """One line naming the extra to install, when `e` is the import of an extra's module."""
    top = (e.name or "").split(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return (f"this needs metaltune's {extra!r} extra (no module named {top!r}): "
            f"pip install 'metaltune[{extra}]'")


def safety_clash() -> Optional[str]:
    """Why `import safety` is not metaltune's safety layer, or None when it is. Both projects
    install a top-level `safety` package; in one environment the later install overwrites files
    of the other."""
    try:
        import safety
    except ImportError as e:
        return f"metaltune's 'safety' package does not import ({e})"
    if getattr(safety, "__metaltune__", False):
        return None
    where = getattr(safety, "__file__", None) or list(getattr(safety, "__path__", []))
    return (f"the 'safety' package at {where} is not metaltune's (PyPI's 'safety' vulnerability scanner "
            "has the same import name): install metaltune in its own virtual environment "
            "(python3 -m venv /opt/metaltune), or `pip uninstall safety` and reinstall metaltune there")


def running_cli() -> bool:
    """While `metaltune ...` or `python -m tuner ...` starts (runpy sets argv[0] to "-m" while it
    imports the package)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 == "-m" or argv0.rsplit("/", 1)[-1] == "metaltune"
