"""A profile cannot make metaltune (root) read and print another file: `include:` resolves only
inside the profile's own folder and the profile search path (no absolute path outside it, no
`..`, no symlink out of it), and a validation error never quotes the value of a field that is
not a profile's. Through the real CLI, with a password file outside the profile's folder."""
from __future__ import annotations

import os

import pytest

from tests.simhelpers import run_cli

SECRET = "hunter2-bmc-Pa55word"


@pytest.fixture
def secret_file(tmp_path):
    d = tmp_path / "elsewhere"
    d.mkdir()
    f = d / "bmc.yaml"
    f.write_text(f"password: {SECRET}\nuser: admin\n")
    return f


def _profile(tmp_path, body):
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    p = d / "mine.yaml"
    p.write_text(body)
    return p


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_an_include_outside_the_search_path_is_refused_and_the_secret_never_printed(
        capsys, tmp_path, secret_file, how):
    if how == "absolute":
        inc = str(secret_file)
    elif how == "dotdot":
        inc = "../elsewhere/bmc.yaml"
    else:
        (tmp_path / "profiles").mkdir()
        os.symlink(secret_file, tmp_path / "profiles" / "base.yaml")
        inc = "base"
    prof = _profile(tmp_path, f"name: mine\ninclude: [{inc}]\nknobs:\n  cpu.governor: performance\n")
    for cmd in (["profile", "show", str(prof)], ["verify", str(prof)]):
        rc, out, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(tmp_path / "nohost"),
                               "--state-dir", str(tmp_path / "state"), *cmd)
        assert rc == 2, (cmd, out, err)
        assert SECRET not in out + err
        assert "field include:" in err and "outside" in err and err.count("\n") == 1, err


def test_an_unknown_field_is_named_without_its_value(capsys, tmp_path, secret_file):
    """The profile named on the command line may itself be the wrong file."""
    rc, out, err = run_cli(capsys, "--state-dir", str(tmp_path / "state"),
                           "profile", "show", str(secret_file))
    assert rc == 2 and SECRET not in out + err
    assert "field password: not a profile field" in err and err.count("\n") == 1, err


def test_includes_inside_the_profiles_folder_and_the_search_path_still_resolve(capsys, tmp_path):
    d = tmp_path / "profiles" / "bases"
    d.mkdir(parents=True)
    (d / "mybase.yaml").write_text("name: mybase\nknobs:\n  sysctl.vm.swappiness: 10\n")
    prof = _profile(tmp_path, "name: mine\ninclude: [datacenter, bases/mybase.yaml]\n"
                              "knobs:\n  cpu.governor: performance\n")
    rc, out, err = run_cli(capsys, "--state-dir", str(tmp_path / "state"),
                           "profile", "show", str(prof), "--json")
    assert rc == 0, err
    assert "datacenter" in out and "mybase" in out
