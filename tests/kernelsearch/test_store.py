"""kernelsearch.store: content-addressed kernel sources; the files it writes and reads, and what
dispatch does with a `src:<sha256>` entry whose source is missing, changed or unsafe."""
from __future__ import annotations

import json
import os
import stat

import pytest

from kernelsearch import dispatch
from kernelsearch.store import SourceStore, StoreError, digest
from kernelsearch.table import DispatchTable, Entry, TableError

SRC = '''import torch
import triton
import triton.language as tl


@triton.jit
def _scale(X, W, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < n_cols
    x = tl.load(X + row * n_cols + c, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(Y + row * n_cols + c, (x * r * w).to(Y.dtype.element_ty), mask=m)


def forward(x, weight, eps):
    n = x.shape[-1]
    x = x.contiguous()  # any view dispatch hands over (the judge sends them since issue 24)
    y = torch.empty_like(x)
    _scale[(x.numel() // n,)](x, weight.contiguous(), y, n, eps, BLOCK=1 << (n - 1).bit_length())
    return y
'''
ACCEPTED = {"verdict": "accepted", "stage": "timing", "code": "accepted", "checks": ["guard"]}


def table(sha: str, rows=(1, 64)) -> DispatchTable:
    return DispatchTable([Entry("rmsnorm", "float32", {"cols": 64}, {"rows": list(rows)},
                                f"src:{sha}", {})])


def call_rmsnorm(rows: int = 4):
    import torch

    from kernelsearch.families import get

    fam = get("rmsnorm")
    x, w, eps = fam.make_inputs((rows, 64), "float32", "cpu", torch.Generator().manual_seed(1))
    before = dispatch.stats()
    y = dispatch.rmsnorm(x, w, eps)
    after = dispatch.stats()
    err = float((y.double() - fam.reference(x, w, eps)).abs().max())
    return {k: after[k] - before[k] for k in after}, err


@pytest.fixture
def here_env(monkeypatch):
    """A stored record judged on this very environment: dispatch needs no re-judgement."""
    from kernelsearch.store import environment

    yield environment("cpu")
    dispatch.install(None)


def test_put_is_content_addressed_and_reads_back_verified(tmp_path, here_env):
    st = SourceStore(tmp_path / "src")
    rec = st.put("rmsnorm", SRC, {}, ACCEPTED, checked=[[4, 64]], timed=[[4, 64]], env=here_env)
    assert rec.sha256 == digest(SRC) and st.source(rec.sha256) == SRC
    assert st.record(rec.sha256).checked == [[4, 64]] and st.record(rec.sha256).env == here_env
    assert st.put("rmsnorm", SRC, {}, ACCEPTED, env={"gpu": "x"}).env == here_env  # first kept
    assert [r.sha256 for r in st.list()] == [rec.sha256]
    with pytest.raises(StoreError, match="only a source the judge accepted"):
        st.put("rmsnorm", SRC + "\n", {}, {"verdict": "rejected", "code": "incorrect"})
    assert not list((tmp_path / "src").glob(".*tmp"))  # no temporary file left behind
    if os.geteuid() == 0:  # root-only modes when the daemon writes them
        assert stat.S_IMODE((tmp_path / "src").stat().st_mode) == 0o700
        for p in (tmp_path / "src").iterdir():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_symlinks_are_never_followed(tmp_path, here_env):
    st = SourceStore(tmp_path / "src")
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=here_env).sha256
    outside = tmp_path / "outside.py"
    outside.write_text(SRC)
    py = tmp_path / "src" / f"{sha}.py"
    py.unlink()
    py.symlink_to(outside)
    with pytest.raises(StoreError, match="cannot open"):
        st.source(sha)
    # writing over a planted link replaces the link, never the file it points to
    other = SRC.replace("_scale", "_scale2")
    link = tmp_path / "src" / f"{digest(other)}.py"
    link.symlink_to(outside)
    st.put("rmsnorm", other, {}, ACCEPTED, env=here_env)
    assert outside.read_text() == SRC and not link.is_symlink()
    # a store whose root is a symlink is refused as a whole
    (tmp_path / "alias").symlink_to(tmp_path / "src")
    with pytest.raises(StoreError, match="symlink"):
        SourceStore(tmp_path / "alias").source(sha)


def test_table_names_sources_by_digest_only():
    with pytest.raises(TableError, match=r"src:<sha256>"):
        DispatchTable.from_dict({"entries": [{"family": "rmsnorm", "dtype": "float32",
                                              "variant": "src:../../etc/passwd", "config": {}}]})
    with pytest.raises(TableError, match="int\\|str\\|bool"):
        DispatchTable.from_dict({"entries": [{"family": "rmsnorm", "dtype": "float32",
                                              "variant": "src:" + "a" * 64,
                                              "config": {"x": [1]}}]})
    t = DispatchTable.from_dict(table("b" * 64).to_dict())
    assert t.sources() == ["b" * 64]


def test_dispatch_runs_a_verified_source_and_refuses_a_changed_one(tmp_path, here_env,
                                                                    monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    st = SourceStore(tmp_path / "src")
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=here_env).sha256
    dispatch.install(table(sha), store=st.root)
    assert dispatch.refused() == {}
    counts, err = call_rmsnorm()
    assert counts == {"kernel": 1, "fallback": 0} and err < 1e-5
    # the same table against a store whose file was edited after it was judged: torch runs
    st2 = SourceStore(tmp_path / "tampered")
    st2.put("rmsnorm", SRC, {}, ACCEPTED, env=here_env)
    (st2.root / f"{sha}.py").write_text(SRC.replace("0.0)", "1.0)"))
    dispatch.install(table(sha), store=st2.root)
    assert "digest mismatch" in dispatch.refused()[sha]
    assert "refused" in caplog.text and "digest mismatch" in caplog.text
    counts, err = call_rmsnorm()
    assert counts == {"kernel": 0, "fallback": 1} and err < 1e-5
    # a digest the store does not have: torch, and why
    dispatch.install(table("c" * 64), store=st.root)
    assert "not in the kernel store" in dispatch.refused()["c" * 64]
    assert call_rmsnorm()[0] == {"kernel": 0, "fallback": 1}


def test_dispatch_re_guards_and_re_judges_a_source_judged_elsewhere(tmp_path, here_env,
                                                                     monkeypatch, caplog):
    """Recorded on another GPU: judged again (correctness at the table's range ends) before
    first use; the verdict is recorded so the next process does not judge it again. A source
    that fails there, or breaks the guard, runs torch."""
    import logging

    caplog.set_level(logging.INFO, "kernelsearch.dispatch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    elsewhere = dict(here_env, gpu="NVIDIA H200", driver="580.159.04")
    st = SourceStore(tmp_path / "src")
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=elsewhere).sha256
    dispatch.install(table(sha, rows=(1, 9)), store=st.root)
    assert dispatch.refused() == {}
    assert "re-judging" in caplog.text and "NVIDIA H200" in caplog.text
    (j,) = st.record(sha).judgements
    assert j["verdict"] == "accepted" and j["env"] == here_env
    assert call_rmsnorm(rows=9)[0] == {"kernel": 1, "fallback": 0}
    # wrong (the weight is dropped): its claim of acceptance elsewhere does not carry over
    wrong = SRC.replace("(x * r * w)", "(x * r)")
    sha_w = st.put("rmsnorm", wrong, {}, ACCEPTED, env=elsewhere).sha256
    dispatch.install(table(sha_w, rows=(1, 9)), store=st.root)
    assert dispatch.refused()[sha_w].startswith("re-judged on cpu")
    assert "incorrect/tolerance" in dispatch.refused()[sha_w]
    assert call_rmsnorm(rows=9)[0] == {"kernel": 0, "fallback": 1}
    # a stored file that computes with torch is refused by the guard before anything runs
    cheat = SRC.replace("    return y\n", "    return torch.nn.functional.rms_norm(x, (n,), weight, eps)\n")
    sha_c = st.put("rmsnorm", cheat, {}, ACCEPTED, env=here_env).sha256
    dispatch.install(table(sha_c), store=st.root)
    assert "static guard" in dispatch.refused()[sha_c] and "torch_compute" in dispatch.refused()[sha_c]


def test_a_record_for_another_family_is_refused(tmp_path, here_env, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    st = SourceStore(tmp_path / "src")
    sha = st.put("softmax", SRC, {}, ACCEPTED, env=here_env).sha256
    dispatch.install(table(sha), store=st.root)
    assert "judged for softmax" in dispatch.refused()[sha]
    rec = json.loads((st.root / f"{sha}.json").read_text())
    assert rec["family"] == "softmax"
