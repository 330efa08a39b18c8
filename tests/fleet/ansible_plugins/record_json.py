"""An Ansible stdout callback for the rollout tests: the whole run as one JSON document on stdout,
{"plays": [{"play": name, "tasks": [{"task": {"name"}, "hosts": {host: result}}]}], "stats": {...}}
(the shape of ansible.posix's json callback, which ansible-core does not ship). With `serial`,
every batch of hosts is a play of its own."""
from __future__ import annotations

import json

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "record_json"

    def __init__(self) -> None:
        super().__init__()
        self.plays: list[dict] = []

    def v2_playbook_on_play_start(self, play) -> None:
        self.plays.append({"play": play.get_name(), "tasks": []})

    def _task(self, task) -> dict:
        tasks = self.plays[-1]["tasks"]
        if not tasks or tasks[-1]["task"]["uuid"] != task._uuid:
            tasks.append({"task": {"name": task.get_name(), "uuid": task._uuid}, "hosts": {}})
        return tasks[-1]

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._task(task)

    def _record(self, result, **extra) -> None:
        entry = dict(result._result, **extra)
        self._task(result._task)["hosts"][result._host.get_name()] = entry

    def v2_runner_on_ok(self, result) -> None:
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._record(result, failed=True)

    def v2_runner_on_skipped(self, result) -> None:
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result) -> None:
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats) -> None:
        hosts = sorted(stats.processed)
        doc = {"plays": self.plays, "stats": {h: stats.summarize(h) for h in hosts}}
        self._display.display(json.dumps(doc, default=str))
