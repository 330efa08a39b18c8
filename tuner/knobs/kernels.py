"""`kernels.table`: the dispatch table the host's model processes load (STATE_DIR/kernels/
active.json), as a knob, so a profile's or a search's kernels go through the safety transaction
like any host setting: policy, journal intent, probation under the health monitors, rollback on
an incident or at the deadline, `rollback`, `recover`, `recover --from-defaults` (its default:
no table) and the baseline.

Its value is the table as a dict (`DispatchTable.to_dict()`), or NO_TABLE. The file is read and
written only through descriptors that never follow a symlink (the state dir is trusted and ours,
`secure_dir`); a write is atomic (temporary file, fsync, rename). Model processes see the new
table when they next install it (the Hugging Face patch and the daemon's searches re-read it)."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from tuner.errors import BadInput, OperationFailed, OutOfDomain
from tuner.knobs.base import Effect, Knob

NAME = "kernels.table"
NO_TABLE = "none"
ACTIVE = "active.json"  # tuner.search.sources.ACTIVE
MAX_TABLE = 16 << 20


class TableDomain:
    """A dispatch table (validated as kernelsearch reads it) or NO_TABLE."""

    kind = "kernel_table"

    def validate_value(self, value: Any) -> Any:
        if value is None or value == NO_TABLE:
            return NO_TABLE
        from kernelsearch.table import DispatchTable, TableError

        try:
            return DispatchTable.from_dict(value, where=NAME).to_dict()
        except (TableError, TypeError, AttributeError) as e:
            raise OutOfDomain(f"not a dispatch table: {e}") from None

    def describe(self) -> str:
        return f"a kernel dispatch table, or {NO_TABLE!r}"

    def model_dump(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def search_values(self) -> list[Any]:
        return []


class KernelTableKnob(Knob):
    effect = Effect.NOW
    description = "the kernel dispatch table model processes on this host load"

    def __init__(self, host: Any, state_dir: Path):
        super().__init__(host, NAME)
        self.dir = Path(state_dir) / "kernels"
        self.path = self.dir / ACTIVE

    def identity(self) -> str:
        return f"kernel-table:{self.path}"

    def limits(self) -> TableDomain:
        return TableDomain()

    def default(self) -> Any:
        return NO_TABLE

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        return json.dumps(wanted, sort_keys=True) == json.dumps(got, sort_keys=True)

    def _dir_fd(self, create: bool) -> int | None:
        from safety.securefs import secure_dir

        if create:
            secure_dir(self.dir)
        try:
            return os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OperationFailed(f"{self.dir}: not a directory (a symlink?); refusing it") from None
            raise

    def read(self) -> Any:
        dfd = self._dir_fd(create=False)
        if dfd is None:
            return NO_TABLE
        try:
            fd = os.open(ACTIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return NO_TABLE
        except OSError as e:
            raise OperationFailed(f"{self.path}: cannot open ({e.strerror}; a symlink?)") from None
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_TABLE + 1)
        if len(data) > MAX_TABLE:
            raise OperationFailed(f"{self.path}: over {MAX_TABLE} bytes, not a table")
        try:
            return self.limits().validate_value(json.loads(data))
        except (ValueError, RecursionError, OutOfDomain) as e:
            raise BadInput(f"{self.path}: not a dispatch table ({e})") from None

    def _write(self, value: Any) -> None:
        dfd = self._dir_fd(create=value != NO_TABLE)
        if value == NO_TABLE:
            if dfd is not None:
                try:
                    os.unlink(ACTIVE, dir_fd=dfd)
                    os.fsync(dfd)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(dfd)
            return
        from kernelsearch.store import _write_at

        assert dfd is not None
        _write_at(dfd, ACTIVE, (json.dumps(value, indent=1) + "\n").encode())  # closes dfd


def knob(host: Any, state_dir: Path) -> KernelTableKnob:
    return KernelTableKnob(host, state_dir)
