"""A profile records the serving engine it was measured with (provenance.engine): exported from a
serving config, validated when loaded, secret-looking variables masked."""
from __future__ import annotations

import pytest
import yaml

from tests.simhelpers import run_cli
from tuner import profiles
from tuner.errors import BadInput
from tuner.sim.hostinit import init_host


def test_export_records_the_engine_setup_and_the_profile_loads_it_back(capsys, tmp_path):
    h200 = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    out = tmp_path / "served.yaml"
    rc, _, err = run_cli(capsys, "--sim-root", str(h200), "profile", "export", "--from-host",
                         "--name", "served", "-o", str(out), "--engine",
                         "vllm:model=/models/llama,engine_python=/e/python,flags=--dtype bfloat16,"
                         "setting.max-num-seqs=32,setting.enforce-eager=true,env.HF_TOKEN=hf_abcdef123")
    assert rc == 0, err
    eng = yaml.safe_load(out.read_text())["provenance"]["engine"]
    assert eng["name"] == "vllm" and eng["model"] == "/models/llama"
    assert eng["settings"]["max-num-seqs"] == 32 and eng["settings"]["enforce-eager"] is True
    assert eng["flags"] == ["--dtype", "bfloat16", "--max-num-seqs", "32", "--enforce-eager"]
    assert eng["env"] == {"HF_TOKEN": "***"} and "hf_abcdef123" not in out.read_text()
    prof = profiles.load(str(out))
    assert prof.provenance.engine is not None and prof.provenance.engine.settings["max-num-seqs"] == 32


def test_a_profile_naming_an_engine_setting_the_registry_lacks_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nknobs: {}\nprovenance:\n  engine:\n    name: vllm\n"
                   "    settings: {max-seqs: 8}\n")
    with pytest.raises(BadInput, match="max-seqs"):
        profiles.load(str(bad))


def test_export_with_a_bad_engine_config_is_one_line_and_exit_2(capsys, tmp_path):
    h200 = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(h200), "profile", "export", "--from-host",
                           "--engine", "vllm:model=/m,engine_python=/p,setting.block-size=3")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "block-size" in err, err
