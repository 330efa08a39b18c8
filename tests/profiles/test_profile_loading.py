"""Profile files: include inheritance and precedence, match rules, and bad input (malformed YAML,
unknown field or knob, include cycle, duplicate key): one error naming file, line and field."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner import profiles
from tuner.errors import BadInput


def write(d: Path, name: str, text: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def test_every_shipped_profile_loads_and_has_comments():
    names = {p["name"]: p for p in profiles.list_profiles()}
    for want in ("h200", "h100", "a100", "l40s", "rtx4090", "common", "datacenter"):
        assert want in names and "error" not in names[want], names.get(want)
    for p in profiles.SHIPPED_DIR.glob("*.yaml"):
        text = p.read_text()
        pr = profiles.load(p.stem)
        own = [k for k in pr.knobs if k.file.endswith(p.name)]
        lines = text.splitlines()
        for ks in own:  # each value has a comment saying why, on the lines just above it
            above = [ln.strip() for ln in lines[max(0, ks.line - 4):ks.line - 1]]
            assert any(a.startswith("#") for a in above) or "#" in lines[ks.line - 1], \
                f"{p.name}:{ks.line} {ks.key} has no comment"


def test_include_chain_and_child_wins(tmp_path):
    write(tmp_path, "base", "knobs:\n  cpu.governor: powersave\n  os.numa_balancing: 1\n")
    write(tmp_path, "mid", "include: [base]\nknobs:\n  os.numa_balancing: 0\n")
    write(tmp_path, "leaf", "include: [mid]\nmatch: {gpu_name: ['NVIDIA H200*']}\n"
          "knobs:\n  cpu.governor: performance\n  sysctl.vm.swappiness: 10\n")
    p = profiles.load(str(tmp_path / "leaf.yaml"))
    assert p.values() == {"os.numa_balancing": 0, "cpu.governor": "performance",
                          "sysctl.vm.swappiness": 10}
    gov = next(k for k in p.knobs if k.key == "cpu.governor")
    assert gov.file.endswith("leaf.yaml") and gov.line == 4
    assert [Path(c).stem for c in p.chain] == ["base", "mid", "leaf"]


def test_exact_name_beats_pattern_and_child_pattern_beats_parent():
    prof = profiles.Profile(name="x", path="x.yaml", knobs=[
        profiles.KnobSetting(key="gpu0.power_limit_w", value=500, file="a"),
        profiles.KnobSetting(key="gpu*.power_limit_w", value=600, file="b"),
        profiles.KnobSetting(key="sysctl.vm.*", value=1, file="a"),
    ])
    knobs = {"gpu0.power_limit_w": object(), "gpu1.power_limit_w": object(),
             "sysctl.vm.swappiness": object()}
    res, unmatched = profiles.resolve(prof, knobs)
    assert res["gpu0.power_limit_w"].value == 500
    assert res["gpu1.power_limit_w"].value == 600
    assert unmatched == []


def test_role_selectors_pick_gpus_or_nics():
    gpu = SimpleNamespace(dev=SimpleNamespace(kind="gpu"))
    nic = SimpleNamespace(dev=SimpleNamespace(kind="nic"))
    knobs = {"pcie.0000:17:00.0.max_read_request_bytes": gpu,
             "pcie.0000:18:00.0.max_read_request_bytes": nic}
    prof = profiles.Profile(name="x", path="x", knobs=[
        profiles.KnobSetting(key="pcie.@nics.max_read_request_bytes", value=4096, file="f")])
    res, _ = profiles.resolve(prof, knobs)
    assert list(res) == ["pcie.0000:18:00.0.max_read_request_bytes"]


@pytest.mark.parametrize("text, expect", [
    ("knobs:\n  cpu.governor: [performance\n", r"bad\.yaml: not valid YAML at line \d+"),
    ("knobs:\n  cpu.govenor: performance\n", r"bad\.yaml:2: field knobs\.cpu\.govenor: not a knob .*did you mean 'cpu\.governor'"),
    ("knobs:\n  sysctl.kernel.panic: 1\n", r"bad\.yaml:2: field knobs\.sysctl\.kernel\.panic: .*allowed list"),
    ("knobs:\n  sysctl.kernel.numa_balancing: 0\n", r"os\.numa_balancing"),
    ("nobs:\n  cpu.governor: performance\n", r"bad\.yaml:1: field nobs: not a profile field"),
    ("match:\n  driver: 'newest'\n", r"bad\.yaml:1: field match\.driver: expected a version range"),
    ("match:\n  virtualization: cloud\n", r"field match\.virtualization"),
    ("knobs:\n  os.numa_balancing: 0\n  os.numa_balancing: 1\n", r"bad\.yaml:3: field knobs\.os\.numa_balancing: duplicate key"),
    ("- just\n- a list\n", r"bad\.yaml: expected a mapping"),
    ("include: [nowhere]\n", r"bad\.yaml:1: field include: profile 'nowhere' not found"),
    ("knobs:\n  sysctl.vm.max_map_count: {more_than: 5}\n",
     r"bad\.yaml:2: field knobs\.sysctl\.vm\.max_map_count: expected a value, `default`, \{at_least: N\}"),
])
def test_bad_profiles_name_file_line_and_field(tmp_path, text, expect):
    write(tmp_path, "bad", text)
    with pytest.raises(BadInput, match=expect):
        profiles.load(str(tmp_path / "bad.yaml"))


def test_include_cycle_is_reported_with_the_chain(tmp_path):
    write(tmp_path, "a", "include: [b]\n")
    write(tmp_path, "b", "include: [c]\n")
    write(tmp_path, "c", "include: [a]\n")
    with pytest.raises(BadInput, match=r"c\.yaml: field include: include cycle .*a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml"):
        profiles.load(str(tmp_path / "a.yaml"))
    write(tmp_path, "self", "include: [self]\n")
    with pytest.raises(BadInput, match="include cycle"):
        profiles.load(str(tmp_path / "self.yaml"))


def test_a_diamond_is_not_a_cycle(tmp_path):
    write(tmp_path, "root", "knobs: {os.numa_balancing: 0}\n")
    write(tmp_path, "l", "include: [root]\n")
    write(tmp_path, "r", "include: [root]\n")
    write(tmp_path, "top", "include: [l, r]\n")
    assert profiles.load(str(tmp_path / "top.yaml")).values() == {"os.numa_balancing": 0}


def _hw(names, driver="580.159.04", vm=False):
    return SimpleNamespace(gpus=[SimpleNamespace(name=n) for n in names], driver_version=driver,
                           virtualization=SimpleNamespace(is_vm=vm, evidence=["cpuinfo hypervisor flag"] if vm else []))


def test_match_rules():
    h200 = profiles.load("h200")
    assert profiles.match_host(h200, _hw(["NVIDIA H200"])) == []
    assert profiles.match_host(h200, _hw(["NVIDIA H200", "NVIDIA H200"], vm=True)) == []
    assert "host has ['NVIDIA H100 80GB HBM3']" in profiles.match_host(h200, _hw(["NVIDIA H100 80GB HBM3"]))[0]
    assert "match.driver" in profiles.match_host(h200, _hw(["NVIDIA H200"], driver="535.104.05"))[0]
    rtx = profiles.load("rtx4090")
    assert profiles.match_host(rtx, _hw(["NVIDIA GeForce RTX 4090"])) == []
    assert "bare_metal" in profiles.match_host(rtx, _hw(["NVIDIA GeForce RTX 4090"], vm=True))[0]


@pytest.mark.parametrize("spec, version, ok", [
    (">=550", "580.159.04", True), (">=550, <560", "580.159.04", False),
    ("==580", "580.159.04", True), ("!=580", "580.159.04", False), ("<535.104", "535.54.03", True),
])
def test_driver_ranges(spec, version, ok):
    v = profiles._ver(version)
    assert all(profiles._cmp(v, op, w) for op, w in profiles.parse_range(spec)) is ok


def test_provenance_names_the_objective_and_a_bad_one_is_bad_input(tmp_path):
    pr = profiles.load("h200-efficient")
    assert pr.provenance.objective == "energy" and pr.provenance.source == "sim-measured"
    assert pr.provenance.throughput_floor == 0.95
    write(tmp_path, "bad", "knobs: {}\nprovenance: {objective: speed}\n")
    with pytest.raises(BadInput, match=r"bad\.yaml.*provenance\.objective"):
        profiles.load(str(tmp_path / "bad.yaml"))
