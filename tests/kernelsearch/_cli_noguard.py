"""`python tests/kernelsearch/_cli_noguard.py ARGS...`: the real `metaltune` CLI with the static
guard switched off (in the CLI and in the judge's child), so a test reaches the layer behind it:
the child's environment, network and uid. Used by tests only; never installed."""
import functools
import sys

import kernelsearch.harness as harness
from kernelsearch.harness import runner

harness.check = functools.partial(runner.check, static_guard=False)

from tuner.cli import main  # noqa: E402

sys.exit(main())
