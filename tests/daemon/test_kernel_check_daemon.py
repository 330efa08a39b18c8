"""`metaltune kernel check` runs the "kernel_check" operation through the shared invoke path: with
a daemon running, the CLI reads the candidate (as its user) and the daemon judges the *text* in a
child (the daemon itself never loads torch), with the verdict a local check gives."""
from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.conftest import base_env, metaltune, write_config
from tuner.ops.settings import NO_DAEMON_ENV

RED = Path(__file__).resolve().parents[1] / "kernelsearch" / "redteam"
#: (checked_shapes holds shapes drawn new every run, from the verdict's own shape_seed, and
#: draws that coincide are checked once: compared by the fixed shapes both hold)
SAME = ("verdict", "stage", "code", "rule", "skipped_shapes", "device", "family", "candidate")


def test_kernel_check_through_the_daemon_gives_the_local_verdict(tmp_path, sim_host,
                                                                start_daemon):
    d = start_daemon(write_config(tmp_path / "daemon.toml", sim_host, tmp_path))
    d.wait_ready()
    for name, rc in (("honest.py", 0), ("torch_op.py", 1)):
        args = ("kernel", "check", "--family", "softmax", "--candidate", str(RED / name),
                "--device", "cpu", "--no-timing", "--json")
        through = d.cli(*args, check=False)
        local = metaltune(*args, env={**base_env(tmp_path / "run"), NO_DAEMON_ENV: "1"},
                          check=False)
        assert (through.returncode, local.returncode) == (rc, rc), (through.stderr, local.stderr)
        a, b = json.loads(through.stdout), json.loads(local.stdout)
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}, (a, b)
        if rc == 0:  # (a guard rejection checks no shape)
            from kernelsearch.families import get

            tiny = {tuple(x) for x in get("softmax").tiny_shapes}
            assert tiny <= {tuple(x) for x in a["checked_shapes"]}, a["checked_shapes"]
            assert tiny <= {tuple(x) for x in b["checked_shapes"]}, b["checked_shapes"]
            assert a["shape_seed"] != b["shape_seed"]
    # the socket takes the text, never a path, and judges it the same way
    src = (RED / "torch_op.py").read_text()
    r = d.call("kernel_check", timeout=200, family="softmax", source=src, device="cpu",
               no_timing=True)
    assert r["ok"], r
    assert (r["result"]["code"], r["result"]["rule"]) == ("guard_failed", "torch_compute")
    bad = d.call("kernel_check", family="softmax", source=src, shapes=[[3, 17, 5]])
    assert bad["ok"] is False and bad["exit_code"] == 2 and "--shape" in bad["error"], bad
    assert d.call("daemon")["result"]["heavy_modules"] == []  # the judge's imports: in the child
    assert d.stop() == 0
