import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every workload test runs on one intra-op thread (tests/conftest.py says why)."""
    yield
