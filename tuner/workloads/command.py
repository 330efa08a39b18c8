"""The user's own benchmark as the holistic workload: a command line, a regular expression that
finds the metric in its output, and a timeout. This is how the gate runs on a real deployment
(e.g. a serving engine's benchmark script).

- The regex either has a `value` group (or one unnamed group) and the last match is the metric,
  or also a `size` group, and every match is one size's result (e.g. one line per context length:
  `ctx=(?P<size>\\d+) .* (?P<value>[\\d.]+) tok/s`), which feeds the per-size keep rule.
- `lower_is_better` (latency): values are inverted so the Measurement stays higher-is-better,
  and the unit becomes "1/<unit>".
- A candidate's runtime settings reach the command as `{name}` placeholders in its arguments
  (e.g. `--enforce-eager={cuda_graphs_off}` is the user's business) and as the JSON object in
  the environment variable METALTUNE_RUNTIME.
- The command runs in its own process group, killed whole at the timeout (WorkloadHang); a
  non-zero exit or no match is WorkloadFailed with the end of its output.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import string
import subprocess
import time
from typing import Any, Mapping, Optional, Sequence

from tuner.errors import BadInput, WorkloadFailed, WorkloadHang
from tuner.trial import Measurement
from tuner.workloads.base import Untuned, Workload, summarize

_TAIL = 2000


class _Keep(dict):  # str.format_map that leaves unknown {placeholders} alone
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class CommandWorkload(Untuned, Workload):
    """Tunable (Untuned) but for its runtime: whatever settings it is given reach the command
    as METALTUNE_RUNTIME; it names none of its own to search."""

    name = "command"

    def __init__(self, command: str | Sequence[str], metric_regex: str, timeout_s: float = 600.0,
                 unit: str = "", lower_is_better: bool = False, cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, metric: str = "metric"):
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise BadInput("command workload: the command is empty")
        try:
            self.regex = re.compile(metric_regex, re.MULTILINE)
        except re.error as e:
            raise BadInput(f"command workload: metric regex {metric_regex!r} is invalid: {e}") from None
        groups = self.regex.groupindex
        if "value" not in groups and self.regex.groups != 1:
            raise BadInput("command workload: the metric regex needs a group named 'value' "
                           f"(or exactly one group); got {metric_regex!r}")
        if timeout_s <= 0:
            raise BadInput(f"command workload: timeout must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.unit = unit
        self.lower_is_better = lower_is_better
        self.cwd = cwd
        self.env = dict(env or {})
        self.metric = metric
        self.runtime: dict[str, Any] = {}

    def configure(self, runtime: Mapping[str, Any]) -> None:
        self.runtime = dict(runtime or {})

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        return dict(runtime)  # the command's to read

    def runtime_settings(self) -> dict[str, Any]:
        return dict(self.runtime)

    def _argv(self) -> list[str]:
        vals = _Keep({k: (json.dumps(v) if isinstance(v, (list, dict)) else
                          str(v).lower() if isinstance(v, bool) else str(v))
                      for k, v in self.runtime.items()})
        return [string.Formatter().vformat(a, (), vals) if "{" in a else a for a in self.argv]

    def run_once(self, timeout_s: Optional[float] = None) -> tuple[dict[str, float], float]:
        """One run: ({size: value} (one key "value" without sizes), seconds)."""
        timeout = timeout_s or self.timeout_s
        env = {**os.environ, **self.env, "METALTUNE_RUNTIME": json.dumps(self.runtime, sort_keys=True)}
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(self._argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=self.cwd, env=env, start_new_session=True)
        except OSError as e:
            raise WorkloadFailed(f"command workload: cannot start {self.argv[0]!r}: {e}") from None
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise WorkloadHang(f"command workload: {self.argv[0]} exceeded its {timeout:g}s timeout") from None
        secs = time.monotonic() - t0
        if proc.returncode != 0:
            raise WorkloadFailed(f"command workload: {self.argv[0]} exited {proc.returncode}; "
                                 f"output ends: {out[-_TAIL:]!r}")
        return self.parse(out), secs

    def parse(self, out: str) -> dict[str, float]:
        matches = list(self.regex.finditer(out))
        if not matches:
            raise WorkloadFailed(f"command workload: metric regex {self.regex.pattern!r} matched "
                                 f"nothing; output ends: {out[-_TAIL:]!r}")
        vals: dict[str, float] = {}
        for m in (matches if "size" in self.regex.groupindex else matches[-1:]):
            raw = m.group("value") if "value" in self.regex.groupindex else m.group(1)
            try:
                v = float(raw)
            except (TypeError, ValueError):
                raise WorkloadFailed(f"command workload: metric {raw!r} is not a number") from None
            if self.lower_is_better:
                if v <= 0:
                    raise WorkloadFailed(f"command workload: lower-is-better metric {v} is not positive")
                v = 1.0 / v
            key = m.group("size") if "size" in self.regex.groupindex else "value"
            vals[str(key)] = v
        return vals

    def measure(self, repeats: int = 3, timeout_s: Optional[float] = None) -> Measurement:
        per: dict[str, list[float]] = {}
        secs = []
        for _ in range(max(1, repeats)):
            vals, s = self.run_once(timeout_s)
            secs.append(s)
            for k, v in vals.items():
                per.setdefault(k, []).append(v)
        unit = f"1/{self.unit}" if self.lower_is_better and self.unit else self.unit
        extra = {"command": self.argv, "seconds": secs, "runtime": self.runtime}
        if list(per) == ["value"]:
            m = summarize(self.metric, unit, per, extra)
            m.per_size = {}
            return m
        return summarize(self.metric, unit, per, extra)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def from_spec(spec: Any) -> CommandWorkload:
    """`cmd:<command line>` (tuner.workloads.factory), with --metric-regex."""
    if not spec.metric_regex:
        raise BadInput("--workload cmd:... needs --metric-regex")
    return CommandWorkload(spec.args, spec.metric_regex, timeout_s=spec.timeout_s)
