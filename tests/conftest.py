"""Fixtures shared across the test packages."""
from __future__ import annotations

import pytest


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """A private state dir and run dir for in-process CLI calls; no backend from the caller's env."""
    monkeypatch.setenv("METALTUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("METALTUNE_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("METALTUNE_BACKEND", raising=False)


@pytest.fixture
def one_thread():
    """Timing tests share 2 cores with other work: one intra-op thread keeps repeats steady."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
