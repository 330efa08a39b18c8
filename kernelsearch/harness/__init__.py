"""The judge: static guard -> correctness -> timing, each stage with a failure code.

`check(family, source, config)` runs everything (correctness and timing in a child process by
default) and returns a `Verdict`. Codes are the project's stable reason codes (`CODES`); the
finer `rule` says which check fired."""
from kernelsearch.harness.verdict import CODES, Verdict  # noqa: F401


def check(*args, **kwargs):
    from kernelsearch.harness.runner import check as _check

    return _check(*args, **kwargs)
