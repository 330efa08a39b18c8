"""GPU knobs through NVML (nvidia-ml-py), for every GPU on the host, named gpu{index}.*, identified
by UUID. Domains come from the device itself; every write is read back (Knob.apply), which matters
because nvidia-ml-py ignores the C return code of nvmlDeviceSetClockOffsets and
nvmlDeviceSetPowerManagementLimit_v2. NVML settings do not survive a reboot or driver reload.

The code only uses `host.nvml` and `host.path`, so it runs unchanged on the real `pynvml` module and on
the simulated host's FakeNVML.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
from contextlib import contextmanager
from typing import Any, Iterator

from tuner.errors import OperationFailed
from tuner.knobs.base import Choice, ClockLock, IntRange, Knob, Unsupported

POWER_STEP_W = 10  # search grid for the power limit (NVML itself takes milliwatts)
GPC_OFFSET_STEP = 15  # graphics clocks move in 15 MHz bins
MEM_OFFSET_STEP = 100
LOCKS_FILE = "/run/metaltune/nvml-locks.json"  # tmpfs on a real host: gone after a reboot


def _short(e: Exception) -> str:
    name = type(e).__name__.replace("NVMLError_", "")
    hint = " (needs root; NVML settings are read-only in a VM)" if name == "NoPermission" else ""
    return f"NVML {name}: {e}{hint}"


class GpuKnob(Knob):
    setting = ""

    def __init__(self, host: Any, index: int, uuid: str):
        super().__init__(host, f"gpu{index}.{self.setting}")
        self.index = index
        self.uuid = uuid

    @property
    def nv(self) -> Any:
        return self.host.nvml

    def handle(self) -> Any:
        return self.call("find GPU", self.nv.nvmlDeviceGetHandleByUUID, self.uuid)

    def call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            raise OperationFailed(f"{self.name}: {what}: {_short(e)}") from None

    def identity(self) -> str:
        return self.uuid


# ---------------------------------------------------------------------------------------------


class PowerLimit(GpuKnob):
    setting = "power_limit_w"
    unit = "W"
    description = ("Board power limit (nvidia-smi -pl). Lower limits trade peak clocks for power "
                   "and heat; the domain is the device's own min/max constraint.")

    def read(self) -> int | float:
        mw = self.call("read power limit", self.nv.nvmlDeviceGetPowerManagementLimit, self.handle())
        return mw // 1000 if mw % 1000 == 0 else mw / 1000

    def limits(self) -> IntRange:
        lo, hi = self.call("read power constraints",
                           self.nv.nvmlDeviceGetPowerManagementLimitConstraints, self.handle())
        lo_w, hi_w = -(-lo // 1000), hi // 1000
        return IntRange(min=lo_w, max=hi_w, step=POWER_STEP_W if (hi_w - lo_w) % POWER_STEP_W == 0
                        else 1, unit="W")

    def default(self) -> int:
        return self.call("read default power limit",
                         self.nv.nvmlDeviceGetPowerManagementDefaultLimit, self.handle()) // 1000

    def _write(self, value: int) -> None:
        h, mw = self.handle(), int(value) * 1000
        try:
            self.nv.nvmlDeviceSetPowerManagementLimit(h, mw)  # checks its return code
        except self.nv.NVMLError_FunctionNotFound:
            # the _v2 call ignores the C return code: the read-back in apply() is the check
            self.nv.nvmlDeviceSetPowerManagementLimit_v2(h, self.nv.NVML_POWER_SCOPE_GPU, mw)
        except self.nv.NVMLError as e:
            raise OperationFailed(f"{self.name}: set {value} W: {_short(e)}") from None


# ---------------------------------------------------------------------------------------------
# Locked clocks. NVML has no getter for them: we record what we set (in /run, keyed by UUID and
# the boot id, so a reboot forgets it) and trust the record only while the device agrees: a
# graphics clock above the lock's max, or a memory clock outside the lock, means the lock is gone
# (reset by another tool, a driver reload or a GPU reset) and the knob reads null. Locks set by
# other tools cannot be seen through NVML.


@contextmanager
def _locks(host: Any, write: bool) -> Iterator[dict[str, Any]]:
    path = host.path(LOCKS_FILE)
    if write:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    lockpath = path.with_name(path.name + ".lock")
    fd = None
    if write or lockpath.exists():
        fd = os.open(lockpath, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
    try:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        boot = _boot_id(host)
        if data.get("boot_id") != boot:
            data = {"boot_id": boot, "gpus": {}}
        before = json.dumps(data, sort_keys=True)
        yield data
        if write and json.dumps(data, sort_keys=True) != before:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _boot_id(host: Any) -> str:
    try:
        return host.path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class _LockedClocks(GpuKnob):
    unit = "MHz"
    kind = ""  # "gr" or "mem"

    def _record(self) -> list[int] | None:
        with _locks(self.host, write=False) as data:
            return (data["gpus"].get(self.uuid) or {}).get(self.kind)

    def _set_record(self, value: list[int] | None) -> None:
        if value is None and self._record() is None:
            return  # no record means unlocked: resetting an unlocked GPU leaves no trace
        with _locks(self.host, write=True) as data:
            rec = data["gpus"].setdefault(self.uuid, {})
            if value is None:
                rec.pop(self.kind, None)
            else:
                rec[self.kind] = value
            if not rec:
                del data["gpus"][self.uuid]

    def read(self) -> list[int] | None:
        rec = self._record()
        if rec is None:
            return None
        if not self._device_agrees(self.handle(), rec):
            return None
        return [int(rec[0]), int(rec[1])]

    def _device_agrees(self, h: Any, rec: list[int]) -> bool:
        raise NotImplementedError


class LockedClocks(_LockedClocks):
    setting = "locked_clocks_mhz"
    kind = "gr"
    description = ("Locked graphics clock range [min, max] in MHz (nvidia-smi -lgc); null = the "
                   "driver's own boost. The search pins one clock (min == max). NVML cannot report "
                   "a lock: metaltune reads back its own record, checked against the live clock.")

    def limits(self) -> ClockLock:
        h = self.handle()
        mems = self.call("read memory clocks", self.nv.nvmlDeviceGetSupportedMemoryClocks, h)
        try:
            top = self.nv.nvmlDeviceGetMaxClockInfo(h, self.nv.NVML_CLOCK_MEM)
        except self.nv.NVMLError:
            top = None
        mem = top if top in mems else max(mems)
        clocks = self.call("read graphics clocks",
                           self.nv.nvmlDeviceGetSupportedGraphicsClocks, h, mem)
        return ClockLock(supported=sorted(set(int(c) for c in clocks)))

    def _device_agrees(self, h: Any, rec: list[int]) -> bool:
        nv = self.nv
        cur = self.call("read graphics clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_GRAPHICS)
        if cur > rec[1]:
            return False  # a locked GPU never runs above the lock's max
        if cur < rec[0]:
            try:
                reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            except nv.NVMLError:
                return True
            return reasons != 0  # below the floor only with a reason (power, thermal, idle)
        return True

    def _write(self, value: list[int] | None) -> None:
        h = self.handle()
        if value is None:
            self.call("reset locked clocks", self.nv.nvmlDeviceResetGpuLockedClocks, h)
        else:
            self.call(f"lock clocks {value}", self.nv.nvmlDeviceSetGpuLockedClocks, h, *value)
        self._set_record(value)


class LockedMemClocks(_LockedClocks):
    setting = "locked_mem_clocks_mhz"
    kind = "mem"
    description = ("Locked memory clock range [min, max] in MHz (nvidia-smi -lmc); null = the "
                   "driver's choice. Lower memory clocks save power for compute-bound work.")

    def limits(self) -> ClockLock:
        mems = self.call("read memory clocks", self.nv.nvmlDeviceGetSupportedMemoryClocks,
                         self.handle())
        return ClockLock(supported=sorted(set(int(c) for c in mems)))

    def _device_agrees(self, h: Any, rec: list[int]) -> bool:
        nv = self.nv
        cur = self.call("read memory clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        try:
            off = nv.nvmlDeviceGetMemClkVfOffset(h)
        except (nv.NVMLError, AttributeError):
            off = 0
        return rec[0] <= cur - off <= rec[1]

    def _write(self, value: list[int] | None) -> None:
        h = self.handle()
        if value is None:
            self.call("reset memory locked clocks", self.nv.nvmlDeviceResetMemoryLockedClocks, h)
        else:
            self.call(f"lock memory clocks {value}", self.nv.nvmlDeviceSetMemoryLockedClocks,
                      h, *value)
        self._set_record(value)


# ---------------------------------------------------------------------------------------------


class AppClocks(GpuKnob):
    setting = "app_clocks_mhz"
    unit = "MHz"
    description = ("Application clocks [graphics, memory] in MHz (nvidia-smi -ac); null = the "
                   "default. DEPRECATED by NVIDIA in favour of locked clocks (-lgc/-lmc); kept "
                   "for older drivers and profiles. GeForce boards do not support them.")

    def _supported(self) -> str | None:
        h = self.handle()
        try:
            self.nv.nvmlDeviceGetDefaultApplicationsClock(h, self.nv.NVML_CLOCK_GRAPHICS)
            return None
        except self.nv.NVMLError as e:
            return f"application clocks: {_short(e)}"

    def read(self) -> list[int] | None:
        if self._supported():
            return None
        h, nv = self.handle(), self.nv
        return [self.call("read app clock", nv.nvmlDeviceGetApplicationsClock, h,
                          nv.NVML_CLOCK_GRAPHICS),
                self.call("read app clock", nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM)]

    def default(self) -> list[int] | None:
        if self._supported():
            return None
        h, nv = self.handle(), self.nv
        return [nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_GRAPHICS),
                nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_MEM)]

    def limits(self) -> Choice | Unsupported:
        why = self._supported()
        if why:
            return Unsupported(reason=why)
        h, nv = self.handle(), self.nv
        pairs: list[Any] = [None]
        for m in self.call("read memory clocks", nv.nvmlDeviceGetSupportedMemoryClocks, h):
            try:
                gr = nv.nvmlDeviceGetSupportedGraphicsClocks(h, m)
            except nv.NVMLError:  # a memory clock with no graphics table: not a valid pair
                continue
            pairs.extend([int(g), int(m)] for g in sorted(gr))
        return Choice(values=pairs, unit="MHz")

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        if wanted is None:
            return got == self.default()
        return super().readback_matches(wanted, got)

    def _write(self, value: list[int] | None) -> None:
        h = self.handle()
        if value is None:
            self.call("reset application clocks", self.nv.nvmlDeviceResetApplicationsClocks, h)
        else:
            gr, mem = value
            self.call(f"set application clocks {value}",
                      self.nv.nvmlDeviceSetApplicationsClocks, h, mem, gr)


# ---------------------------------------------------------------------------------------------


_SENTINEL = -(2 ** 31)


class _ClockOffset(GpuKnob):
    unit = "MHz"
    clock_type_name = ""  # NVML_CLOCK_GRAPHICS / NVML_CLOCK_MEM
    legacy = ""  # "Gpc" / "Mem"
    step = 1

    def _new_api(self, h: Any) -> Any | None:
        """nvmlDeviceGetClockOffsets for P0, or None when it is missing or silently failed."""
        nv = self.nv
        if not hasattr(nv, "c_nvmlClockOffset_t") or not hasattr(nv, "nvmlDeviceGetClockOffsets"):
            return None
        info = nv.c_nvmlClockOffset_t()
        info.version = nv.nvmlClockOffset_v1
        info.type = getattr(nv, self.clock_type_name)
        info.pstate = nv.NVML_PSTATE_0
        info.clockOffsetMHz = info.minClockOffsetMHz = info.maxClockOffsetMHz = _SENTINEL
        try:
            nv.nvmlDeviceGetClockOffsets(h, ctypes.byref(info))
        except nv.NVMLError:
            return None
        if _SENTINEL in (info.clockOffsetMHz, info.minClockOffsetMHz, info.maxClockOffsetMHz):
            return None  # the C call failed; nvidia-ml-py did not say so
        return info

    def _range(self) -> tuple[int, int] | str:
        h = self.handle()
        info = self._new_api(h)
        if info is not None:
            lo, hi = info.minClockOffsetMHz, info.maxClockOffsetMHz
        else:
            try:
                lo, hi = getattr(self.nv, f"nvmlDeviceGet{self.legacy}ClkMinMaxVfOffset")(h)
            except self.nv.NVMLError as e:
                return f"VF offset range: {_short(e)}"
        if (lo, hi) == (0, 0):
            return "the device reports a VF offset range of 0..0 MHz (not supported on this GPU)"
        return int(lo), int(hi)

    def limits(self) -> IntRange | Unsupported:
        r = self._range()
        if isinstance(r, str):
            return Unsupported(reason=r)
        lo, hi = r
        start = -((-lo) // self.step) * self.step if lo < 0 else lo  # keep 0 on the grid
        return IntRange(min=start, max=hi, step=self.step, unit="MHz")

    def read(self) -> int:
        h = self.handle()
        info = self._new_api(h)
        if info is not None:
            return int(info.clockOffsetMHz)
        return int(self.call("read VF offset",
                             getattr(self.nv, f"nvmlDeviceGet{self.legacy}ClkVfOffset"), h))

    def default(self) -> int:
        return 0

    def _write(self, value: int) -> None:
        nv, h = self.nv, self.handle()
        if hasattr(nv, "nvmlDeviceSetClockOffsets") and hasattr(nv, "c_nvmlClockOffset_t"):
            info = nv.c_nvmlClockOffset_t()
            info.version = nv.nvmlClockOffset_v1
            info.type = getattr(nv, self.clock_type_name)
            info.pstate = nv.NVML_PSTATE_0
            info.clockOffsetMHz = int(value)
            try:
                nv.nvmlDeviceSetClockOffsets(h, ctypes.byref(info))  # return code not checked
            except nv.NVMLError:
                pass
            if self.read() == int(value):
                return
        # older drivers: the per-domain VF offset call, which does check its return code
        self.call(f"set VF offset {value}", getattr(nv, f"nvmlDeviceSet{self.legacy}ClkVfOffset"),
                  h, int(value))


class GpcClockOffset(_ClockOffset):
    setting = "gpc_clock_offset_mhz"
    clock_type_name = "NVML_CLOCK_GRAPHICS"
    legacy = "Gpc"
    step = GPC_OFFSET_STEP
    description = ("Graphics clock V/F curve offset in MHz for P0 (nvmlDeviceSetClockOffsets): the "
                   "same clock at a lower voltage. Too much is unstable (Xid 13/43). Unsupported on "
                   "data-centre parts such as the H200 (range 0..0).")


class MemClockOffset(_ClockOffset):
    setting = "mem_clock_offset_mhz"
    clock_type_name = "NVML_CLOCK_MEM"
    legacy = "Mem"
    step = MEM_OFFSET_STEP
    description = ("Memory clock offset in MHz for P0 (nvmlDeviceSetClockOffsets). Too much "
                   "corrupts data or faults (Xid 13/31). Unsupported on the H200 (range 0..0).")


class PersistenceMode(GpuKnob):
    setting = "persistence_mode"
    description = ("Persistence mode (nvidia-smi -pm): 1 keeps the driver initialised with no "
                   "client, so the GPU keeps its settings and starts work fast. NVIDIA deprecates "
                   "it in favour of the nvidia-persistenced daemon.")

    def read(self) -> int:
        return int(self.call("read persistence mode", self.nv.nvmlDeviceGetPersistenceMode,
                             self.handle()))

    def limits(self) -> Choice:
        return Choice(values=[0, 1])

    def _write(self, value: int) -> None:
        self.call(f"set persistence mode {value}", self.nv.nvmlDeviceSetPersistenceMode,
                  self.handle(), int(value))


KNOB_CLASSES = [PowerLimit, LockedClocks, LockedMemClocks, AppClocks, GpcClockOffset,
                MemClockOffset, PersistenceMode]


def discover(host: Any) -> list[Knob]:
    nv = host.nvml  # KnobUnavailable when there is no NVML: the registry skips this provider
    out: list[Knob] = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = nv.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        out.extend(cls(host, i, uuid) for cls in KNOB_CLASSES)
    return out
