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


# The fast tier (`pytest -m "not slow and not peers"`, README) leaves out the tests listed in
# tests/slow_tests.txt: measured, not guessed (the file says how). Listed here rather than as
# decorators so the list can be re-measured and rewritten in one place.
_SLOW_LIST = __import__("pathlib").Path(__file__).with_name("slow_tests.txt")


def pytest_collection_modifyitems(config, items):
    slow = {line.split("#", 1)[0].strip() for line in _SLOW_LIST.read_text().splitlines()} - {""}
    for item in items:
        if item.nodeid in slow or item.nodeid.split("[", 1)[0] in slow:
            item.add_marker(pytest.mark.slow)
