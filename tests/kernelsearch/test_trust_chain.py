"""A source is judged on this host whatever its record claims (records are provenance only),
and no privileged process runs candidate code, end to end through the real CLI (`sim init`,
`apply`) on a simulated host:

- a bundle whose forged record says "accepted here" on a wrong softmax is judged here and
  refused: exit 1, no table installed, nothing stored;
- a bundled source the static guard refuses is never installed (exit 1);
- the same honest source with a forged record is judged here, the judgement recorded as this
  host's, and a fresh model process runs it;
- an annotation payload (`PROBE: exec(...) = 0`) never runs outside the sandbox: not in the
  `apply` process, not in the model process's `dispatch.install` or calls."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernelsearch.store import digest, environment

ROOT = Path(__file__).resolve().parents[2]
HONEST = (Path(__file__).parent / "redteam" / "honest.py").read_text()
WRONG = HONEST.replace("(e / tl.sum(e, 0))", "(e / (tl.sum(e, 0) + 0.01))")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"})


def forged_profile(path: Path, source: str) -> str:
    here = {k: str(v) for k, v in environment("cpu").items()}
    sha = digest(source)
    record = {"sha256": sha, "family": "softmax", "config": {},
              "verdict": {"verdict": "accepted", "code": "accepted", "checks": ["all"]},
              "checked": [[65536, 17]], "timed": [], "env": here, "stored_at": "2026-01-01",
              "origin": {"run_id": "forged"},
              "judgements": [{"env": here, "verdict": "accepted", "code": "accepted"}]}
    doc = {"name": path.stem, "knobs": {},
           "kernels": {"version": 1, "device": "cpu", "meta": {}, "entries": [
               {"family": "softmax", "dtype": "float32", "match": {"cols": 64},
                "ranges": {"rows": [1, 16]}, "variant": f"src:{sha}", "config": {}}]},
           "kernel_sources": {sha: {"source": source, "record": record}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return sha


@pytest.fixture
def host(tmp_path):
    assert cli("sim", "init", str(tmp_path / "sim")).returncode == 0
    return tmp_path


def apply(host: Path, prof: Path, state: str = "state") -> subprocess.CompletedProcess:
    return cli("--backend", "sim", "--sim-root", str(host / "sim"), "--state-dir",
               str(host / state), "apply", str(prof), "--probation", "0")



def payload_line(marker) -> str:
    """A module-level annotation that writes `marker` when evaluated, and keeps quiet where it
    cannot (the sandbox): so the judge, which imports it confined, still accepts the source."""
    code = f"try:\\n open({str(marker)!r}, 'w').write('ran')\\nexcept OSError:\\n pass"
    return f'PROBE: exec("{code}") = 0'

def test_a_forged_record_on_a_wrong_kernel_is_judged_here_and_refused(host):
    prof = host / "forged.yaml"
    forged_profile(prof, WRONG)
    p = apply(host, prof)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "judged on this host" in p.stderr and "incorrect" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (host / "state" / "kernels" / "active.json").exists()
    assert not list((host / "state").rglob("*.py"))  # nothing stored either


def test_a_bundled_source_the_guard_refuses_is_never_installed(host):
    cheat = HONEST.replace("    return y.view(x.shape)\n",
                           "    return torch.softmax(x, -1)\n")
    prof = host / "cheat.yaml"
    forged_profile(prof, cheat)
    p = apply(host, prof)
    assert p.returncode == 1 and "static guard" in p.stderr, p.stdout + p.stderr
    assert not (host / "state" / "kernels" / "active.json").exists()


MODEL = '''
import json, sys, torch
from kernelsearch import dispatch
dispatch.install(sys.argv[1], store=sys.argv[2])
x = torch.randn(8, 64)
before = dispatch.stats()["kernel"]
y = dispatch.softmax(x)
print(json.dumps({"refused": dispatch.refused(), "kernel": dispatch.stats()["kernel"] - before,
                  "err": float((y - torch.softmax(x, -1)).abs().max())}))
'''


def model_process(state: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", MODEL, str(state / "kernels" / "active.json"),
                        str(state / "kernels" / "sources")], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                   "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_an_honest_source_is_judged_here_and_its_forged_claims_kept_as_provenance(host):
    from kernelsearch.store import SourceStore

    prof = host / "honest.yaml"
    sha = forged_profile(prof, HONEST)
    p = apply(host, prof)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = SourceStore(host / "state" / "kernels" / "sources").record(sha)
    assert rec.imported_at and rec.origin["claimed_judgements"]
    (j,) = rec.judgements  # this host's own, made by apply's sandboxed judge
    assert j["verdict"] == "accepted" and j["env"] == environment("cpu")
    out = model_process(host / "state")
    assert out["refused"] == {} and out["kernel"] == 1 and out["err"] < 1e-5


def test_an_annotation_payload_never_runs_outside_the_sandbox(host):
    marker = host / "marker"
    payload = HONEST.replace(
        "\n\n@triton.jit", "\n\n" + payload_line(marker) + "\n\n\n@triton.jit", 1)
    assert "PROBE: exec(" in payload
    subprocess.run([sys.executable, "-c", payload], check=True)  # the control: it does write
    assert marker.read_text() == "ran"
    marker.unlink()
    prof = host / "probe.yaml"
    forged_profile(prof, payload)
    p = apply(host, prof)
    assert not marker.exists(), "the payload ran in the apply process"
    if p.returncode == 1:  # the guard (or the judge) refused it, with a reason
        assert "kernel_sources" in p.stderr, p.stderr
        return
    assert p.returncode == 0, p.stderr
    out = model_process(host / "state")
    assert not marker.exists(), "the payload ran in the model process"
    assert out["refused"] == {} and out["kernel"] == 1 and out["err"] < 1e-5
