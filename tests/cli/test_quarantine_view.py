"""`quarantine list` fits a 100-column terminal however many knobs a quarantined change set
holds (the shipped h200 profile's 33 knobs were one 1,155-column line): one knob=value a line,
each whole so it can be copied into a policy; `--csv` keeps one row a change set."""
from __future__ import annotations

import csv
import io
import json

from safety import Journal
from tests.simhelpers import SimCli

KNOBS = {f"sysctl.net.ipv4.tcp_setting_number_{i:02d}": i * 1000 for i in range(33)}


def test_quarantine_list_fits_100_columns_with_every_knob_whole(tmp_path):
    mt = SimCli(tmp_path, "h200")
    assert mt("status").returncode == 0  # the journal and its anchor, as a user's first command
    j = Journal(mt.state / "journal.db")
    j.quarantine(json.dumps({"knobs": KNOBS}), "fatal incident during probation: Xid 79 "
                 "(GPU has fallen off the bus) on gpu0 while the change set was in probation")
    j.close()
    r = mt("quarantine", "list", env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 100, r.stdout
    for k, v in KNOBS.items():
        assert f"{k}={v}" in r.stdout
    r = mt("quarantine", "list", "--csv")
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert len(rows) == 2 and rows[1][4].count(", ") == len(KNOBS) - 1
