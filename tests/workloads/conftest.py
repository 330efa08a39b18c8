import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    """Timing tests share 2 cores with other work: one intra-op thread keeps repeats steady."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
