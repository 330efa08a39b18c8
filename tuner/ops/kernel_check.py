"""Operation "kernel_check": judge a candidate kernel's *source text* (the CLI reads the file as
the invoking user; the daemon never opens a path a user names) exactly as `kernel check` always
has: static guard, correctness against the float64 reference, timing with the physical-floor
check, in the judge's child with a timeout, memory limits and the sandbox.

Its options model is also `metaltune kernel check`'s command line (tuner.cli.model_options):
the family, shape and device checks are the search options' own (tuner.search.options)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from tuner.errors import BadInput
from tuner.ops.registry import operation
from tuner.search.options import CliOptions, _family, cli, shape_of

#: a candidate's size as the CLI reads it (safety.inputs.MAX_BYTES); the guard bounds it again
MAX_SOURCE = 1 << 20


class KernelCheckOptions(CliOptions):
    """`metaltune kernel check`."""
    family: str = Field(description="Kernel family (see `metaltune kernel families`).",
                        json_schema_extra=cli("--family"))
    source: str = Field(max_length=MAX_SOURCE, json_schema_extra=cli("--candidate", "FILE.py",
                                                                     parse="candidate"),
                        description="Candidate module (.py) defining forward(...).")
    #: what the candidate is called in the verdict (the CLI: the file's path as typed)
    name: str = Field("<source>", max_length=4096)
    config: Optional[dict[str, Any]] = Field(
        None, json_schema_extra=cli("--config", "JSON", parse="kwargs_json"),
        description="JSON object of keyword arguments for forward.")
    device: Optional[Literal["cpu", "cuda"]] = Field(
        None, json_schema_extra=cli("--device"),
        description="cpu (Triton interpreter) or cuda; default: cuda if present.")
    dtypes: Optional[list[str]] = Field(None, description="Dtypes to check; repeatable.",
                                        json_schema_extra=cli("--dtype"))
    shapes: Optional[list[list[int]]] = Field(
        None, json_schema_extra=cli("--shape", parse="shape"),
        description="Shape to check and time at, e.g. 4096x8192; repeatable (default: timed at "
                    "the family's sweep on a GPU, a tiny shape on the CPU).")
    graph: bool = Field(False, json_schema_extra=cli("--graph"),
                        description="Also time inside a CUDA graph and check the replay's "
                                    "outputs (GPU).")
    timeout_s: float = Field(300.0, ge=0.1, le=86400, json_schema_extra=cli("--timeout", "SECONDS"),
                             description="Seconds before the candidate process is killed.")
    mem_limit_mb: int = Field(6144, ge=1, json_schema_extra=cli("--mem-limit-mb", "MB"),
                              description="Resident memory limit of the candidate process.")
    no_timing: bool = Field(False, description="Stop after correctness.",
                            json_schema_extra=cli("--no-timing"))

    @field_validator("family")
    @classmethod
    def _check_family(cls, v: str) -> str:
        return _family(v)

    @model_validator(mode="after")
    def _dtypes_shapes(self) -> "KernelCheckOptions":
        from kernelsearch.families import get

        fam = get(self.family)
        for d in self.dtypes or []:
            if d not in fam.dtypes:
                raise ValueError(f"--dtype {d!r}: {self.family} takes one of {', '.join(fam.dtypes)}")
        for s in self.shapes or []:  # from the socket as lists: the CLI's own check, again
            try:
                shape_of("x".join(map(str, s)), self.family)
            except ValueError as e:
                raise ValueError(f"--shape {e}") from None
        return self


@operation("kernel_check", options=KernelCheckOptions, reads=True)
def kernel_check(settings: Any, o: KernelCheckOptions) -> dict[str, Any]:
    """The verdict (Verdict.to_dict) with the family, the candidate's name and the device."""
    dev = o.device or _default_device()
    from kernelsearch.families import get, gluon, library
    from kernelsearch.harness import check, floor_for, guard
    from kernelsearch.harness.judge import guard_stage
    from kernelsearch.harness.limits import Limits

    # never a path: text without a newline that ends in .py would be read as a file by check()
    source = o.source if "\n" in o.source else o.source + "\n"
    v = None
    if guard.uses_gluon(source) and gluon.why_not_on(dev):
        # the guard first, as the judge runs it: a source that breaks it gets its verdict here
        v = guard_stage(source)
        if v is None:
            raise BadInput(f"--candidate {o.name}: a Gluon kernel runs only on an sm_90 GPU: "
                           f"{gluon.why_not_on(dev)}")
    fam = get(o.family)
    try:  # the sandbox's resource limits, from $KERNELSEARCH_SANDBOX_*
        limits = Limits.resolve(o.timeout_s)
    except ValueError as e:
        raise BadInput(str(e)) from None
    kw: dict[str, Any] = {}
    if o.shapes:  # checked (with the tiny shapes on the CPU), timed, and their largest dims covered
        shapes = [tuple(s) for s in o.shapes]
        kw["shapes"] = shapes + [tuple(s) for s in (fam.tiny_shapes if dev == "cpu" else [])]
        kw["timing_shapes"] = shapes
    lib = library.shipped(fam, source)
    if lib is not None:  # a shipped library wrapper: judged in the judge's library mode
        kw["library"] = lib.library
    if v is None:
        v = check(o.family, source, o.config, device=dev, timeout_s=o.timeout_s,
                  mem_limit_mb=o.mem_limit_mb, dtypes=list(o.dtypes) if o.dtypes else None,
                  timing=not o.no_timing, graph=o.graph, ceilings=floor_for(dev), limits=limits,
                  **kw)
    return dict(v.to_dict(), family=o.family, candidate=o.name,
                device=v.device or ("cpu-interpreter" if dev == "cpu" else dev))


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
