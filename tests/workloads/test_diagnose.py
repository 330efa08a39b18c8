"""`metaltune diagnose` on the tiny Llama (CPU): the profile, the classes, the chart, the CLI."""
import json

import pytest

from tuner.workloads import diagnose as D

CEIL = {"flops_per_s": 5e10, "bytes_per_s": 2e10, "source": "test"}


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_classify_rules():
    assert D.classify(3.0, 0.01, 0.02, 10.0) == "launch"  # tiny and far from both ceilings
    assert D.classify(3.0, 0.0, 0.6, 10.0) == "memory"  # short but near the bandwidth ceiling
    assert D.classify(500.0, 0.7, 0.1, 10.0) == "compute"
    assert D.classify(500.0, 0.02, 0.3, 10.0) == "memory"
    assert D.classify(500.0, 0.01, 0.01, 10.0) == "launch"  # long but reaching nothing


def test_op_bytes_counts_inputs_and_output():
    # [8, 64] @ [64, 32]: read 512 + 2048, write 256 elements
    assert D.op_bytes("aten::mm", [[8, 64], [64, 32]], 2) == (512 + 2048 + 256) * 2
    assert D.op_bytes("aten::mul", [[4, 4], [4, 4]], 4) == (16 + 16 + 16) * 4
    assert D.op_bytes("aten::add", [[], []], 4) == 0.0


def test_decode_diagnosis_is_launch_dominated_and_prefill_has_compute():
    dec = D.diagnose("tiny", "decode", batch=2, ctx=32, steps=3, device="cpu", ceilings=CEIL)
    bc = dec["by_class_us_per_step"]
    assert set(bc) == {"compute", "memory", "launch", "gaps"}
    # a tiny decode step is all overhead: gaps between ops and tiny ops dominate
    assert (bc["launch"] + bc["gaps"]) / sum(bc.values()) > 0.5
    assert dec["timeline"]["kernels"] > 50 and 0 < dec["timeline"]["gap_frac"] < 1
    ops = dec["ops"]
    assert ops and all(r["class"] in D.CLASSES for r in ops)
    assert ops == sorted(ops, key=lambda r: -r["time_us_per_step"])
    assert any(r["op"] == "aten::mm" for r in ops)
    assert "launch-bound" in " ".join(dec["findings"])

    pre = D.diagnose("tiny", "prefill", batch=1, ctx=512, steps=2, device="cpu", ceilings=CEIL)
    mms = [r for r in pre["ops"] if r["op"] == "aten::mm"]
    assert mms and any(r["class"] == "compute" and r["tflops_per_s"] > 0 for r in mms)
    md = D.summary_markdown(pre)
    assert md.startswith("## Diagnosis") and "| aten::mm |" in md


def test_chart_is_a_png(tmp_path):
    d = D.diagnose("tiny", "decode", batch=1, ctx=16, steps=2, device="cpu", ceilings=CEIL)
    p = D.chart(d, tmp_path / "c" / "diag.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_cli_json_and_bad_input(tmp_path, capsys):
    from tuner.cli import main

    ceil = tmp_path / "ceil.json"
    ceil.write_text(json.dumps({"flops_per_s": 5e10, "bytes_per_s": 2e10}))
    rc = main(["--state-dir", str(tmp_path / "state"), "diagnose", "--json", "--steps", "2",
               "--ctx", "16", "--ceilings", str(ceil)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["model"] == "tiny" and out["ceilings"]["source"] == str(ceil)
    assert (tmp_path / "state" / "diagnose.png").is_file()
    for argv, msg in ((["diagnose", "--phase", "train"], "--phase"),
                      (["diagnose", "--model", "gpt5"], "--model"),
                      (["diagnose", "--ceilings", str(tmp_path / "none.json")], "--ceilings")):
        assert main(["--state-dir", str(tmp_path / "s2")] + argv) == 2
        assert msg in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"copy": 1}')
    assert main(["--state-dir", str(tmp_path / "s2"), "diagnose", "--ceilings", str(bad)]) == 2
    assert "expected flops_per_s" in capsys.readouterr().err
