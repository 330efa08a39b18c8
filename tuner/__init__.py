"""metaltune: the daemon, the search loop, proposers, workloads, fleet, compare and reports."""
__version__ = "0.1.0"


def _check_safety() -> None:
    # a foreign `safety` (PyPI's scanner) would fail later with a confusing import error deep in
    # the journal or policy code: say so once, here
    from tuner.extras import running_cli, safety_clash

    why = safety_clash()
    if why is None:
        return
    if running_cli():
        raise SystemExit(f"metaltune: error: {why}")  # one line on stderr, exit 1
    raise ImportError(f"metaltune: {why}")


_check_safety()
