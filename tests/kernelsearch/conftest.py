"""Kernel tests run Triton's interpreter on the CPU: set before any kernel module is loaded."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

REDTEAM = Path(__file__).parent / "redteam"


@pytest.fixture
def redteam():
    return lambda name: REDTEAM / f"{name}.py"
