"""Which attention libraries this host has: FlashMLA, FlashInfer, flash-attn. Library variants
(kernelsearch.families.library) are offered only for a library found here.

`discover(name)` imports the library once per process and says what it found: `present` (with
its version), `absent` (no such module: not offered) or `broken` (the module exists but its
import raised: not offered, and the reason kept, so `metaltune kernel families` can say why a
library that is installed is not used). Nothing is imported before someone asks.

FlashMLA is usually built from source. A build that produced its CUDA extension as separate
torch extensions (one `.so` per part, as a measuring kit does) instead of the package's own
`flash_mla.cuda` can be named in $METALTUNE_FLASHMLA_EXT (paths separated by ':'): their
`*_fwd` functions are installed as `flash_mla.cuda` before `flash_mla` (its Python interface,
which must be importable) is imported."""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Optional

FLASHMLA_EXT_ENV = "METALTUNE_FLASHMLA_EXT"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Library:
    name: str  # the key variants name it by
    module: str  # what is imported
    dist: str  # its distribution on PyPI (for the version)
    install: str  # how to get it onto a GPU host (README, `kernel families`)


LIBRARIES: dict[str, Library] = {
    "flash_mla": Library("flash_mla", "flash_mla", "flash-mla",
                         "build from source: git clone https://github.com/deepseek-ai/FlashMLA "
                         "&& cd FlashMLA && pip install -v . (SM90/SM100, nvcc 12.8+)"),
    "flashinfer": Library("flashinfer", "flashinfer", "flashinfer-python",
                          "pip install flashinfer-python"),
    "flash_attn": Library("flash_attn", "flash_attn", "flash-attn",
                          "pip install flash-attn --no-build-isolation"),
}


@dataclass
class Found:
    name: str
    status: str  # "present" | "absent" | "broken"
    version: Optional[str] = None
    reason: str = ""
    where: str = ""
    module: Any = field(default=None, repr=False, compare=False)

    @property
    def present(self) -> bool:
        return self.status == "present"

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "version": self.version,
                "reason": self.reason, "where": self.where,
                "install": LIBRARIES[self.name].install if self.name in LIBRARIES else ""}


_found: dict[str, Found] = {}


def reset() -> None:
    """Forget what was found (a test that changes sys.path; a host where a library was just
    installed)."""
    _found.clear()


def _version(lib: Library, mod: Any) -> Optional[str]:
    try:
        return importlib.metadata.version(lib.dist)
    except importlib.metadata.PackageNotFoundError:
        v = getattr(mod, "__version__", None)
        return str(v) if v is not None else None


class UnsafeExtension(ImportError):
    """A path in $METALTUNE_FLASHMLA_EXT that root may not load code from."""


def unsafe_ext() -> Optional[str]:
    """Why a path $METALTUNE_FLASHMLA_EXT names may not be loaded (None: every one may). An
    extension is code run in this process, often root's: the file must be ours or root's and
    unwritable by group and others, and so must every directory up to / (sticky ones aside),
    or whoever can write there gets root (safety.securefs.check_file)."""
    from safety.securefs import UnsafePath, check_file

    for p in [p for p in os.environ.get(FLASHMLA_EXT_ENV, "").split(os.pathsep) if p]:
        try:
            check_file(p)
        except UnsafePath as e:
            return f"{FLASHMLA_EXT_ENV}: refusing to load {p}: {e}"
        except OSError as e:
            return f"{FLASHMLA_EXT_ENV}: refusing to load {p}: {e.strerror}"
    return None


def _flashmla_ext() -> Optional[str]:
    """Install the extensions named in $METALTUNE_FLASHMLA_EXT as `flash_mla.cuda`; returns
    what it loaded (for `where`), or None when the variable is unset. UnsafeExtension (nothing
    loaded) when one of them may not be loaded (`unsafe_ext`)."""
    paths = [p for p in os.environ.get(FLASHMLA_EXT_ENV, "").split(os.pathsep) if p]
    if not paths:
        return None
    why = unsafe_ext()
    if why:
        raise UnsafeExtension(why)
    import torch  # noqa: F401  (the extensions link against libtorch)

    shim = types.ModuleType("flash_mla.cuda")
    for p in paths:
        # an extension module loads only under the name it was built with (its PyInit_<name>)
        spec = importlib.util.spec_from_file_location(os.path.basename(p).split(".")[0], p)
        if spec is None or spec.loader is None:
            raise ImportError(f"{FLASHMLA_EXT_ENV}: {p} is no loadable extension")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        for k in dir(m):
            if k.endswith("_fwd"):
                setattr(shim, k, getattr(m, k))
    sys.modules["flash_mla.cuda"] = shim
    return f"{FLASHMLA_EXT_ENV}={os.pathsep.join(paths)}"


def discover(name: str) -> Found:
    """What this process can use of library `name` (cached)."""
    if name in _found:
        return _found[name]
    lib = LIBRARIES[name]
    try:
        spec = importlib.util.find_spec(lib.module)
    except (ImportError, ValueError) as e:
        spec, err = None, e
    else:
        err = None
    if spec is None and err is None:
        f = Found(name, "absent", reason=f"no module named {lib.module!r}")
    elif err is not None:
        f = Found(name, "broken", reason=f"{type(err).__name__}: {err}"[:500])
    else:
        try:
            ext = _flashmla_ext() if name == "flash_mla" else None
            mod = importlib.import_module(lib.module)
            if ext is not None:
                mod.cuda = sys.modules["flash_mla.cuda"]
            f = Found(name, "present", _version(lib, mod),
                      where=ext or str(getattr(mod, "__file__", "") or ""), module=mod)
        except UnsafeExtension as e:  # never loaded: as if it were not installed
            log.warning("library %s treated as absent: %s", name, e)
            f = Found(name, "absent", reason=str(e)[:500])
        except BaseException as e:  # noqa: BLE001  (any import failure is a finding, not a crash)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            f = Found(name, "broken", reason=f"{type(e).__name__}: {e}"[:500])
    _found[name] = f
    return f


def probe(name: str) -> dict:
    """Without importing anything (for `metaltune host`, which must stay light): whether the
    module is there and its distribution's version. `discover` is the real test."""
    lib = LIBRARIES[name]
    try:
        spec = importlib.util.find_spec(lib.module)
    except (ImportError, ValueError) as e:
        return {"name": name, "status": "broken", "version": None,
                "reason": f"{type(e).__name__}: {e}"[:300], "install": lib.install}
    if spec is None:
        return {"name": name, "status": "absent", "version": None,
                "reason": f"no module named {lib.module!r}", "install": lib.install}
    try:
        version: Optional[str] = importlib.metadata.version(lib.dist)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"name": name, "status": "found", "version": version,
            "reason": "not imported (metaltune kernel families imports it)",
            "where": str(spec.origin or ""), "install": lib.install}


def available(name: str) -> bool:
    return discover(name).present


def module(name: str) -> Any:
    """The imported library; LookupError when it is not present here (dispatch then falls
    back)."""
    f = discover(name)
    if not f.present:
        raise LookupError(f"library {name} is {f.status}: {f.reason}")
    return f.module


def report() -> list[dict]:
    """Every library: found or not, version, why not, how to install it."""
    return [discover(n).to_dict() for n in LIBRARIES]
