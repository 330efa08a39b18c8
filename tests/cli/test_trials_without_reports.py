"""`trials --stats` without the `reports` extra (issue 33, item 16): the table and the JSON need no
matplotlib, only the PNG chart does. The child runs with a sitecustomize that makes matplotlib
unimportable, as in an install without `metaltune[reports]` (tests/test_packaging.py's blocker)."""
from __future__ import annotations

import json

from tests.simhelpers import REPO, SimCli
from tests.test_packaging import BLOCKER


def test_trials_stats_work_without_matplotlib_and_only_chart_needs_it(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("search", "host", "--budget", "2", "--proposer", "random")
    assert r.returncode == 0, r.stderr
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(mods={"matplotlib"}))
    without = {"PYTHONPATH": f"{site}:{REPO}"}

    r = mt("trials", "--stats", "--json", env=without)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["trials"] == 2 and res["proposers"]["random"]["trials"] == 2
    assert res["chart"] is None and "metaltune[reports]" in res["chart_skipped"]
    assert not (mt.state / "reports").exists()

    r = mt("trials", "--stats", env=without)
    assert r.returncode == 0, r.stderr
    assert "random" in r.stdout and "kept" in r.stdout and "pip install 'metaltune[reports]'" in r.stdout

    # a chart asked for by name needs the extra: one line naming it
    png = tmp_path / "stats.png"
    r = mt("trials", "--stats", "--chart", str(png), env=without)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'metaltune[reports]'" in r.stderr and not png.exists()

    # with matplotlib the chart is drawn as before
    r = mt("trials", "--stats", "--json", "--chart", str(png))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chart"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
