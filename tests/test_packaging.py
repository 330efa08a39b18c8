"""What `pip install metaltune` gives: the daemon's small core, the kernel, LLM, Hugging Face and
report parts as extras (a command that needs one names it in one line), and a clear refusal when
the top-level `safety` is PyPI's vulnerability scanner rather than metaltune's own."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRA_MODULES = {"torch", "triton", "anthropic", "transformers", "matplotlib"}

# imports of the extras' modules fail as they would in an environment without them
BLOCKER = """\
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {mods!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (w,) = out.glob("metaltune-*.whl")
    return w


def test_the_core_install_leaves_torch_triton_and_anthropic_to_extras(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        names = z.namelist()
    core, extras = set(), {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: "):
            req, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
            name = re.match(r"[A-Za-z0-9_.\-]+(\[[^\]]*\])?", req.strip()).group(0).lower()
            m = re.search(r'extra == "(\w+)"', marker)
            (extras.setdefault(m.group(1), set()) if m else core).add(name)
    assert not {n.split("[")[0] for n in core} & EXTRA_MODULES, core
    assert {"nvidia-ml-py", "psutil", "paramiko", "pydantic", "typer", "rich", "pyyaml", "prometheus-client",
            "sushy"} <= core
    assert {"torch", "triton"} <= extras["kernels"] and extras["llm"] == {"anthropic"}
    assert "transformers" in extras["hf"] and extras["reports"] == {"matplotlib"}
    assert extras["all"] == {"metaltune[hf,kernels,llm,reports]"}
    assert "metaltune[all]" in extras["test"]   # bootstrap's `-e .[test]` installs everything
    # the user's layout, and the data files the daemon reads
    for top in ("tuner/", "kernelsearch/", "safety/", "host_profiles/"):
        assert any(n.startswith(top) for n in names), top
    assert "safety/policies/default.yaml" in names and "tuner/extras.py" in names


def _cli(tmp_path: Path, *args: str, pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")},
           "PYTHONPATH": os.pathsep.join(pythonpath), "METALTUNE_STATE_DIR": str(tmp_path / "state"),
           "METALTUNE_RUN_DIR": str(tmp_path / "run")}
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_core_commands_run_without_the_extras_and_the_others_name_theirs(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(mods=EXTRA_MODULES))
    path = [str(blocker), str(ROOT)]
    sim = tmp_path / "sim"
    for args in (["sim", "init", str(sim), "--sku", "h200"], ["--backend", "sim", "--sim-root", str(sim), "status"],
                 ["install", "--root", str(tmp_path / "root")], ["daemon", "--check", "--root", str(tmp_path / "root")],
                 ["--backend", "sim", "--sim-root", str(sim), "verify", "h200", "--json"]):
        r = _cli(tmp_path, *args, pythonpath=path)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        if args[0] != "--backend" or args[-1] == "status":
            assert r.returncode == 0, (args, r.stderr)
    cand = ROOT / "kernelsearch/families/softmax/__init__.py"
    for args, extra in ((["kernel", "check", "--family", "softmax", "--candidate", str(cand)], "kernels"),
                        (["--backend", "sim", "--sim-root", str(sim), "search", "host", "--budget", "1",
                          "--proposer", "llm"], "llm")):
        r = _cli(tmp_path, *args, pythonpath=path)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (args, r.stderr[-2000:])
        assert f"pip install 'metaltune[{extra}]'" in r.stderr, r.stderr


def test_pypi_safety_in_place_of_metaltunes_is_refused_in_one_line(tmp_path):
    fake = tmp_path / "site" / "safety"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "3.2.0"  # what PyPI\'s safety installs\n')
    path = [str(tmp_path / "site"), str(ROOT)]
    r = _cli(tmp_path, "status", pythonpath=path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert str(fake) in r.stderr and "PyPI's 'safety'" in r.stderr and "virtual environment" in r.stderr
    # a library user gets the same reason as an ImportError
    r = subprocess.run([sys.executable, "-c", "import tuner"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("ImportError: metaltune: the 'safety'")
    # and metaltune's own is recognised
    r = _cli(tmp_path, "--help", pythonpath=[str(ROOT)])
    assert r.returncode == 0, r.stderr
