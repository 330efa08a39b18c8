from __future__ import annotations

import pytest

from safety import Journal, Policy
from tests.safety import _knobs

BASE = {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": 0, "cpu.governor_level": 0,
        "bios.Profile": 0}


@pytest.fixture
def fhost(tmp_path):
    """A folder of file-backed knobs: (root, knobs)."""
    root = tmp_path / "host"
    _knobs.init(root, BASE)
    return root, _knobs.make(str(root))


@pytest.fixture
def state(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def journal(state):
    return Journal(state / "journal.db")


@pytest.fixture
def policy():
    return Policy.from_dict({
        "rules": [
            {"knob": "gpu0.power_limit_w", "range": [200, 700], "max_step": 300},
            {"knob": "gpu0.locked_clocks_mhz"},
            {"knob": "bios.*", "allow_reboot_effect": True},
        ],
        "forbidden": ["cpu.*"],
    }, source="test-policy.yaml")
