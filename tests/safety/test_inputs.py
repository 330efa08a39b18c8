"""safety.inputs, the one loader of YAML and TOML inputs: its limits at their edges, what it still
accepts (anchors, merge keys, dates that exist), and that the daemon config and bmc.yaml read
through it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from safety import inputs
from safety.errors import InputError, PolicyError
from safety.policy import load as load_policy

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_of_exactly_the_limit_is_read_one_byte_more_is_refused(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_bytes(b"a: 1\n" + b"#" * (inputs.MAX_BYTES - 6) + b"\n")
    assert inputs.load_yaml(f) == {"a": 1}
    f.write_bytes(f.read_bytes() + b"\n")
    with pytest.raises(InputError, match=r"f\.yaml: 1048577 bytes, more than the 1 MiB"):
        inputs.load_yaml(f)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    box: list[BaseException] = []
    t = threading.Thread(target=lambda: box.append(pytest.raises(InputError, inputs.load_yaml, fifo).value),
                         daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():   # never leave the thread blocked: a writer releases it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert "is a FIFO, expected a regular file" in str(box[0])


@pytest.mark.parametrize("path, what", [("/dev/zero", "a character device"), ("/", "a directory")])
def test_devices_and_directories_are_refused(path, what):
    with pytest.raises(InputError, match=f"is {what}, expected a regular file"):
        inputs.load_yaml(path)


def test_a_symlink_is_followed_unless_refused(tmp_path):
    (tmp_path / "real.yaml").write_text("a: 1\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    assert inputs.load_yaml(tmp_path / "link.yaml") == {"a": 1}
    with pytest.raises(InputError, match="is a symbolic link"):
        inputs.load_yaml(tmp_path / "link.yaml", follow_symlinks=False)


@pytest.mark.parametrize("text, data", [
    ("base: &b {x: 1, y: 2}\nchild: {<<: *b, y: 3}\n", {"base": {"x": 1, "y": 2}, "child": {"x": 1, "y": 3}}),
    ("d: 2024-02-29\nf: 1.5\ne: 1e3\ni: 0x10\n", None),
    ("", None),
])
def test_ordinary_yaml_still_loads(text, data):
    got = inputs.parse_yaml(text, "x.yaml")
    if data is not None:
        assert got == data
    elif text:
        assert str(got["d"]) == "2024-02-29" and got["f"] == 1.5 and got["i"] == 16
    else:
        assert got is None


@pytest.mark.parametrize("text, expect", [
    ("a: " + "[" * 65 + "]" * 65 + "\n", "nested more than 64 levels deep"),
    ("".join(f"{'  ' * i}k:\n" for i in range(70)), "nested more than 64 levels deep"),
    ("a: &a x\nb: [" + ", ".join(["*a"] * (inputs.MAX_ALIASES + 1)) + "]\n", f"more than {inputs.MAX_ALIASES} aliases"),
    ("a: &a [*a]\n", "refers to a node that contains it"),
    ("a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 100) + "]\n",
     f"more than {inputs.MAX_NODES} nodes"),
    ("x: !!python/name:os.system\n", "python/name"),
    ("x: 2023-02-29\n", "line 1, column 4: '2023-02-29' cannot be built"),
    ("x: [1, 2, -.inf]\n", "line 1, column 11: '-.inf' is not a finite number"),
    ("x: 1e999\ny: .NaN\n", "'.NaN' is not a finite number"),
    ("x: " + "1" * 5000 + "\n", "cannot be built"),
    ("a: 1\n---\nb: 2\n", "but found another document"),
])
def test_yaml_limits_and_construction_errors_are_one_line(text, expect):
    with pytest.raises(InputError) as e:
        inputs.parse_yaml(text, "x.yaml")
    msg = str(e.value)
    assert msg.startswith("x.yaml: not valid YAML") and expect in msg and "\n" not in msg, msg
    assert len(msg) < 300


@pytest.mark.parametrize("text, expect", [
    ("rules: [a]\nversion: 1\nrules: [b]\n", "x.yaml:3: field rules: duplicate key"),
    ("rules:\n  - knob: a\n    knob: b\n", "x.yaml:3: field rules[0].knob: duplicate key"),
])
def test_duplicate_keys_are_refused_with_their_field(text, expect):
    with pytest.raises(InputError, match=re.escape(expect)):
        inputs.parse_yaml(text, "x.yaml")


def test_overriding_a_merged_key_is_not_a_duplicate():
    assert inputs.parse_yaml("b: &b {x: 1}\nc: {<<: *b, x: 2}\n", "x.yaml")["c"] == {"x": 2}


def test_aliases_up_to_the_limits_are_fine():
    text = "a: &a [1, 2]\nb: [" + ", ".join(["*a"] * inputs.MAX_ALIASES) + "]\n"
    assert len(inputs.parse_yaml(text, "x.yaml")["b"]) == inputs.MAX_ALIASES


@pytest.mark.parametrize("text, expect", [
    ("x = nan\n", "field x: not a finite number"),
    ("[t]\ny = [1.0, -inf]\n", r"field t.y\[1\]: not a finite number"),
    ("x = \n", "not valid TOML"),
])
def test_toml_errors_are_one_line(text, expect):
    with pytest.raises(InputError, match=expect):
        inputs.parse_toml(text, "c.toml")


def test_not_utf8_names_the_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(InputError, match=r"p\.yaml: not UTF-8 text \(byte 0xe9 at line 2\)"):
        inputs.load_yaml(f)


def test_the_callers_error_class_and_prefix_are_used(tmp_path):
    f = tmp_path / "pol.yaml"
    f.write_text("rules: [{knob: x, range: [0, .nan]}]\n")
    with pytest.raises(PolicyError, match=rf"policy {f}: not valid YAML at line 1.*not a finite number"):
        load_policy(f)


@pytest.mark.parametrize("content, expect", [
    (b"backend = \"sim\"\nsim_root = \"/x\"\nprobation_s = inf\n", "field probation_s: not a finite number"),
    (b"backend = \"sim\"\nsim_root = \"/x\"\n[search]\nidle_for_s = nan\n", "field search.idle_for_s: not a finite number"),
    (b"backend = \"sim\xff\"\n", "not UTF-8"),
    (None, "is a FIFO"),
])
def test_the_daemon_config_reads_through_the_loader(tmp_path, content, expect):
    cfg = tmp_path / "config.toml"
    if content is None:
        os.mkfifo(cfg)
    else:
        cfg.write_bytes(content)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METALTUNE_STATE_DIR": str(tmp_path / "state"),
           "METALTUNE_RUN_DIR": str(tmp_path / "run")}
    r = subprocess.run([sys.executable, "-m", "tuner", "daemon", "--config", str(cfg), "--check"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert "config.toml" in r.stderr and expect in r.stderr, r.stderr


def test_bmc_yaml_reads_through_the_loader(tmp_path):
    from tuner.bios.config import CONFIG, load
    from tuner.errors import BadInput

    class Host:
        def path(self, p: str) -> Path:
            return tmp_path / p.lstrip("/")

    p = Host().path(CONFIG)
    p.parent.mkdir(parents=True)
    p.write_text("method: redfish\nurl: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(BadInput, match=r"bmc\.yaml: not valid YAML at line 2"):
        load(Host())
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(BadInput, match=r"bmc\.yaml: is a FIFO"):
        load(Host())
