"""A Host: what knobs talk to. The real machine (root "/", the real `pynvml`) or a simulated
host rooted in a folder (its sysfs/procfs tree, a fake `pynvml`, a BMC double).

Knob code never branches on the backend; it uses `host.path(...)`, `host.nvml` and `host.run(...)`.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from tuner.errors import BadInput, KnobUnavailable

Backend = Literal["real", "sim"]


@dataclass
class Host:
    backend: Backend
    root: Path
    dry_run: bool = False
    _nvml: Any = field(default=None, repr=False)
    _nvml_error: str | None = field(default=None, repr=False)

    # -- filesystem (sysfs, procfs, /etc, /dev) under the host's root -------------------------
    def path(self, p: str | os.PathLike[str]) -> Path:
        p = str(p)
        return self.root / p.lstrip("/") if self.backend == "sim" else Path(p)

    # -- NVML ---------------------------------------------------------------------------------
    @property
    def nvml(self) -> Any:
        """The initialised `pynvml` module (real) or `FakeNVML` (sim); raises KnobUnavailable."""
        if self._nvml is None and self._nvml_error is None:
            self._nvml, self._nvml_error = _init_nvml(self)
        if self._nvml is None:
            raise KnobUnavailable(f"NVML unavailable: {self._nvml_error}")
        return self._nvml

    def has_nvml(self) -> bool:
        try:
            self.nvml
            return True
        except KnobUnavailable:
            return False

    # -- external commands (vendor CLIs, systemd-detect-virt) ---------------------------------
    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command; on a sim host, `bin/` under the root is searched first so tests can
        point vendor CLIs at recording executables."""
        env = dict(os.environ)
        if self.backend == "sim":
            env["PATH"] = f"{self.root / 'bin'}:{env.get('PATH', '')}"
            env["METALTUNE_SIM_ROOT"] = str(self.root)
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _init_nvml(host: Host) -> tuple[Any, str | None]:
    if host.backend == "sim":
        from tuner.sim.fake_pynvml import FakeNVML

        nv = FakeNVML(host.root)
    else:
        import pynvml as nv  # nvidia-ml-py
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound on a machine without the driver
        return None, f"{type(e).__name__}: {e}"
    return nv, None


def open_host(
    backend: str | None = None, sim_root: str | os.PathLike[str] | None = None, dry_run: bool = False
) -> Host:
    """Build a Host from explicit arguments or METALTUNE_BACKEND / METALTUNE_SIM_ROOT."""
    backend = backend or os.environ.get("METALTUNE_BACKEND") or (
        "sim" if (sim_root or os.environ.get("METALTUNE_SIM_ROOT")) else "real"
    )
    if backend not in ("real", "sim"):
        raise BadInput(f"--backend: expected 'real' or 'sim', got {backend!r}")
    if backend == "sim":
        sim_root = sim_root or os.environ.get("METALTUNE_SIM_ROOT")
        if not sim_root:
            raise BadInput("--backend sim needs --sim-root DIR (or METALTUNE_SIM_ROOT)")
        root = Path(sim_root).resolve()
        if not (root / "host.json").is_file():
            raise BadInput(f"--sim-root {root}: not a simulated host (no host.json); "
                           f"create one with `metaltune sim init {root}`")
        return Host("sim", root, dry_run=dry_run)
    return Host("real", Path("/"), dry_run=dry_run)
