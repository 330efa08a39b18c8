"""Every JSON file an operator hands metaltune goes through one loader (safety.inputs.load_json)
with the YAML/TOML loader's rules: a regular file only (a FIFO is refused, never waited on;
/dev/zero never read), at most its size cap, strict UTF-8, bounded nesting, no NaN or infinity,
and wrong types named by field. Through the real CLI, one option at a time: exit 2, one line,
nothing started. (Before: tracebacks, a hang on a FIFO, memory eaten by /dev/zero, NaN kept.)"""
from __future__ import annotations

import os
import threading

import pytest

from tests.simhelpers import run_cli
from tuner.sim.hostinit import init_host


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return init_host(tmp_path_factory.mktemp("sim") / "h200", "h200", seed=1, os_tree=False)


def _file(tmp_path, kind: str, good_type_error: str):
    p = tmp_path / f"in-{kind}.json"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "zero":
        return "/dev/zero", "is a character device"
    elif kind == "deep":
        p.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "utf8":
        p.write_bytes(b'{"device": "\xff\xfe"}')
    elif kind == "nan":
        p.write_text('{"flops_per_s": NaN, "bytes_per_s": 1, "entries": [], "meta": {"x": NaN}}')
    elif kind == "type":
        p.write_text(good_type_error)
    return str(p), {"fifo": "is a FIFO, expected a regular file", "deep": "nested more than 64 levels",
                    "utf8": "not UTF-8 text", "nan": "NaN is not a finite number"}.get(kind)


# option -> (the command line around FILE, a wrong-typed document, what names its field)
OPTIONS = {
    "--kernels": (lambda f, sim: ["profile", "export", "h200", "--kernels", f],
                  '{"entries": [], "meta": 5}', "meta: expected a mapping"),
    "--table": (lambda f, sim: ["--backend", "sim", "--sim-root", str(sim), "search", "mixed",
                                "--knob", "none", "--family", "rmsnorm", "--table", f],
                '{"entries": [{"family": "rmsnorm", "dtype": "float32", "variant": "row", '
                '"speedup": "fast"}]}', "entries[0].speedup: expected a number"),
    "--suggest-table": (lambda f, sim: ["--backend", "sim", "--sim-root", str(sim), "search",
                                        "mixed", "--knob", "none", "--family", "rmsnorm",
                                        "--suggest-table", f],
                        '{"entries": [{"family": "rmsnorm", "dtype": "float32", '
                        '"variant": "row", "measured": 3}]}', "entries[0].measured: expected a list"),
    "--ceilings": (lambda f, sim: ["diagnose", "--device", "cpu", "--no-chart", "--ceilings", f],
                   '{"flops_per_s": "fast", "bytes_per_s": 1}', "field flops_per_s: expected a positive number"),
}


def _run_bounded(capsys, args, fifo=None):
    """main() in a thread: a loader that blocks on the FIFO fails the test instead of hanging it."""
    box = {}
    t = threading.Thread(target=lambda: box.update(rc=run_cli(capsys, *args)), daemon=True)
    t.start()
    t.join(120)
    if t.is_alive():
        if fifo:  # release the blocked reader
            with open(fifo, "w"):
                pass
        t.join(10)
        pytest.fail(f"metaltune {' '.join(args)} blocked on its input")
    return box["rc"]


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep", "utf8", "nan", "type"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_bad_json_input_is_exit_2_in_one_line(capsys, tmp_path, sim, option, kind):
    argv, wrong, field = OPTIONS[option]
    f, expect = _file(tmp_path, kind, wrong)
    rc, out, err = _run_bounded(capsys, ["--state-dir", str(tmp_path / "state"), *argv(f, sim)],
                                fifo=f if kind == "fifo" else None)
    assert rc == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert option in err and (expect or field) in err, err
    assert not (tmp_path / "state" / "kernels").exists()  # nothing written


@pytest.mark.parametrize("config, expect", [
    ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
    ('{"BLOCK": NaN}', "NaN is not a finite number"),
    ('{"BLOCK": 1e999}', "not a finite number"),
    ("[64]", "expected a JSON object of keyword arguments, got list"),
    ('{"BLOCK": 64, "BLOCK": 128}', "duplicate key 'BLOCK'"),
])
def test_kernel_check_config_is_one_json_loader_too(capsys, tmp_path, config, expect):
    cand = tmp_path / "cand.py"
    cand.write_text("import triton\n\ndef forward(x):\n    return x\n")
    rc, out, err = run_cli(capsys, "--state-dir", str(tmp_path / "state"), "kernel", "check",
                           "--family", "softmax", "--candidate", str(cand), "--config", config)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "--config" in err and expect in err, err


@pytest.mark.parametrize("kind", ["utf8", "fifo"])
def test_kernel_check_refuses_a_candidate_that_is_not_utf8_text_in_one_line(capsys, tmp_path, kind):
    cand = tmp_path / "cand.py"
    if kind == "fifo":
        os.mkfifo(cand)
    else:
        cand.write_bytes(b"import triton\n# \xff\xfe latin-1 comment\ndef forward(x):\n    return x\n")
    rc, out, err = _run_bounded(capsys, ["--state-dir", str(tmp_path / "state"), "kernel", "check",
                                         "--family", "softmax", "--candidate", str(cand),
                                         "--no-timing"], fifo=str(cand) if kind == "fifo" else None)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "--candidate" in err
    assert ("not UTF-8 text (byte 0xff at line 2)" if kind == "utf8" else "is a FIFO") in err, err
