"""What a new user meets, said in one line (issue 42, items 14 and 12): `install --root FILE`
crashed half-way with a NotADirectoryError traceback; a power budget below the policy's floor
was refused without the floor or the way out."""
from __future__ import annotations

from tests.simhelpers import SimCli, host_digest


def test_a_root_that_is_a_file_is_one_line_exit_2_and_nothing_written(tmp_path):
    sim = SimCli(tmp_path)
    f = tmp_path / "afile"
    f.write_text("x")
    for args in (("install", "--root", str(f)), ("install", "--root", str(f / "below")),
                 ("uninstall", "--root", str(f)), ("daemon", "--check", "--root", str(f))):
        r = sim(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and "not a directory" in r.stderr, r.stderr
        assert r.stderr.startswith(f"metaltune: error: --root: {args[-1]}"), r.stderr
    assert f.read_text() == "x"


def test_a_power_budget_below_the_policy_floor_names_the_floor_and_the_way_out(tmp_path):
    sim = SimCli(tmp_path, "h200", "--gpus", "1")
    before = host_digest(sim.root)
    r = sim("search", "host", "--objective", "power-capped", "--power-budget", "400",
            "--knob", "gpu0.power_limit_w", "--budget", "2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    err = r.stderr
    assert "below the floor 0.75 x default 700 = 525" in err  # the floor the policy sets
    assert "--power-budget 550 or more" in err  # the lowest it allows from 700 (150 W a step)
    assert "--policy FILE" in err and "min_fraction_of_default" in err  # the way out
    assert host_digest(sim.root) == before


GPU3 = "name: gpu3-cap\ndescription: written for a bigger host\nknobs:\n  gpu3.power_limit_w: 600\n"


def test_a_profile_for_a_gpu_the_host_lacks_is_refused_and_never_in_force(tmp_path):
    sim = SimCli(tmp_path, "h200", "--gpus", "1")
    prof = tmp_path / "gpu3.yaml"
    prof.write_text(GPU3)
    before = host_digest(sim.root)
    for extra in ((), ("--no-wait",), ("--dry-run",)):
        r = sim("apply", str(prof), *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (extra, r.stdout, r.stderr)
        assert f"{prof}:4: field knobs.gpu3.power_limit_w: this host has no gpu3 (it has gpu0)" \
            in r.stderr, r.stderr
    assert host_digest(sim.root) == before
    r = sim("verify", str(prof))
    assert r.returncode == 1 and "is in force" not in r.stdout, r.stdout
    assert "not in force: gpu3.power_limit_w: this host has no gpu3" in r.stdout, r.stdout
    r = sim("verify", str(prof), "--json")
    import json

    res = json.loads(r.stdout)
    assert res["ok"] is False and res["knobs"][0]["status"] == "missing", res
    r = sim("status", "--json")
    assert "gpu3-cap" not in r.stdout  # never recorded as the profile in force
