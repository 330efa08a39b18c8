"""Kernels the LLM writes can win, be kept, installed and carried in a profile.

`metaltune search kernel --proposer llm` against a local HTTP server on 127.0.0.1 answering
like the Messages API with recorded replies (tests/proposers/llm/recordings), the real SDK, judge (child
processes, Triton's interpreter on the CPU), store, dispatch and CLI. One recorded run (module
fixture) feeds most tests: a correct kernel that beats the incumbent under the interpreter's
timing model (a [16, 64] tile per program against one program per row), a correct one that
loses, a cheat, a reply with the wrong tool."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.simhelpers import REPO, run_cli

REC = Path(__file__).parent / "recordings"
REDTEAM = REPO / "tests/kernelsearch/redteam"
KEY = "sk-ant-kernels-test-SECRET-7"
IDEAS = ["tile several rows per program", "keep the whole row in registers"]
BUCKETS = ["4x64", "16x64"]
INCUMBENT = {"version": 1, "device": "cpu", "meta": {}, "entries": [
    {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 64}, "ranges": {"rows": [1, 64]},
     "variant": "row", "config": {"ROWS": 1, "num_warps": 1}}]}


# what `metaltune diagnose --json` reports, trimmed to the fields the prompt shows
DIAGNOSIS = {"device": "NVIDIA H200", "workload": {"phase": "decode", "batch": 8, "ctx": 4096,
                                                   "model": "llama-3-8b"},
             "findings": ["rmsnorm: 65 launches per decode step, each under 3 us of work"],
             "ops": [{"op": "rmsnorm", "shapes": "[8, 4096]", "time_us_per_step": 190.0,
                      "share": 0.07, "class": "launch", "flops_frac": 0.0, "bytes_frac": 0.03}]}


def reply(name_or_body):
    return name_or_body if isinstance(name_or_body, dict) else json.loads((REC / name_or_body).read_text())


def with_source(family: str, source: str, mid: str) -> dict:
    """The recorded kernel reply's envelope around another source (red-team candidates)."""
    r = reply("good_kernel.json")
    use = r["content"][-1]
    r["id"], use["id"] = f"msg_{mid}", f"toolu_{mid}"
    use["input"] = dict(use["input"], family=family, source=source, config={},
                        rationale=f"red team: {mid}")
    return r


class API:
    """127.0.0.1 server that answers POST /v1/messages with queued replies, keeping requests."""

    def __init__(self):
        self.queue: list = []
        self.requests: list[dict] = []
        api = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.requests.append({"path": self.path, "body": body})
                data = json.dumps(reply(api.queue.pop(0))).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def prompt(self, i: int) -> str:
        return self.requests[i]["body"]["messages"][0]["content"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One recorded run through the CLI: good (kept), slow (lost), cheat (guard), wrong tool."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("kernel-sources")
    api = API()
    api.queue = ["good_kernel.json", "slow_kernel.json", "cheating_kernel.json", "good_host.json"]
    mp.setenv("ANTHROPIC_API_KEY", KEY)
    mp.setenv("ANTHROPIC_BASE_URL", api.url)
    mp.delenv("METALTUNE_LLM_MODEL", raising=False)
    (tmp / "incumbent.json").write_text(json.dumps(INCUMBENT))
    (tmp / "diagnosis.json").write_text(json.dumps(DIAGNOSIS))
    state = tmp / "state"
    from tuner.cli import main

    args = ["--state-dir", str(state), "search", "kernel", "--family", "rmsnorm", "--proposer",
            "llm", "--device", "cpu", "--budget", "4", "--incumbent", str(tmp / "incumbent.json"),
            "--gpu", "NVIDIA H200", "--timeout", "240", "--diagnosis",
            str(tmp / "diagnosis.json"), "--json"]
    for b in BUCKETS:
        args += ["--shape", b]
    for i in IDEAS:
        args += ["--idea", i]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(args)
    mp.undo()
    assert rc == 0, out.getvalue()
    res = json.loads(out.getvalue())
    from tuner.search.store import TrialStore

    with TrialStore.in_state_dir(state) as store:
        trials = store.list(run_id=res["run_id"])
    yield {"res": res, "api": api, "state": state, "trials": trials, "tmp": tmp}
    api.srv.shutdown()


def test_a_faster_source_is_kept_stored_and_named_in_the_table(run):
    from kernelsearch.store import SourceStore, digest

    res, trials = run["res"], run["trials"]
    good, slow, cheat, wrong_tool = trials
    assert (good.verdict, good.reason) == ("kept", "improved"), good.gates
    sha = good.measurements["source_sha256"]
    assert sha == digest(good.candidate.kernel.source)
    assert good.measurements["won"] == BUCKETS and good.gain > 0.5
    for b in BUCKETS:  # A/B against the incumbent, not torch
        assert good.measurements["buckets"][b]["incumbent"] == "row"
        assert good.measurements["buckets"][b]["spread"][0] > 1.0
    st = SourceStore(run["state"] / "kernels" / "sources")
    rec = st.record(sha)
    assert rec.family == "rmsnorm" and rec.config == {"ROWS": 16}
    assert rec.verdict["verdict"] == "accepted" and "timing" in rec.verdict["checks"]
    assert [4, 64] in rec.checked and [16, 64] in rec.checked and rec.timed == [[4, 64], [16, 64]]
    assert rec.env["gpu"].startswith("cpu") and rec.env["torch"] and rec.env["triton"]
    assert rec.origin["run_id"] == res["run_id"] and rec.origin["trial"] == 1
    assert rec.origin["ideas"] == IDEAS
    # the table: the winner where it won (4..16 rows), the incumbent kept around it
    table = json.loads(Path(res["table"]).read_text())
    spans = sorted((e["ranges"]["rows"], e["variant"]) for e in table["entries"])
    assert spans == [([1, 3], "row"), ([4, 16], f"src:{sha}"), ([17, 64], "row")]
    assert res["sources"] == [sha] and res["kept"] == 1 and res["trials"] == 4
    # a correct source that loses everywhere is stored (it passed the judge) but never installed
    assert (slow.verdict, slow.reason) == ("reverted", "worse")
    assert slow.measurements["buckets"]["16x64"]["incumbent"] == f"src:{sha}"  # the new incumbent
    assert st.has(slow.measurements["source_sha256"])
    assert slow.measurements["source_sha256"] not in json.dumps(table)
    # the cheat and the wrong tool: rejected, never stored
    assert (cheat.verdict, cheat.reason) == ("rejected", "guard_failed")
    assert cheat.measurements["judge"]["rule"] == "torch_compute"
    assert (wrong_tool.verdict, wrong_tool.reason) == ("rejected", "malformed")
    assert not st.has(digest(cheat.candidate.kernel.source))
    assert len(st.list()) == 2


def test_the_prompt_carries_context_ideas_history_and_the_best_source(run):
    api, trials = run["api"], run["trials"]
    assert len(api.requests) == 4 and api.requests[0]["path"] == "/v1/messages"
    body = api.requests[0]["body"]
    system = body["system"][0]["text"]
    assert [t["name"] for t in body["tools"]] == ["propose_kernel_candidate"]
    assert "H200" in system and "4.8 TB/s" in system and "grouped-query" in system.lower()
    first = api.prompt(0)
    for idea in IDEAS:
        assert idea in first
    assert "def reference(x, weight, eps)" in first and "F.rms_norm" in first  # reference, torch
    assert "| 4x64 | row" in first and "| 16x64 | row" in first  # buckets with their incumbent
    assert "No trials yet" in first
    assert "Diagnosis: where the time goes" in first and "65 launches per decode step" in first
    second = api.prompt(1)  # the verdict and the timings of trial 1, and it is now the best
    assert "| 1 |" in second and "kept" in second and "WON" in second and "vs row" in second
    assert "Current best source" in second and "_rms_tile" in second
    fourth = api.prompt(3)  # failures by reason code, with the judge's rule
    assert "Failures so far, by reason code" in fourth and "guard_failed/torch_compute" in fourth
    assert "worse" in fourth and "torch_compute" in fourth
    for t in trials:  # the operator's direction is in every trial's record
        assert t.ideas == IDEAS
    assert trials[0].cost["kept_change_usd"] > 0 and KEY not in json.dumps(api.requests)


DISPATCH = """
import json, sys, torch
from kernelsearch import dispatch
from kernelsearch.families import get
dispatch.install(sys.argv[1], store=sys.argv[2])
fam = get('rmsnorm')
out = {'refused': dispatch.refused()}
for rows in json.loads(sys.argv[3]):
    x, w, e = fam.make_inputs((rows, 64), 'float32', 'cpu', torch.Generator().manual_seed(rows))
    a = dispatch.stats(); y = dispatch.rmsnorm(x, w, e); b = dispatch.stats()
    out[rows] = [b['kernel'] - a['kernel'], float((y.double() - fam.reference(x, w, e)).abs().max())]
print(json.dumps(out))
"""


def dispatch_in_a_fresh_process(table, store, rows) -> dict:
    """A new interpreter (as a model server would start) installs the table and calls rmsnorm."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", DISPATCH, str(table), str(store), json.dumps(rows)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_fresh_process_runs_the_kept_source_through_dispatch(run):
    out = dispatch_in_a_fresh_process(run["res"]["table"], run["state"] / "kernels" / "sources",
                                      [4, 11, 16, 17])
    assert out["refused"] == {}
    for rows in ("4", "11", "16", "17"):  # 17: the incumbent's row kernel, also a table kernel
        assert out[rows][0] == 1 and out[rows][1] < 1e-5, out


def test_kernel_list_and_show_give_provenance(run, capsys, tmp_path):
    state = str(run["state"])
    sha = run["trials"][0].measurements["source_sha256"]
    rc, out, _ = run_cli(capsys, "--state-dir", state, "kernel", "list", "--json")
    rows = {r["sha256"]: r for r in json.loads(out)["kernels"]}
    assert rc == 0 and set(rows) == {sha, run["trials"][1].measurements["source_sha256"]}
    assert rows[sha]["ideas"] == IDEAS and rows[sha]["trial"] == 1 and rows[sha]["timed"] == [[4, 64], [16, 64]]
    rc, out, _ = run_cli(capsys, "--state-dir", state, "kernel", "show", sha[:12])
    assert rc == 0 and f"src:{sha}" in out and "def forward(x, weight, eps" in out
    assert "timed:   4x64, 16x64" in out
    rc, _, err = run_cli(capsys, "--state-dir", state, "kernel", "show", "ffffffff")
    assert rc == 2 and "no stored kernel" in err and len(err.strip().splitlines()) == 1
    # a copy whose source was edited: shown as refused, exit 1
    copy = tmp_path / "state"
    shutil.copytree(run["state"] / "kernels", copy / "kernels")
    py = copy / "kernels" / "sources" / f"{sha}.py"
    py.write_text(py.read_text().replace("ROWS: int = 16", "ROWS: int = 8"))
    rc, out, _ = run_cli(capsys, "--state-dir", str(copy), "kernel", "show", sha)
    assert rc == 1 and "REFUSED" in out and "digest mismatch" in out


def test_trials_stats_table_and_chart(run, capsys):
    state, run_id = str(run["state"]), run["res"]["run_id"]
    chart = run["tmp"] / "stats.png"
    rc, out, _ = run_cli(capsys, "--state-dir", state, "trials", "--stats", "--run", run_id,
                         "--chart", str(chart), "--json")
    assert rc == 0
    res = json.loads(out)
    llm = res["proposers"]["llm"]
    assert llm["counts"] == {"kept": 1, "lost": 1, "guard": 1, "malformed": 1}
    assert sum(llm["counts"].values()) == llm["trials"] == res["trials"] == 4
    assert abs(sum(llm["shares"].values()) - 1.0) < 1e-12
    tokens = sum(sum(t.cost.get(f, 0) for f in ("input_tokens", "output_tokens",
                                                "cache_creation_input_tokens",
                                                "cache_read_input_tokens")) for t in run["trials"])
    assert llm["tokens_per_kept"] == pytest.approx(tokens) and llm["usd_per_kept"] > 0
    assert llm["best_gain"] == pytest.approx(run["trials"][0].gain)
    assert [p["gain"] > 0 for p in llm["gain_over_time"]] == [True] * 4
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, out, _ = run_cli(capsys, "--state-dir", state, "trials", "--stats", "--run", run_id,
                         "--chart", str(chart))
    assert rc == 0 and "kept" in out and "guard" in out and "25.0%" in out and "stats.png" in out
    rc, _, err = run_cli(capsys, "--state-dir", state, "trials", "--stats", "--run", "nope")
    assert rc == 2 and "no such run" in err


def test_profile_export_then_apply_on_a_second_host_carries_the_kernel(run, tmp_path, capsys):
    from kernelsearch.store import SourceStore

    sha = run["trials"][0].measurements["source_sha256"]
    for h in ("a", "b"):
        assert run_cli(capsys, "sim", "init", str(tmp_path / f"sim-{h}"))[0] == 0
    prof = tmp_path / "tuned.yaml"
    rc, _, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(tmp_path / "sim-a"),
                         "--state-dir", str(run["state"]), "profile", "export", "--from-host",
                         "--name", "tuned", "--kernels", run["res"]["table"], "-o", str(prof))
    assert rc == 0, err
    text = prof.read_text()
    assert f"src:{sha}" in text and "kernel_sources:" in text and "def forward(x, weight" in text
    # host A was an H200: its record says where the source was judged, and travels with it
    assert text.count("gpu: cpu (triton interpreter)") == 1
    text = text.replace("gpu: cpu (triton interpreter)", "gpu: NVIDIA H200")
    prof.write_text(text)
    state_b = tmp_path / "state-b"
    rc, out, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(tmp_path / "sim-b"),
                           "--state-dir", str(state_b), "apply", str(prof), "--probation", "0")
    assert rc == 0, err
    assert f"src:{sha[:12]} (bundled, digest verified)" in out
    st = SourceStore(state_b / "kernels" / "sources")
    assert st.source(sha) == run["trials"][0].candidate.kernel.source
    assert st.record(sha).origin["run_id"] == run["res"]["run_id"]  # provenance travels too
    # the record's claims (judged on an H200) travel as provenance; apply judged it here
    rec = st.record(sha)
    assert rec.env["gpu"] == "NVIDIA H200" and rec.imported_at
    (j,) = rec.judgements
    assert j["verdict"] == "accepted" and j["env"]["gpu"].startswith("cpu")
    # host B's model server runs it on that judgement (not judged a second time)
    out = dispatch_in_a_fresh_process(state_b / "kernels" / "active.json", st.root, [8])
    assert out["refused"] == {} and out["8"][0] == 1 and out["8"][1] < 1e-5
    assert len(st.record(sha).judgements) == 1
    # a bundle edited on the way: one clear line, exit 2, nothing written on the third host
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("tl.rsqrt(", "tl.sqrt("))
    state_c = tmp_path / "state-c"
    rc, out, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(tmp_path / "sim-b"),
                           "--state-dir", str(state_c), "apply", str(bad), "--probation", "0")
    assert rc == 2 and "digest mismatch" in err and len(err.strip().splitlines()) == 1
    assert not (state_c / "kernels").exists()


def test_budgets_stop_the_run(tmp_path):
    """Three cheats in a row with --stop-after 2 stop after two; a dollar budget after one."""
    from tuner.search.sources import run_source_search

    api = API()
    try:
        for kw, n, why in (({"stop_after": 2}, 2, "2 trials in a row kept nothing"),
                           ({"max_usd": 0.001}, 1, "dollar budget spent"),
                           ({"max_tokens": 20000}, 2, "token budget spent")):
            api.queue = ["cheating_kernel.json"] * 3
            res = run_source_search(tmp_path / "state", "rmsnorm", budget=3, device="cpu",
                                    shapes=[(4, 64)], api_key=KEY, base_url=api.url,
                                    max_retries=0, **kw)
            assert res["trials"] == n and why in res["stopped"], res
    finally:
        api.srv.shutdown()


# every red-team class: (file, code, rule or None)
REDTEAM_CASES = [
    ("torch_op", "guard_failed", "torch_compute"),
    ("cache_data_ptr", "guard_failed", "module_state"),
    ("side_stream", "guard_failed", "stream"),
    ("starts_thread", "guard_failed", "thread"),
    ("patches_timer", "guard_failed", "monkey_patch"),
    ("torch_operators", "guard_failed", "torch_compute"),
    ("partial_output", "incorrect", "unwritten"),
    ("only_tested_shapes", "incorrect", None),
    ("mutates_input", "incorrect", "input_mutated"),
    ("never_launches", "incorrect", "no_launch"),
    ("wrong_dtype", "incorrect", "wrong_shape_or_dtype"),
    ("low_precision", "incorrect", "tolerance"),
    ("lazy_when_timed", "incorrect", None),  # timed_output or timed_path
    ("first_rows", "incorrect", "unwritten"),
    ("capped_grid", "incorrect", "unwritten"),
    ("narrow_only", "incorrect", None),
    ("precision_when_wide", "incorrect", None),
    ("reuses_freed_output", "incorrect", None),
    ("tensor_subclass", "guard_failed", "module_state"),
    ("capture_aware", "guard_failed", "stream"),
    ("counter_default", "guard_failed", "module_state"),
    ("counter_func_attr", "guard_failed", "reflection"),
    ("counter_tensor_attr", "guard_failed", "reflection"),
    ("jit_removes_file", "guard_failed", "jit_body"),
    ("jit_writes_outside", "guard_failed", "jit_body"),
    ("jit_forks_daemon", "guard_failed", "jit_body"),
    ("compile_error", "compile_failed", None),
    ("crash_wild_pointer", "crashed", "signal:SIGSEGV"),
    ("memory_hog", "crashed", "memory_limit"),
    ("hangs", "timeout", "wall_clock"),
    # issue 24: the allow-list's holes
    ("typing_sys", "guard_failed", "import"),
    ("tl_builtins_eval", "guard_failed", "attribute_not_allowed"),
    ("torch_via_eval", "guard_failed", "dynamic_code"),
    ("module_name_check", "guard_failed", "reflection"),
    ("kernel_str", "guard_failed", "reflection"),
    ("annotation_exec", "guard_failed", "annotation_not_allowed"),
    ("call_count", "guard_failed", "module_state"),
    ("grad_mode", "guard_failed", "torch_compute"),
]
# issue 24's run-time cheats need the judge options of tests/kernelsearch/test_redteam.py (a
# table range, more draws) or another family
OTHER_OPTIONS = {"contiguous_only", "nan_poison_only", "range_interior", "rmsnorm_eps_fixed",
                 "rmsnorm_honest", "mla_fixed_scale", "mla_longest_first", "mla_batch_cap",
                 "mla_heads_cap", "mla_pages_cap", "mla_topk_cap"}


def test_every_red_team_reply_ends_rejected_with_its_code_and_never_stored(tmp_path):
    from tuner.search.sources import run_source_search, store_in
    from tuner.search.trial_stats import outcome

    assert {p.stem for p in REDTEAM.glob("*.py")} - {c[0] for c in REDTEAM_CASES} \
        - OTHER_OPTIONS == {"honest"}
    api = API()
    api.queue = [with_source("softmax", (REDTEAM / f"{n}.py").read_text(), n)
                 for n, _, _ in REDTEAM_CASES]
    try:
        res = run_source_search(tmp_path / "state", "softmax", budget=len(REDTEAM_CASES),
                                device="cpu", shapes=[(4, 64)], seeds=1, timeout_s=40,
                                mem_limit_mb=1200, api_key=KEY, base_url=api.url, max_retries=0)
    finally:
        api.srv.shutdown()
    from tuner.search.store import TrialStore

    with TrialStore.in_state_dir(tmp_path / "state") as store:
        trials = store.list(run_id=res["run_id"])
    got = {t.candidate.rationale.split(": ")[1]: t for t in trials}
    for name, code, rule in REDTEAM_CASES:
        t = got[name]
        assert (t.verdict, t.reason) == ("rejected", code), (name, t.gates)
        if rule:
            assert t.measurements["judge"]["rule"] == rule, (name, t.measurements["judge"])
        assert outcome(t) in ("guard", f"incorrect/{t.measurements['judge']['rule']}", code)
    assert store_in(tmp_path / "state").list() == [] and res["entries"] == 0
