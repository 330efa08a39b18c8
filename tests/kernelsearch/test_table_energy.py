"""Dispatch-table entries carry energy beside time (energy_j, mean_w, energy_vs_library), and
under the "energy" objective an entry gives way to the library where the library is the
lower-energy choice, as speedup_vs_library / LIBRARY_MARGIN does for time; "throughput" is
unchanged. The numbers are the H200's (docs/readings/h200-mla-energy-2026-12-02.md, sparse
8 x 128k): the table's kernel 12% faster than FlashMLA at twice its energy a call."""
from __future__ import annotations

import dataclasses
import json

import pytest

from kernelsearch.table import DispatchTable, TableError, plan
from tests.kernelsearch.test_libraries import (MLA_DIMS, _fresh, _row, _tma_entry,  # noqa: F401
                                               flash_mla)

FAST_HUNGRY = dict(speedup_vs_library=57.5 / 50.6, energy_j=25.2e-3, mean_w=523.0,
                   energy_vs_library=12.6 / 25.2)


def _entry(**kw):
    return dataclasses.replace(_tma_entry(100, 200), **kw)


def test_energy_fields_round_trip_through_dict_and_json():
    t = DispatchTable([_entry(**FAST_HUNGRY)], meta={"objective": "energy"})
    back = DispatchTable.from_dict(json.loads(json.dumps(t.to_dict())))
    e = back.entries[0]
    assert (e.energy_j, e.mean_w, e.energy_vs_library) == (25.2e-3, 523.0, 0.5)
    assert back.meta["objective"] == "energy"
    old = DispatchTable.from_dict({"entries": [dict(t.to_dict()["entries"][0], energy_j=None,
                                                    mean_w=None, energy_vs_library=None)]})
    assert old.entries[0].energy_j is None  # a table from before energy loads as it was


@pytest.mark.parametrize("bad", [-1.0, "25mJ", True])
def test_a_malformed_energy_field_is_refused_by_name(bad):
    d = {"entries": [dict(DispatchTable([_entry()]).to_dict()["entries"][0], energy_j=bad)]}
    with pytest.raises(TableError, match=r"entries\[0\]\.energy_j: expected a non-negative"):
        DispatchTable.from_dict(d)


def test_energy_objective_gives_way_to_the_lower_energy_library(flash_mla):
    t = DispatchTable([_entry(**FAST_HUNGRY)])
    # throughput: 14% faster than the library, so the entry runs (unchanged behaviour)
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS)[0::2] == ("table", "splitkv")
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS, objective="throughput")[0::2] == \
        ("table", "splitkv")
    # energy: twice the library's joules a call, so the library runs
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS, objective="energy") == \
        ("library", None, "flashmla")
    # the table's own objective is the default (a kept energy table replays as it was kept)
    t.meta["objective"] = "energy"
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS)[0] == "library"
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS, objective="throughput")[0] == "table"


def test_energy_objective_keeps_an_entry_that_saves_energy(flash_mla):
    frugal = _entry(speedup_vs_library=0.9, energy_vs_library=1.3)  # slower, 30% less energy
    near = _entry(speedup_vs_library=1.3, energy_vs_library=1.01)  # in the margin: gives way
    assert DispatchTable([frugal]).choose("mla_decode", "bfloat16", MLA_DIMS)[0] == "library"
    assert DispatchTable([frugal]).choose("mla_decode", "bfloat16", MLA_DIMS,
                                          objective="energy")[0::2] == ("table", "splitkv")
    assert DispatchTable([near]).choose("mla_decode", "bfloat16", MLA_DIMS,
                                        objective="energy")[0] == "library"


def test_energy_objective_without_an_energy_measurement_uses_time(flash_mla):
    slow = _entry(speedup_vs_library=0.8)
    fast = _entry(speedup_vs_library=1.2)
    assert DispatchTable([slow]).choose("mla_decode", "bfloat16", MLA_DIMS,
                                        objective="energy")[0] == "library"
    assert DispatchTable([fast]).choose("mla_decode", "bfloat16", MLA_DIMS,
                                        objective="energy")[0] == "table"


def test_energy_objective_without_the_library_runs_the_entry():
    t = DispatchTable([_entry(**FAST_HUNGRY)])
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS, objective="energy")[0::2] == \
        ("table", "splitkv")


def _erow(L, t_us, lib_us, mj, lib_mj, w=500.0, lib_w=250.0):
    return dict(_row(L, t_us, lib_us), energy_j=mj * 1e-3, mean_w=w,
                library_energy_j=lib_mj * 1e-3, library_mean_w=lib_w)


def test_plan_records_energy_and_under_energy_keeps_the_lower_energy_library():
    rows = [_erow(1024, 50.6, 57.5, 25.2, 12.6),  # faster, twice the energy
            _erow(16384, 50, 100, 10, 40)]  # faster and less energy
    tp = {e.measured[0]["shape"][2]: e for e in plan("mla_decode", rows)}
    assert tp[1024].variant == "splitkv"  # throughput: the faster kernel, its energy recorded
    assert tp[1024].energy_j == pytest.approx(25.2e-3) and tp[1024].mean_w == 500.0
    assert tp[1024].energy_vs_library == pytest.approx(0.5)
    assert tp[1024].measured[0]["energy_j"] == pytest.approx(25.2e-3)
    en = {e.measured[0]["shape"][2]: e for e in plan("mla_decode", rows, objective="energy")}
    assert en[1024].variant == "flashmla" and en[1024].config == {}
    assert en[1024].energy_j == pytest.approx(12.6e-3) and en[1024].mean_w == 250.0
    assert en[1024].energy_vs_library == pytest.approx(1.0)
    assert en[16384].variant == "splitkv" and en[16384].energy_vs_library == pytest.approx(4.0)
