"""Settings: what every operation is run with (the common command-line options, or the daemon's
config): where the state lives and which host to open."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: set inside the daemon (and inherited by its children) so operations run in this process and
#: never call back into it (tuner.daemon.client.try_call; tuner.ops.probation.detach: a thread)
NO_DAEMON_ENV = "METALTUNE_NO_DAEMON"


@dataclass
class Settings:
    state_dir: Path
    backend: Optional[str]
    sim_root: Optional[Path]

    def host(self, dry_run: bool = False):
        from tuner.host import open_host

        return open_host(self.backend, self.sim_root, dry_run=dry_run)

    def ensure_state_dir(self) -> Path:
        from safety.securefs import secure_dir

        secure_dir(self.state_dir)  # trusted path, ours, 0700 (UnsafePath otherwise: exit 1)
        return self.state_dir
