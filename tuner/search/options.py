"""The options of each search operation, one pydantic model each: the CLI, the daemon's socket
and the daemon's search child all validate with it, so `{"budget": "many"}` or an unknown key is
the same bad input (exit 2, before any child starts) however it arrives.

Only checks that need nothing but the value live here (types, ranges, names from the
registries); what needs the host (a knob that exists, a workload that calls a family) stays with
the search that opens it.

Each field is also its command-line option (tuner/cli/model_options.py builds the commands from
these models): `description` is its help, `cli(...)` its flag, metavar and, where the command line
takes another form (a file, `4096x8192`), the name of the CLI's parser; a field without a flag
is not on the command line. FLAGS (field -> flag, for messages) is read from the same place."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import BadInput
from tuner.search import objective as _objectives  # plain pydantic, no torch
from tuner.validation import first_error

NONE = "none"  # --knob none / --family none: leave that kind out
AUTO = "auto"  # --suggest-table auto: the tables shipped for this GPU


def _proposer(name: str) -> str:
    from tuner import proposers

    if name not in proposers.names():
        raise ValueError(f"unknown proposer {name!r}; expected one of {', '.join(proposers.names())}")
    return name


def _family(name: str) -> str:
    from kernelsearch.families import NAMES

    if name not in NAMES:
        raise ValueError(f"unknown kernel family {name!r}; expected one of {', '.join(NAMES)}")
    return name


def shape_of(text: str, family: str) -> list[int]:
    """`4096x8192` as the family's shape dims, or ValueError saying what was expected."""
    from kernelsearch.families import get

    dims = get(_family(family)).shape_dims
    try:
        vals = [int(v) for v in text.lower().split("x")]
    except ValueError:
        vals = []
    if len(vals) != len(dims) or min(vals) < 1:
        raise ValueError(f"{text!r}: expected {'x'.join(dims)} as positive integers joined by "
                         f"'x' for {family}")
    return vals


def _alone(flag: str, values: Optional[list[str]], *words: str) -> None:
    if values and any(w in values for w in words) and len(values) > 1:
        raise ValueError(f"{flag}: {' and '.join(repr(w) for w in words)} cannot be combined "
                         "with other values")


def cli(flag: str, metavar: Optional[str] = None, parse: Optional[str] = None) -> dict[str, Any]:
    """A field's command line: its flag, metavar, and the CLI parser that turns what was typed
    into the field's value (tuner.cli.model_options.PARSERS; none: the value as typed)."""
    return {k: v for k, v in (("flag", flag), ("metavar", metavar), ("parse", parse)) if v}


def flag_of(field: Any) -> Optional[str]:
    extra = field.json_schema_extra
    return extra.get("flag") if isinstance(extra, dict) else None


_OBJECTIVE_HELP = "What to keep: " + _objectives.help_text() + "."
_WORKLOAD_HELP = ("sim | llama | deepseek | deepseek-v3.2 | hf:<config>[:layers=N] | "
                  "cmd:<command line>")
_METRIC_HELP = "For cmd: regex with one group, higher is better."


class CliOptions(BaseModel):
    """An operation's options that are also a command's: strict, frozen, FLAGS from the fields."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, hide_input_in_errors=True,
                              frozen=True)
    #: field -> the CLI flag a user typed it as (for messages); from each field's cli(...)
    FLAGS: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kw: Any) -> None:
        super().__pydantic_init_subclass__(**kw)
        cls.FLAGS = {n: f for n, fld in cls.model_fields.items() if (f := flag_of(fld))}

    @classmethod
    def parse(cls, op: str, args: dict[str, Any]) -> Any:
        """The options, or BadInput naming the operation, the field (and its flag) and what was
        expected; the value is never echoed (an argument may hold a secret)."""
        try:
            return cls.model_validate(args)
        except ValidationError as e:
            raise BadInput(f"{op}: {first_error(e, unknown='unknown argument', names=cls.FLAGS, top='', label='argument')}") from None

    def kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in type(self).model_fields}

    def sent(self) -> dict[str, Any]:
        """The arguments as the daemon's socket takes them: JSON values, the defaults left out
        (so a daemon without a newer field still answers a call that leaves it alone)."""
        return self.model_dump(mode="json", exclude_defaults=True)


class SearchOptions(CliOptions):

    budget: int = Field(20, ge=1, description="Trials to run.", json_schema_extra=cli("--budget", "N"))
    proposer: str = Field("random", description="The proposer (see this command's --help).",
                          json_schema_extra=cli("--proposer"))
    seed: int = Field(0, description="Seed for the proposer.", json_schema_extra=cli("--seed"))
    timeout_s: float = Field(600.0, ge=0.1, le=86400, description="Per measurement.",
                             json_schema_extra=cli("--timeout", "SECONDS"))
    #: what the keep rule keeps: a name in tuner.search.objective.OBJECTIVES
    objective: str = Field(
        "throughput", description=_OBJECTIVE_HELP, json_schema_extra=cli("--objective"))
    throughput_floor: Optional[float] = Field(
        None, ge=0.01, le=1, json_schema_extra=cli("--throughput-floor", "FRACTION"),
        description="--objective energy or power-capped: the least throughput kept, as a "
                    "fraction of the start's at every size (default 0.95).")
    power_budget_w: Optional[float] = Field(
        None, ge=1, le=100000, json_schema_extra=cli("--power-budget", "W"),
        description="--objective power-capped: the most mean board watts (and power limit) per "
                    "GPU.")

    @field_validator("proposer")
    @classmethod
    def _check_proposer(cls, v: str) -> str:
        return _proposer(v)

    @model_validator(mode="after")
    def _objective_args(self) -> "SearchOptions":
        _objectives.of(self)  # one line naming the flag: unknown, missing, or not this one's
        return self


class HostSearchOptions(SearchOptions):
    """`metaltune search host`."""
    budget: int = Field(30, ge=1, description="Trials to run.", json_schema_extra=cli("--budget", "N"))
    proposer: str = Field("optuna", description="The proposer (see this command's --help).",
                          json_schema_extra=cli("--proposer"))
    policy: Optional[str] = Field(
        None, json_schema_extra=cli("--policy", "FILE"),
        description="Policy YAML (default: the shipped safety/policies/default.yaml; not "
                    "/etc/metaltune/policy.yaml, which apply reads: pass it here): proposals stay inside "
                    "its bounds; its hourly change limits can stop the search before --budget "
                    "(said up front; see --wait-for-policy).")
    knobs: Optional[list[str]] = Field(None, description="Knob name or glob; repeatable.",
                                       json_schema_extra=cli("--knob"))
    #: the A/B pairs per trial (HostEvaluator's repeats): `--rounds` as on search mixed
    repeats: int = Field(3, ge=1, description="Interleaved A/B pairs per trial.",
                         json_schema_extra=cli("--rounds", "N"))
    workload: Optional[str] = Field(None, description=_WORKLOAD_HELP,
                                    json_schema_extra=cli("--workload"))
    metric_regex: Optional[str] = Field(None, description=_METRIC_HELP,
                                        json_schema_extra=cli("--metric-regex"))
    wait_for_policy: bool = Field(
        False, json_schema_extra=cli("--wait-for-policy"),
        description="When the policy's hourly change limit (max_changes_per_hour) is reached, "
                    "wait for the window instead of stopping the search there.")
    reboots: int = Field(0, ge=0, le=100, json_schema_extra=cli("--reboots", "N"),
                         description="Reboots the search may spend on boot-time knobs "
                                     "(boot.cmdline.*): one trial boot per candidate, gated after "
                                     "the boot (docs/boot-trials.md); 0 leaves them out.")


class MixedSearchOptions(HostSearchOptions):
    """`metaltune search mixed`."""
    budget: int = Field(20, ge=1, description="Trials to run.", json_schema_extra=cli("--budget", "N"))
    proposer: str = Field("random", description="The proposer (see this command's --help).",
                          json_schema_extra=cli("--proposer"))
    policy: Optional[str] = Field(
        None, json_schema_extra=cli("--policy", "FILE"),
        description="Policy YAML (default: the shipped safety/policies/default.yaml, not "
                    "/etc/metaltune/policy.yaml, which apply reads: pass that here; the daemon "
                    "passes its configured one).")
    knobs: Optional[list[str]] = Field(
        None, json_schema_extra=cli("--knob"),
        description="Knob name or glob; repeatable; 'none': no host knobs.")
    #: host searches only (search mixed has no --wait-for-policy)
    wait_for_policy: bool = Field(False, description="Not on search mixed.")
    families: Optional[list[str]] = Field(
        None, json_schema_extra=cli("--family"),
        description="Kernel family; repeatable (default: every family the workload calls); "
                    "'none': no kernels.")
    runtime: Optional[bool] = Field(
        None, json_schema_extra=cli("--runtime"),
        description="Search runtime settings (llama: CUDA graphs, fused projections, attention; "
                    "hf: compile, metaltune); default: on for llama and hf workloads.")
    rounds: int = Field(3, ge=1, description="Interleaved A/B pairs per trial.",
                        json_schema_extra=cli("--rounds", "N"))
    repeats: int = Field(3, ge=1, description="Repeats inside each measurement.",
                         json_schema_extra=cli("--repeats", "N"))
    max_choices: int = Field(6, ge=2, description="Values per kernel slot, torch included "
                             "(torch and one kernel at least).",
                             json_schema_extra=cli("--max-choices", "N"))
    table: Optional[str] = Field(None, description="Start from this dispatch table (JSON).",
                                 json_schema_extra=cli("--table", "FILE"))
    suggest: Optional[list[str]] = Field(
        None, json_schema_extra=cli("--suggest-table"),
        description="Tables whose choices become slot choices and the first candidate: 'auto' "
                    "(default: the ones shipped for this GPU), 'none', or JSON paths; repeatable.")
    workload: Optional[str] = Field(
        None, json_schema_extra=cli("--workload"),
        description="sim-llama (sim host default) | llama | deepseek | deepseek-v3.2 | "
                    "hf:<config>[:layers=N] | sim | cmd:<command line>")
    isolate: Optional[bool] = None  # not on the command line

    @field_validator("families")
    @classmethod
    def _families(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        _alone("--family", v, NONE)
        return [f if f == NONE else _family(f) for f in v] if v else v

    @model_validator(mode="after")
    def _alone_values(self) -> "MixedSearchOptions":
        _alone("--knob", self.knobs, NONE)
        _alone("--suggest-table", self.suggest, AUTO, NONE)
        if self.reboots:
            raise ValueError("--reboots: search mixed tries no boot-time settings; use "
                             "`search host --reboots N`")
        return self


class KernelSearchOptions(SearchOptions):
    """`metaltune search kernel` (a proposer over a family's configs; `llm`: kernel sources)."""
    family: str = Field(description="Kernel family (see `metaltune kernel families`).",
                        json_schema_extra=cli("--family"))
    budget: int = Field(20, ge=1, description="Measured configs per shape bucket (llm: trials).",
                        json_schema_extra=cli("--budget", "N"))
    proposer: str = Field("optuna", json_schema_extra=cli("--proposer"),
                          description="The proposer (see this command's --help); llm writes "
                                      "kernel sources.")
    device: Optional[Literal["cpu", "cuda"]] = Field(
        None, json_schema_extra=cli("--device"),
        description="cpu (Triton interpreter) or cuda; default: cuda if present.")
    shapes: Optional[list[list[int]]] = Field(
        None, json_schema_extra=cli("--shape", parse="shape"),
        description="Shape bucket, e.g. 65536x8192; repeatable (default: the family's search "
                    "shapes on a GPU, its largest tiny shape on the CPU).")
    table_out: Optional[str] = Field(None, description="Where to write the dispatch table (JSON).",
                                     json_schema_extra=cli("--table", "FILE"))
    timeout_s: float = Field(300.0, ge=0.1, le=86400, json_schema_extra=cli("--timeout", "SECONDS"),
                             description="Seconds before a candidate process is killed.")
    objective: str = Field(
        "throughput", json_schema_extra=cli("--objective"),
        description="throughput (least time a call) | energy (least joules a call, on a GPU) | "
                    "power-capped (least time a call at mean watts <= --power-budget, on a GPU); "
                    "decides each bucket and is recorded with the run and its table.")
    throughput_floor: Optional[float] = Field(
        None, ge=0.01, le=1, json_schema_extra=cli("--throughput-floor", "FRACTION"),
        description="--objective energy: recorded with the run; a kernel search keeps the "
                    "least joules a call per bucket with no throughput floor (the floor applies "
                    "in search host and mixed).")
    power_budget_w: Optional[float] = Field(
        None, ge=1, le=100000, json_schema_extra=cli("--power-budget", "W"),
        description="--objective power-capped: the most mean board watts.")
    isolate: bool = True  # not on the command line
    # --proposer llm only
    incumbent_table: Optional[str] = Field(
        None, json_schema_extra=cli("--incumbent", "FILE", parse="file"),
        description="llm: the dispatch table a source must beat (default: "
                    "STATE_DIR/kernels/active.json, the applied profile's, else torch).")
    ideas: Optional[list[str]] = Field(
        None, json_schema_extra=cli("--idea"),
        description="llm: a direction for the proposer, e.g. 'load the KV once per 32k'; "
                    "repeatable; recorded in every trial.")
    max_tokens: Optional[int] = Field(None, gt=0, json_schema_extra=cli("--max-tokens"),
                                      description="llm: stop once this many tokens were spent.")
    max_usd: Optional[float] = Field(None, gt=0, json_schema_extra=cli("--max-usd"),
                                     description="llm: stop once this many dollars were spent.")
    stop_after: Optional[int] = Field(
        None, gt=0, json_schema_extra=cli("--stop-after", "N"),
        description="llm: stop after N trials in a row that keep nothing.")
    model: Optional[str] = Field(
        None, json_schema_extra=cli("--model"),
        description="llm: model id (default METALTUNE_LLM_MODEL or the proposer's default).")
    gpu: Optional[str] = Field(
        None, json_schema_extra=cli("--gpu"),
        description="llm: GPU name for the hardware context (default: the device's own).")
    models: Optional[list[str]] = Field(
        None, json_schema_extra=cli("--model-context"),
        description="llm: model context page, e.g. llama-gqa; repeatable.")
    diagnosis: Optional[dict[str, Any]] = Field(
        None, json_schema_extra=cli("--diagnosis", "FILE", parse="diagnosis"),
        description="llm: where the model's time goes, the JSON of `metaltune diagnose --json`.")

    @field_validator("family")
    @classmethod
    def _check_family(cls, v: str) -> str:
        return _family(v)

    LLM_ONLY: ClassVar[tuple[str, ...]] = ("incumbent_table", "ideas", "max_tokens", "max_usd",
                                           "stop_after", "model", "gpu", "models", "diagnosis")

    @model_validator(mode="after")
    def _llm_only(self) -> "KernelSearchOptions":
        if self.proposer != "llm":
            given = [f for f in self.LLM_ONLY if getattr(self, f) not in (None, [])]
            if given:
                raise ValueError(f"{self.FLAGS[given[0]]}: only for --proposer llm")
        return self
