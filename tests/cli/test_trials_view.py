"""`metaltune trials` as a user reads it after an energy search: the gain names its metric,
tokens/s stands beside tokens/J (also in a window of refused trials only), the table fits the
terminal (`--wide`: every column in full), `--csv` has the same columns, and `--chart FILE`
draws tokens/s against tokens/J."""
from __future__ import annotations

import csv
import io
import json

import pytest

from tests.simhelpers import SimCli


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    mt = SimCli(tmp_path_factory.mktemp("trials"), "h200")
    r = mt("search", "host", "--objective", "energy", "--budget", "12")
    assert r.returncode == 0, r.stderr
    trials = json.loads(mt("trials", "--json").stdout)["trials"]
    return mt, trials


def test_header_names_the_gain_metric_and_tokens_per_s_is_beside_tokens_per_j(searched):
    mt, trials = searched
    r = mt("trials", "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(rows[0]) == ["#", "run", "verdict", "reason", "gain (tok/J)", "tok/s", "tok/J",
                             "W", "candidate"]
    by_number = {t["number"]: t for t in trials}
    measured = [row for row in rows if row["tok/s"]]
    assert measured, rows
    for row in measured:
        t = by_number[int(row["#"])]
        assert float(row["tok/s"]) == pytest.approx(t["measurements"]["candidate"]["value"], rel=1e-3)
        assert float(row["tok/J"]) == pytest.approx(t["energy"]["tok_per_j"]["all"], rel=1e-2)
    # a candidate's knob names whole in CSV (a script copies them)
    assert all("gpu0.power_limit_w=" in row["candidate"] for row in rows)


def test_the_table_fits_the_terminal_and_wide_shows_everything(searched):
    mt, trials = searched
    r = mt("trials", env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "gain (tok/J)" in r.stdout and "tok/s" in r.stdout and "…" in r.stdout
    wide = mt("trials", "--wide", env={"COLUMNS": "100"})
    assert wide.returncode == 0, wide.stderr
    assert max(len(line) for line in wide.stdout.splitlines()) > 100
    knobs = trials[0]["candidate"]["knobs"]
    whole = ", ".join(f"{k}={v}" for k, v in knobs.items())
    assert whole in wide.stdout


def test_a_window_of_refused_trials_still_shows_the_measured_columns(searched):
    mt, trials = searched
    unmeasured = [t for t in trials if not t["energy"]]
    assert unmeasured, "the seeded search is expected to leave a trial without a measurement"
    t = unmeasured[0]
    r = mt("trials", "--verdict", t["verdict"], "--csv")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split(",")
    assert "tok/s" in header and "tok/J" in header


def test_chart_of_tokens_per_s_against_tokens_per_j(searched, tmp_path):
    mt, trials = searched
    png = tmp_path / "tradeoff.png"
    r = mt("trials", "--chart", str(png), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["chart"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    assert len(res["points"]) == sum(1 for t in trials if t["energy"])
    assert len(res["starts"]) == 1 and res["starts"][0]["tok_per_s"] > 0  # the run's start
    bad = mt("trials", "--chart", str(png), "--run", "no-such-run")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
