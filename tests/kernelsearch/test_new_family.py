"""A new kernel family is its package and its name in `kernelsearch.families.NAMES`, nothing
else: the judge draws it random shapes from what it declares, its edges become boundary shapes,
and every command line and search option that names families names it too."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from tests.simhelpers import run_cli


@pytest.fixture
def toy(monkeypatch):
    """`toy`: rmsnorm's declarations under a name nothing in the code knows."""
    from kernelsearch import families

    fam = dataclasses.replace(families.get("rmsnorm"), name="toy")
    mod = types.ModuleType("kernelsearch.families.toy")
    mod.FAMILY = fam
    monkeypatch.setitem(sys.modules, "kernelsearch.families.toy", mod)
    monkeypatch.setattr(families, "NAMES", families.NAMES + ("toy",))
    return fam


def test_a_new_family_gets_random_shapes_from_its_declarations(toy):
    from kernelsearch.harness.random_shapes import random_shapes

    for big, shapes in ((False, toy.tiny_shapes), (True, toy.search_shapes)):
        drawn = random_shapes(toy, 20, big=big)
        assert len(drawn) == 20 and len({tuple(s) for s in drawn}) > 1
        top = [max(s[i] for s in shapes) for i in range(len(toy.shape_dims))]
        assert all(len(s) == len(toy.shape_dims) and all(1 <= v <= t for v, t in zip(s, top))
                   for s in drawn), drawn


def test_a_new_family_gets_its_edges_checked(toy):
    shapes, _ = toy.boundary_shapes(device="cuda")
    cols = toy.shape_dims.index("cols")
    assert {e + 1 for e in toy.edges["cols"]} <= {s[cols] for s in shapes}


@pytest.mark.usefixtures("toy")
def test_a_new_family_is_named_in_the_help_and_the_search_options(capsys, monkeypatch):
    from tuner import ops
    from tuner.ops.args import validate

    monkeypatch.setenv("COLUMNS", "400")
    for cmd in (["search", "kernel", "--help"], ["kernel", "check", "--help"]):
        rc, out, _ = run_cli(capsys, *cmd)
        assert rc == 0 and "|toy" in out, (cmd, out)
    assert validate("search_mixed", ops.get("search_mixed"), {"families": ["toy"]})
    assert validate("search_kernel", ops.get("search_kernel"), {"family": "toy"})
