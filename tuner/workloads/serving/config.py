"""The serving workload's configuration: a TOML or YAML file (`vllm:serve.toml`) or inline
`key=value` pairs (`vllm:model=DIR,concurrency=1+4,flags=--dtype bfloat16`), one pydantic model.
Bad input is one BadInput line naming the source, the field and what was expected."""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import BadInput

PYTHON_ENV = "METALTUNE_VLLM_PYTHON"  # the engine environment's interpreter, when the config names none


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str = "vllm"
    model: Optional[str] = None  # a model dir or name, as `vllm serve` takes it (attach: the served name)
    engine_python: Optional[str] = None  # default: $METALTUNE_VLLM_PYTHON
    flags: list[str] = Field(default_factory=list)  # server flags the user always passes
    env: dict[str, str] = Field(default_factory=dict)  # server environment (e.g. VLLM_CPU_KVCACHE_SPACE)
    #: the engine settings a search starts from (engines.py names them); absent: the engine's default
    settings: dict[str, Any] = Field(default_factory=dict)
    #: per engine setting, the values a search tries instead of the registry's
    domains: dict[str, list[Any]] = Field(default_factory=dict)
    #: the engine settings a search walks (`runtime.<name>`); empty: all the engine declares
    search: list[str] = Field(default_factory=list)
    input_len: int = Field(128, gt=0)
    output_len: int = Field(64, gt=0)
    num_prompts: int = Field(64, gt=0)  # per ladder level and repeat
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16])  # each level one size
    ttft_ms: float = Field(2000.0, gt=0)  # SLOs: goodput counts requests meeting both
    tpot_ms: float = Field(200.0, gt=0)
    seed: int = 0
    start_timeout_s: float = Field(300.0, gt=0)
    bench_timeout_s: float = Field(600.0, gt=0)  # one ladder level
    attach: Optional[str] = None  # URL of a running endpoint: measured, never started or stopped

    @field_validator("concurrency")
    @classmethod
    def _ladder(cls, v: list[int]) -> list[int]:
        if not v or any(c <= 0 for c in v) or len(set(v)) != len(v):
            raise ValueError("a non-empty list of distinct positive integers")
        return v

    @field_validator("attach")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _whole(self) -> "ServingConfig":
        if not self.model:
            raise ValueError("model: a model dir or name is required")
        if self.attach is None and not self.python():
            raise ValueError(f"engine_python: required (or set ${PYTHON_ENV})")
        eng = self.settings_engine()
        self.settings = eng.validate(self.settings)  # ValueError naming the setting
        for k, v in {**eng.defaults(), **self.settings}.items():  # the incumbent is in the space
            if k in self.domains and v not in eng.by_name()[k].domain:
                raise ValueError(f"domains.{k}: expected a list holding the start value {v!r}")
        unknown = [k for k in self.search if k not in eng.by_name()]
        if unknown:
            raise ValueError(f"search: {self.engine} has no setting {unknown[0]!r} "
                             f"(expected some of {sorted(eng.by_name())})")
        return self

    def settings_engine(self) -> Any:
        """The engine's settings registry entry, with this config's domains."""
        from tuner.workloads.serving.engines import engine

        return engine(self.engine).with_domains(self.domains)

    def python(self) -> Optional[str]:
        return self.engine_python or os.environ.get(PYTHON_ENV) or None

    def sizes(self) -> list[str]:
        return [f"c={c}" for c in self.concurrency]


_LISTS = {"concurrency", "search"}


def _inline(text: str) -> dict[str, Any]:
    """`k=v,k=v`: lists joined by '+', `flags` split as a shell would, `env.NAME=V`,
    `setting.NAME=V` and `domains.NAME=V+V` into their tables."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise BadInput(f"--workload vllm: expected key=value, got {part!r}")
        if key == "flags":
            out["flags"] = shlex.split(val)
        elif key in _LISTS:
            out[key] = [v for v in val.split("+") if v]
        elif key.startswith("domains."):
            out.setdefault("domains", {})[key[len("domains."):]] = [_scalar(v) for v in val.split("+")]
        elif key.startswith(("env.", "setting.")):
            table, _, name = key.partition(".")
            out.setdefault("env" if table == "env" else "settings", {})[name] = val
        else:
            out[key] = val
    return out


def _scalar(text: str) -> Any:
    """An inline domain value as TOML would type it: int, float, bool, else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def _file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # tomllib.TOMLDecodeError, yaml.YAMLError: one line either way
        raise BadInput(f"{path}: not valid {path.suffix[1:].upper()}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a table of settings, got {type(data).__name__}")
    return data


def load(args: str) -> ServingConfig:
    """The config from `--workload vllm:ARGS`: a .toml/.yaml/.yml file, else inline pairs."""
    if not args.strip():
        raise BadInput("--workload vllm: expected vllm:<config.toml|yaml> or vllm:model=DIR[,key=value...]")
    path = Path(args)
    is_file = path.suffix in (".toml", ".yaml", ".yml") and "=" not in args
    source = str(path) if is_file else "--workload vllm"
    data = _file(path) if is_file else _inline(args)
    try:
        return ServingConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")  # a whole-config check names its field
        raise BadInput(f"{source}: {loc + ': ' if loc else ''}{msg}") from None
