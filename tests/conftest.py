"""Fixtures shared across the test packages."""
from __future__ import annotations

import pytest


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """A private state dir and run dir for in-process CLI calls; no backend from the caller's env."""
    monkeypatch.setenv("METALTUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("METALTUNE_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("METALTUNE_BACKEND", raising=False)
