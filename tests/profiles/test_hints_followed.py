"""The next steps `apply` and `status` print are followed here, through the real CLI, and must
work (issue 33, item 13): after a profile applied from a file, `verify local` found no profile
'local'; a `forbidden:` refusal said "add a rule", which alone never lets the change through; a
refusal because the change takes effect on reboot did not name `allow_reboot_effect`."""
from __future__ import annotations

import re
import shlex

import yaml

from safety import policy as pol
from tests.simhelpers import SimCli

LOCAL = "name: local\nknobs:\n  os.numa_balancing: 0\n"
BIOS = "name: biosy\nknobs:\n  bios.WorkloadProfile: LowLatency\n"


def _verify_hint(text: str) -> list[str]:
    m = re.search(r"`metaltune (verify [^`]+)`", text)
    assert m, text
    return shlex.split(m.group(1))


def test_the_verify_hint_after_a_file_profile_works(tmp_path, monkeypatch):
    mt = SimCli(tmp_path, "h200")
    prof = tmp_path / "elsewhere" / "local.yaml"
    prof.parent.mkdir()
    prof.write_text(LOCAL)
    r = mt("apply", str(prof), "--probation", "0")
    assert r.returncode == 0, r.stderr
    for text in (r.stdout, mt("status").stdout):
        args = _verify_hint(text)
        v = mt(*args)
        assert v.returncode == 0 and "profile local is in force" in v.stdout, (args, v.stdout, v.stderr)
    # a shipped profile is still named by its name
    r = mt("apply", "h200", "--probation", "0")
    assert r.returncode == 0, r.stderr
    assert _verify_hint(r.stdout) == ["verify", "h200"] == _verify_hint(mt("status").stdout)


def _way_out(stderr: str) -> str:
    return next(ln for ln in stderr.splitlines() if ln.lstrip().startswith("way out:"))


def test_the_way_out_of_a_forbidden_refusal_works_when_followed(tmp_path):
    mt = SimCli(tmp_path, "h200")
    prof = tmp_path / "biosy.yaml"
    prof.write_text(BIOS)
    r = mt("apply", str(prof), "--probation", "0")
    assert r.returncode == 1 and "forbidden 'bios.*'" in r.stderr, r.stderr
    hint = _way_out(r.stderr)
    # what the old hint said alone: a rule under `rules:` (the forbidden pattern still wins)
    copy = yaml.safe_load((pol.POLICY_DIR / "default.yaml").read_text())
    only_rule = dict(copy, rules=[{"knob": "bios.WorkloadProfile"}, *copy["rules"]])
    (tmp_path / "only-rule.yaml").write_text(yaml.safe_dump(only_rule))
    r = mt("apply", str(prof), "--probation", "0", "--policy", str(tmp_path / "only-rule.yaml"))
    assert r.returncode == 1 and "forbidden 'bios.*'" in r.stderr
    # the hint, followed to the letter in a copy of the policy (passed with --policy, as it offers)
    assert "remove 'bios.*' from `forbidden:`" in hint, hint
    assert "add a rule under `rules:` for bios.WorkloadProfile" in hint, hint
    example = re.search(r"`- (\{knob: [^`]+\})`", hint).group(1)
    rule = yaml.safe_load(example)
    assert rule == {"knob": "bios.WorkloadProfile", "allow_reboot_effect": True}, hint
    followed = dict(copy, forbidden=[p for p in copy["forbidden"] if p != "bios.*"],
                    rules=[*copy["rules"], rule])
    (tmp_path / "followed.yaml").write_text(yaml.safe_dump(followed))
    r = mt("apply", str(prof), "--probation", "0", "--policy", str(tmp_path / "followed.yaml"))
    assert r.returncode == 0 and "applied (transaction" in r.stdout, r.stdout + r.stderr
    assert "staged until the next reboot" in r.stdout


def test_a_reboot_refusal_names_allow_reboot_effect_and_setting_it_works(tmp_path):
    mt = SimCli(tmp_path, "h200")
    prof = tmp_path / "biosy.yaml"
    prof.write_text(BIOS)
    own = tmp_path / "policy.yaml"
    own.write_text(yaml.safe_dump({"version": 1, "forbidden": [], "rules": [{"knob": "bios.*"}]}))
    r = mt("apply", str(prof), "--probation", "0", "--policy", str(own))
    assert r.returncode == 1, r.stderr
    hint = _way_out(r.stderr)
    assert f"edit {own}: set `allow_reboot_effect: true` in rule #0 (knob 'bios.*')" in hint, hint
    assert "add a rule" not in hint
    own.write_text(yaml.safe_dump({"version": 1, "forbidden": [],
                                   "rules": [{"knob": "bios.*", "allow_reboot_effect": True}]}))
    r = mt("apply", str(prof), "--probation", "0", "--policy", str(own))
    assert r.returncode == 0 and "applied (transaction" in r.stdout, r.stdout + r.stderr
