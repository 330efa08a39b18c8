"""Every table has --csv (the README's promise): `profile list` and `compare` print a header row
and one row per profile / metric, the same rows the table shows."""
from __future__ import annotations

import csv
import io
import json

from tests.simhelpers import SimCli


def test_profile_list_csv_has_the_tables_rows(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("profile", "list", "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(rows[0]) == ["name", "matches", "values", "includes", "knobs", "description"]
    listed = {p["name"]: p for p in json.loads(mt("profile", "list", "--json").stdout)["profiles"]}
    assert {row["name"] for row in rows} == set(listed)
    h200 = next(row for row in rows if row["name"] == "h200")
    assert h200["matches"] == "yes" and h200["knobs"] == str(listed["h200"]["knobs"])


def test_compare_csv_has_one_row_per_metric_and_a_ratio_column(tmp_path):
    a, b = SimCli(tmp_path / "a", "h200"), SimCli(tmp_path / "b", "h200", "--vm")
    r = a("compare", f"sim://{a.root}", f"sim://{b.root}", "--quick", "--repeats", "2",
          "--seed", "1", "--only", "device_copy_tbps,launch_graph_us", "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == ["metric", "unit", f"sim://{a.root}", f"sim://{b.root}",
                       f"ratio sim://{b.root} [CI]"]
    assert [row[0] for row in rows[1:]] == ["device_copy_tbps", "launch_graph_us"]
    assert all(len(row) == 5 and row[2] and row[4] for row in rows[1:])
