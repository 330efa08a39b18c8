"""Trial store: every evaluated candidate, in SQLite under the state dir.

One row per trial with the candidate, gate results, raw measurements, verdict and reason code as
JSON columns; `runs` groups trials of one search. synchronous=FULL: a trial that was reported is
never lost to a crash.
"""
from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

from tuner.trial import Trial

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, started_at REAL NOT NULL, meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs(id),
  number INTEGER NOT NULL,
  verdict TEXT NOT NULL,
  reason TEXT NOT NULL,
  objective REAL,
  started_at REAL NOT NULL,
  body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_run ON trials(run_id, number);
CREATE INDEX IF NOT EXISTS trials_verdict ON trials(verdict);
"""


class TrialStore:
    def __init__(self, path: Path | str, readonly: bool = False):
        """`readonly`: for `metaltune trials` (works on a read-only or full state dir); the
        store must exist."""
        self.path = Path(path)
        if readonly:
            from safety.journal import connect_readonly

            self._db = connect_readonly(self.path)
            try:
                self._db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                # a WAL database needs its -shm file, which a full disk cannot take: read the
                # main file alone (what the last checkpoint left), without locks
                self._db.close()
                self._db = connect_readonly(self.path, immutable=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def in_state_dir(cls, state_dir: Path | str) -> "TrialStore":
        return cls(Path(state_dir) / "trials.db")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "TrialStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def new_run(self, kind: str, meta: Optional[dict[str, Any]] = None) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._db.execute(
            "INSERT INTO runs(id, kind, started_at, meta) VALUES (?,?,?,?)",
            (run_id, kind, time.time(), json.dumps(meta or {}, default=str)),
        )
        return run_id

    def add(self, trial: Trial) -> int:
        if not trial.energy:
            trial.energy = energy_of(trial)
        cur = self._db.execute(
            "INSERT INTO trials(run_id, number, verdict, reason, objective, started_at, body)"
            " VALUES (?,?,?,?,?,?,?)",
            (trial.run_id, trial.number, trial.verdict, trial.reason, trial.objective,
             trial.started_at, trial.model_dump_json(exclude={"id"})),
        )
        trial.id = int(cur.lastrowid or 0)
        return trial.id

    def list(
        self, run_id: Optional[str] = None, limit: Optional[int] = None,
        verdict: Optional[str] = None,
    ) -> list[Trial]:
        q, args = "SELECT id, body FROM trials WHERE 1=1", []
        if run_id:
            q += " AND run_id = ?"
            args.append(run_id)
        if verdict:
            q += " AND verdict = ?"
            args.append(verdict)
        q += " ORDER BY id DESC"
        if limit:
            q += " LIMIT ?"
            args.append(int(limit))
        out = []
        for row_id, body in self._db.execute(q, args):
            t = Trial.model_validate_json(body)
            t.id = row_id
            out.append(t)
        return out[::-1]

    def runs(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT r.id, r.kind, r.started_at, r.meta, count(t.id) FROM runs r"
            " LEFT JOIN trials t ON t.run_id = r.id GROUP BY r.id ORDER BY r.started_at"
        )
        return [
            {"id": i, "kind": k, "started_at": s, "meta": json.loads(m), "trials": n}
            for i, k, s, m, n in rows
        ]

    def __iter__(self) -> Iterator[Trial]:
        return iter(self.list())


def energy_of(trial: Trial) -> dict[str, Any]:
    """The candidate side's tokens/J and mean board watts per size (medians over its repeats),
    from what the evaluator recorded: the host rule's pooled `candidate`, or the per-size
    rule's `holistic.candidate` repeats. Empty when no energy was measured."""
    from tuner.search.keep import pool
    from tuner.trial import Measurement

    ms = trial.measurements or {}
    raw = ms.get("candidate") or (ms.get("holistic") or {}).get("candidate") or []
    try:
        runs = [Measurement.model_validate(m) for m in (raw if isinstance(raw, list) else [raw])]
    except ValueError:
        return {}
    m = pool(runs)
    if m is None or not m.per_size_tok_per_j:
        return {}
    return {"tok_per_j": {k: round(v, 6) for k, v in m.per_size_tok_per_j.items()},
            "watts": {k: round(v, 1) for k, v in m.per_size_watts.items()},
            "source": m.energy_source}
