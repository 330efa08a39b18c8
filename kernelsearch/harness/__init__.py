"""The judge: static guard -> correctness -> timing, each stage with a failure code.

`check(family, source, config)` runs everything (correctness and timing in a child process by
default) and returns a `Verdict`. Codes are the project's stable reason codes (`CODES`); the
finer `rule` says which check fired."""
from kernelsearch.harness.verdict import CODES, Verdict  # noqa: F401


def check(*args, **kwargs):
    from kernelsearch.harness.runner import check as _check

    return _check(*args, **kwargs)


def floor_for(device: str):
    """The physical floor every caller judges with: the H200's measured ceilings on a GPU,
    none on the CPU interpreter (its wall time is no GPU time)."""
    if device != "cuda":
        return None
    from kernelsearch.harness.timing import H200

    return H200
