"""NVIDIA kernel-module options as knobs: `driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode`.

The value in force is what the loaded driver reports in /proc/driver/nvidia/params (its registry
keys without the NVreg_ prefix). A write goes to metaltune's own modprobe.d file and takes effect
when the module is reloaded (or at boot: regenerate the initramfs if nvidia is loaded from it), so
the knob is "pending" until then, and rolling back a pending change removes our line.
"""
from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

from tuner.errors import KnobUnavailable
from tuner.knobs._files import atomic_write, writable
from tuner.knobs.base import Choice, Effect, Knob, Unsupported, values_equal

MODPROBE_D = "/etc/modprobe.d"
OUR_FILE = "/etc/modprobe.d/99-metaltune-nvidia.conf"
PARAMS = "/proc/driver/nvidia/params"

#: option -> (values, description)
OPTIONS: dict[str, tuple[list[int], str]] = {
    "NVreg_EnablePCIERelaxedOrderingMode": (
        [0, 1],
        "1 makes the driver set Relaxed Ordering on GPU-originated PCIe writes (needs the root "
        "complex to honour RO; helps GPUDirect RDMA on hosts that do). Driver reload to apply."),
}
_OPT_RE = re.compile(r"^\s*options\s+nvidia\s+(.*)$")


def configured(host: Any, option: str) -> tuple[int | None, str | None]:
    """The value modprobe would pass (last occurrence over modprobe.d files in lexical order)
    and the file it comes from."""
    val, src = None, None
    for f in sorted(glob.glob(str(host.path(MODPROBE_D) / "*.conf"))):
        try:
            lines = Path(f).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            m = _OPT_RE.match(line.split("#", 1)[0])
            if not m:
                continue
            for tok in m.group(1).split():
                k, _, v = tok.partition("=")
                if k == option:
                    try:
                        val, src = int(v, 0), f
                    except ValueError:
                        pass
    return val, src


class NvidiaModuleOption(Knob):
    effect = Effect.DRIVER_RELOAD

    def __init__(self, host: Any, option: str):
        super().__init__(host, f"driver.nvidia.{option}")
        self.option = option
        self.description = OPTIONS[option][1]

    def identity(self) -> str:
        return "module:nvidia"

    def _our(self) -> Path:
        return self.host.path(OUR_FILE)

    def read(self) -> int | None:
        """The value the loaded driver uses."""
        key = self.option.removeprefix("NVreg_")
        try:
            text = self.host.path(PARAMS).read_text()
        except OSError:
            raise KnobUnavailable(f"{self.name}: nvidia driver not loaded ({PARAMS} missing)") from None
        for line in text.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == key:
                return int(v.strip(), 0)
        raise KnobUnavailable(f"{self.name}: the loaded driver does not report {key}")

    def pending(self) -> int | None:
        """The configured value if it differs from the one in force, else None."""
        val, _ = configured(self.host, self.option)
        try:
            cur = self.read()
        except KnobUnavailable:
            cur = None
        return val if val is not None and val != cur else None

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        # writing the value already in force leaves nothing pending: that is a success too
        if got is None:
            return values_equal(configured(self.host, self.option)[0], wanted) or \
                values_equal(self.read(), wanted)
        return values_equal(wanted, got)

    def limits(self) -> Any:
        d = self.host.path(MODPROBE_D)
        if not d.is_dir():
            return Unsupported(reason=f"no {MODPROBE_D}")
        target = self._our() if self._our().exists() else d
        if not writable(target):
            return Unsupported(reason=f"{target} is read-only here")
        return Choice(values=list(OPTIONS[self.option][0]))

    def _lines_without_option(self) -> list[str]:
        try:
            lines = self._our().read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            m = _OPT_RE.match(line)
            if m:
                toks = [t for t in m.group(1).split() if t.partition("=")[0] != self.option]
                if not toks:
                    continue
                line = "options nvidia " + " ".join(toks)
            out.append(line)
        return out

    def _save(self, lines: list[str]) -> None:
        body = [ln for ln in lines if ln.strip() and not ln.startswith("# managed by metaltune")]
        if not any(_OPT_RE.match(ln) for ln in body):
            try:
                self._our().unlink()
            except FileNotFoundError:
                pass
            return
        atomic_write(self._our(), "# managed by metaltune: `metaltune rollback` removes it\n"
                     + "\n".join(body) + "\n")

    def _write(self, value: int) -> None:
        lines = self._lines_without_option()
        lines.append(f"options nvidia {self.option}={int(value)}")
        self._save(lines)

    def clear_pending(self) -> None:
        self._save(self._lines_without_option())

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        val, src = configured(self.host, self.option)
        d["pending"] = self.pending()
        d["configured"] = val
        d["configured_in"] = src
        return d


def discover(host: Any) -> list[Knob]:
    if not (host.path(PARAMS).exists() or host.path("/sys/module/nvidia").exists()):
        return []
    return [NvidiaModuleOption(host, o) for o in OPTIONS]
