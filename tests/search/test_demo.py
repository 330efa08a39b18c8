"""The demo is the main job: the whole loop on a simulated H200, through the safety layer."""
import json
import subprocess
import sys

import pytest
import yaml

KEYS = ("trials", "kept", "reverted", "rolled_back", "rejected", "baseline_throughput",
        "best_throughput", "best_settings")


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory):
    wd = tmp_path_factory.mktemp("demo")
    p = subprocess.run(
        [sys.executable, "-m", "tuner", "demo", "--trials", "60", "--seed", "1", "--json",
         "--workdir", str(wd)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_demo_json_has_the_contract_fields(demo_json):
    for k in KEYS + ("profile_path",):
        assert k in demo_json, k
    assert demo_json["trials"] == 60
    assert demo_json["kept"] + demo_json["reverted"] + demo_json["rolled_back"] + sum(
        demo_json["rejected"].values()) == 60


def test_demo_keeps_reverts_for_noise_and_rolls_back_instability(demo_json):
    assert demo_json["kept"] >= 1
    assert demo_json["reverted_by_reason"].get("within_noise", 0) >= 1
    assert demo_json["rolled_back"] >= 1
    assert all(r.startswith("instability_") or r in ("canary_failed", "probation_expired")
               for r in demo_json["rolled_back_by_reason"])


def test_demo_beats_baseline_and_lands_near_the_true_optimum(demo_json):
    assert demo_json["best_throughput"] > demo_json["baseline_throughput"]
    assert demo_json["true_best"] > demo_json["true_baseline"]
    assert demo_json["true_best"] >= 0.97 * demo_json["true_optimum"]


def test_demo_writes_a_profile_of_the_kept_settings(demo_json):
    doc = yaml.safe_load(open(demo_json["profile_path"]))
    assert doc["knobs"], "the kept settings differ from the defaults"
    for k, v in doc["knobs"].items():
        assert demo_json["best_settings"][k] == v
    assert doc["provenance"]["gain_pct"] > 0
    # it is a valid host profile, and the tuned host verifies clean against it
    p = subprocess.run([sys.executable, "-m", "tuner", "--sim-root", demo_json["sim_root"],
                        "--state-dir", demo_json["state_dir"], "verify", demo_json["profile_path"],
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_demo_trials_are_in_the_store(demo_json):
    p = subprocess.run([sys.executable, "-m", "tuner", "--state-dir", demo_json["state_dir"],
                        "trials", "--json", "--limit", "0"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    trials = json.loads(p.stdout)["trials"]
    assert len(trials) == 60
    rb = [t for t in trials if t["verdict"] == "rolled_back"]
    assert rb and all(t["incident"] for t in rb)
    kept = [t for t in trials if t["verdict"] == "kept"]
    assert all(t["gain"] > 0 for t in kept)


def test_same_seed_same_result(demo_json, tmp_path):
    from tuner.search.demo import run_demo

    again = run_demo(60, 1, "optuna", "h200", tmp_path)
    for k in KEYS:
        assert again[k] == demo_json[k], k
