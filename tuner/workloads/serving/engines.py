"""Engine settings a search may change, declared per engine with their domains (`--workload
vllm:...` searches them as `runtime.<name>`). Each setting reaches the server as a flag or an
environment variable; DEFAULT (the engine's own default) passes nothing, so the incumbent's
command line is the user's own. Adding an engine: one `Engine(...)` and one `ENGINES` line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

DEFAULT = "default"  # the setting's flag or variable is not passed: the engine decides


@dataclass(frozen=True)
class Setting:
    name: str
    domain: tuple[Any, ...]  # the values a search tries; DEFAULT where the engine's own is one
    flag: Optional[str] = None  # `--flag VALUE` (a bool: `--flag` when True)
    env: Optional[str] = None  # else an environment variable of the server
    default: Any = DEFAULT  # what the incumbent has when the user sets nothing

    def check(self, value: Any) -> Any:
        """`value` coerced to this setting's type (inline args are strings); ValueError outside."""
        for v in self.domain:
            if v == value or str(v).lower() == str(value).lower():
                return v
        raise ValueError(f"setting {self.name}: expected one of {list(self.domain)}, got {value!r}")

    def argv(self, value: Any) -> list[str]:
        if self.flag is None or value in (DEFAULT, self.default) or value is False:
            return []
        return [self.flag] if value is True else [self.flag, str(value)]


@dataclass(frozen=True)
class Engine:
    name: str
    settings: tuple[Setting, ...]

    def by_name(self) -> dict[str, Setting]:
        return {s.name: s for s in self.settings}

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        known = self.by_name()
        out = {}
        for k, v in values.items():
            if k not in known:
                raise ValueError(f"setting {k}: {self.name} has no such setting "
                                 f"(expected one of {sorted(known)})")
            out[k] = known[k].check(v)
        return out

    def defaults(self) -> dict[str, Any]:
        return {s.name: s.default for s in self.settings}

    def dims(self) -> dict[str, list[Any]]:
        return {s.name: list(s.domain) for s in self.settings}

    def with_domains(self, domains: Mapping[str, Sequence[Any]]) -> "Engine":
        """This engine with some settings' domains replaced (a user's wider or narrower list);
        ValueError for a name it lacks or an empty domain."""
        from dataclasses import replace

        known = self.by_name()
        for k, dom in domains.items():
            if k not in known:
                raise ValueError(f"domains: {self.name} has no setting {k!r}")
            if not dom:
                raise ValueError(f"domains.{k}: expected a non-empty list")
        return replace(self, settings=tuple(replace(s, domain=tuple(domains[s.name]))
                                            if s.name in domains else s for s in self.settings))

    def launch(self, values: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
        """(server flags, server environment) for settings `values` (names validated)."""
        flags: list[str] = []
        env: dict[str, str] = {}
        for s in self.settings:
            v = values.get(s.name, s.default)
            if s.env is not None and v not in (DEFAULT, s.default):
                env[s.env] = str(v)
            flags += s.argv(v)
        return flags, env


VLLM = Engine("vllm", (
    Setting("max-num-seqs", (DEFAULT, 8, 32, 128, 256), flag="--max-num-seqs"),
    Setting("max-num-batched-tokens", (DEFAULT, 512, 2048, 8192), flag="--max-num-batched-tokens"),
    Setting("block-size", (DEFAULT, 16, 32, 64, 128), flag="--block-size"),
    Setting("kv-cache-dtype", ("auto", "bfloat16", "fp8"), flag="--kv-cache-dtype", default="auto"),
    # vLLM 0.32 takes the compilation level as --optimization-level 0..3 (-O2 its default)
    Setting("optimization-level", (0, 1, 2, 3), flag="--optimization-level", default=2),
    Setting("enforce-eager", (False, True), flag="--enforce-eager", default=False),
    # the KV-cache space: bytes as a flag (any build), GiB in the CPU build's variable
    Setting("kv-cache-memory-bytes", (DEFAULT, 1 << 30, 2 << 30, 4 << 30), flag="--kv-cache-memory-bytes"),
    # the CPU build's KV-cache space (GiB) and OpenMP thread binding
    Setting("VLLM_CPU_KVCACHE_SPACE", (DEFAULT, 1, 2, 4), env="VLLM_CPU_KVCACHE_SPACE"),
    Setting("VLLM_CPU_OMP_THREADS_BIND", (DEFAULT, "auto", "nobind"), env="VLLM_CPU_OMP_THREADS_BIND"),
))

ENGINES: dict[str, Engine] = {"vllm": VLLM}


def engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {name!r}") from None


def searchable(eng: Engine, only: Optional[Sequence[str]] = None) -> dict[str, list[Any]]:
    """The dims a search walks: all of the engine's, or those named."""
    dims = eng.dims()
    return dims if not only else {k: dims[k] for k in only}
