"""The line a library call prints about what it did (`patch`: which modules it replaced). Logged at
INFO for an application that configured logging (its handlers and levels decide); written to
stderr when nothing is configured, where Python's last-resort handler would show WARNING and above
only and the user of a plain script saw nothing after a patch that worked (its failure, a
UserWarning, did show)."""
from __future__ import annotations

import logging
import sys
from typing import Any


class Feedback:
    def __init__(self, name: str):
        self.log = logging.getLogger(name)

    def info(self, msg: str, *args: Any) -> None:
        if self.log.hasHandlers():  # logging is configured: the application's choice
            self.log.info(msg, *args)
        else:
            print(msg % args if args else msg, file=sys.stderr, flush=True)
