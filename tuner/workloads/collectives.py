"""Collective-communication settings of a multi-process workload, and the all-reduce it waits on.

`Collectives` holds the NCCL settings a search may change (algorithm, protocol, channels, buffer
size, P2P level, P2P on/off). They are environment variables of the processes a workload starts
(`env()`), never of the host or of this process: NCCL reads them when a communicator is created,
so a workload restarts its processes when they change. `NCCL_P2P_DISABLE=1` reproduces a box with
no peer-to-peer path (traffic through host memory), what a team without NVLink or with P2P
disabled by its PCIe topology gets.

NVLink multicast (NVLS) stays off in every process started here (`MULTICAST_OFF`), whatever the
settings say: on a shared GPU host a multicast object can take the host's GPUs out of service.

No pydantic, no torch at import: this module also runs on bare GPU machines.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional, Sequence

#: set in every process this project starts for collectives; never overridable
MULTICAST_OFF: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# NVLS and NVLSTree are the multicast algorithms: not offered
ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "PAT")
PROTOS = ("LL", "LL128", "Simple")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS on current releases
BUFFSIZE_RANGE = (1 << 16, 1 << 30)  # 64 KiB .. 1 GiB (NCCL's default is 4 MiB)

#: runtime keys (Candidate.runtime) -> Collectives fields
RUNTIME_KEYS: dict[str, str] = {
    "nccl_algo": "algo", "nccl_proto": "proto", "nccl_min_channels": "min_channels",
    "nccl_max_channels": "max_channels", "nccl_buffsize": "buffsize",
    "nccl_p2p_level": "p2p_level", "p2p": "p2p",
}


@dataclass(frozen=True)
class Collectives:
    """None: NCCL's own choice (its tuning model picks per message size)."""

    algo: Optional[str] = None  # NCCL_ALGO
    proto: Optional[str] = None  # NCCL_PROTO
    min_channels: Optional[int] = None  # NCCL_MIN_NCHANNELS
    max_channels: Optional[int] = None  # NCCL_MAX_NCHANNELS
    buffsize: Optional[int] = None  # NCCL_BUFFSIZE, bytes
    p2p_level: Optional[str] = None  # NCCL_P2P_LEVEL
    p2p: bool = True  # False: NCCL_P2P_DISABLE=1

    @classmethod
    def from_runtime(cls, runtime: Mapping[str, Any]) -> "Collectives":
        """The collective part of a runtime dict (other keys are ignored); ValueError naming the
        runtime key for a value NCCL would not take."""
        kw = {RUNTIME_KEYS[k]: v for k, v in runtime.items() if k in RUNTIME_KEYS}
        return cls(**kw).validate()

    def to_runtime(self) -> dict[str, Any]:
        inv = {v: k for k, v in RUNTIME_KEYS.items()}
        return {inv[f.name]: getattr(self, f.name) for f in fields(self)}

    def validate(self) -> "Collectives":
        def choice(key: str, value: Any, allowed: Sequence[str]) -> None:
            if value is not None and value not in allowed:
                raise ValueError(f"runtime.{key}: expected one of {', '.join(allowed)} or null, "
                                 f"got {value!r}")

        def count(key: str, value: Any, lo: int, hi: int) -> None:
            if value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"runtime.{key}: expected an integer from {lo} to {hi} or null, "
                                 f"got {value!r}")

        choice("nccl_algo", self.algo, ALGOS)
        choice("nccl_proto", self.proto, PROTOS)
        choice("nccl_p2p_level", self.p2p_level, P2P_LEVELS)
        count("nccl_min_channels", self.min_channels, 1, MAX_CHANNELS)
        count("nccl_max_channels", self.max_channels, 1, MAX_CHANNELS)
        count("nccl_buffsize", self.buffsize, *BUFFSIZE_RANGE)
        if (self.min_channels is not None and self.max_channels is not None
                and self.min_channels > self.max_channels):
            raise ValueError(f"runtime.nccl_min_channels {self.min_channels} is above "
                             f"runtime.nccl_max_channels {self.max_channels}")
        if not isinstance(self.p2p, bool):
            raise ValueError(f"runtime.p2p: expected true or false, got {self.p2p!r}")
        return self

    def env(self) -> dict[str, str]:
        """The environment of a worker process: these settings plus MULTICAST_OFF."""
        env: dict[str, str] = {}
        for name, value in (("NCCL_ALGO", self.algo), ("NCCL_PROTO", self.proto),
                            ("NCCL_MIN_NCHANNELS", self.min_channels),
                            ("NCCL_MAX_NCHANNELS", self.max_channels),
                            ("NCCL_BUFFSIZE", self.buffsize), ("NCCL_P2P_LEVEL", self.p2p_level)):
            if value is not None:
                env[name] = str(value)
        if not self.p2p:
            env["NCCL_P2P_DISABLE"] = "1"
        env.update(MULTICAST_OFF)
        return env

    def key(self) -> str:
        return repr(sorted(asdict(self).items()))
