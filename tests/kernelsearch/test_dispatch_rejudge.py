"""dispatch.install re-judges a stored source judged on another host at the ranges its table
entries claim: their ends, midpoints and octave points (the judge's `ranges`), not the ends
alone."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelsearch import dispatch
from kernelsearch.store import SourceStore, environment
from kernelsearch.table import DispatchTable, Entry

REDTEAM = Path(__file__).resolve().parent / "redteam"
ACCEPTED = {"verdict": "accepted", "stage": "timing", "code": "accepted", "checks": ["guard"]}


@pytest.fixture
def elsewhere(monkeypatch):
    """A record judged on an H200: this CPU host must judge the source again before use."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield dict(environment("cpu"), gpu="NVIDIA H200", driver="580.159.04")
    dispatch.install(None)


def interior_table(sha: str) -> DispatchTable:
    # right at 8 and 600 rows, wrong at 300-500 (tests/kernelsearch/redteam/range_interior.py)
    return DispatchTable([Entry("softmax", "float32", {"cols": 17}, {"rows": [8, 600]},
                                f"src:{sha}", {})])


def test_rejudge_passes_each_configs_ranges_to_the_judge():
    sha = "a" * 64
    t = DispatchTable([
        Entry("softmax", "float32", {"cols": 17}, {"rows": [8, 600]}, f"src:{sha}", {"B": 1}),
        Entry("softmax", "float16", {"cols": 17}, {"rows": [8, 600]}, f"src:{sha}", {"B": 1}),
        Entry("softmax", "float32", {"cols": 64}, {"rows": [1, 4]}, f"src:{sha}", {"B": 2}),
        Entry("softmax", "float32", {"cols": 99}, {"rows": [1, 4]}, "row",
              {"ROWS": 1, "num_warps": 1}),
    ])
    assert dispatch._rejudge_ranges(t, sha, {"B": 1}) == [
        {"match": {"cols": 17}, "ranges": {"rows": [8, 600]}}]  # one range, two dtypes
    assert dispatch._rejudge_ranges(t, sha, {"B": 2}) == [
        {"match": {"cols": 64}, "ranges": {"rows": [1, 4]}}]
    assert dispatch._rejudge_shapes(t, sha, {"B": 1}) == [(8, 17), (600, 17)]
    assert len(dispatch._rejudge_ranges(t, sha)) == 2  # every config's


def test_install_refuses_a_source_wrong_only_inside_a_range(tmp_path, elsewhere, monkeypatch):
    """Right at both range ends (the judge told only those accepts it), wrong for 300-500 rows:
    the re-judge's interior points refuse it and its entries run torch."""
    src = (REDTEAM / "range_interior.py").read_text()
    st = SourceStore(tmp_path / "src")
    sha = st.put("softmax", src, {}, ACCEPTED, env=elsewhere).sha256
    dispatch.install(interior_table(sha), store=st.root)
    why = dispatch.refused()[sha]
    assert why.startswith("re-judged on cpu") and "incorrect/" in why, why
    assert "unwritten" in why or "tolerance" in why, why
    assert not st.record(sha).judgements  # nothing recorded as judged here
    import torch

    from kernelsearch.families import get

    x = get("softmax").make_inputs((362, 17), "float32", "cpu", torch.Generator().manual_seed(3))
    before = dispatch.stats()
    y = dispatch.softmax(*x)
    assert dispatch.stats()["fallback"] - before["fallback"] == 1
    assert torch.allclose(y.double(), torch.softmax(x[0].double(), -1), atol=1e-6)


def test_the_range_ends_alone_no_longer_let_it_in(tmp_path, elsewhere, monkeypatch):
    """The same install with the re-judge told the ends only (what dispatch did before the
    interior points, when this install accepted it): the judge's own draws now cover every
    power-of-two band up to each checked shape (kernelsearch.harness.range_draws), so the band
    of 300-500 rows is checked and the source refused all the same."""
    monkeypatch.setattr(dispatch, "_rejudge_ranges", lambda table, sha, config=None: [])
    src = (REDTEAM / "range_interior.py").read_text()
    st = SourceStore(tmp_path / "src")
    sha = st.put("softmax", src, {}, ACCEPTED, env=elsewhere).sha256
    dispatch.install(interior_table(sha), store=st.root)
    why = dispatch.refused()[sha]
    assert why.startswith("re-judged on cpu") and "incorrect" in why, why
    assert not st.record(sha).judgements  # nothing recorded as judged here
