"""`metaltune search host --proposer llm` against a local HTTP server on 127.0.0.1 that answers
like the Messages API with a recorded reply: the SDK's real client over a real socket, the
simulated host, the safety transaction and the trial store."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REC = Path(__file__).parent / "recordings"
KEY = "sk-ant-cli-test-SECRET-42"


@pytest.fixture
def fake_api():
    seen = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append({"path": self.path, "body": body, "auth": self.headers.get("authorization", "")
                         + self.headers.get("x-api-key", "")})
            data = (REC / "power_limit.json").read_bytes()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()


def test_search_host_with_the_llm_proposer(tmp_path, fake_api, monkeypatch, capsys):
    from tuner.cli import main

    url, seen = fake_api
    sim, state = tmp_path / "sim", tmp_path / "state"
    assert main(["sim", "init", str(sim)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    monkeypatch.setenv("METALTUNE_LLM_MODEL", "claude-sonnet-5-5")
    rc = main(["--backend", "sim", "--sim-root", str(sim), "--state-dir", str(state), "search",
               "host", "--proposer", "llm", "--budget", "2", "--knob", "gpu0.power_limit_w",
               "--workload", "sim", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["trials"] == 2 and len(seen) == 2
    assert seen[0]["path"] == "/v1/messages" and KEY in seen[0]["auth"]
    assert seen[0]["body"]["model"] == "claude-sonnet-5-5"
    assert "gpu0.power_limit_w" in seen[0]["body"]["system"][0]["text"]
    # the second request shows the first trial's outcome; the repeat is refused as a duplicate
    assert "| 1 | knobs {\"gpu0.power_limit_w\": 600}" in seen[1]["body"]["messages"][0]["content"]
    rc = main(["--state-dir", str(state), "trials", "--json"])
    trials = json.loads(capsys.readouterr().out)["trials"]
    by_n = {t["number"]: t for t in trials}
    assert by_n[1]["candidate"]["proposer"] == "llm"
    assert by_n[1]["verdict"] in ("kept", "reverted", "rolled_back")
    assert by_n[2]["reason"] == "duplicate"
    assert by_n[1]["cost"]["input_tokens"] == 4100 and by_n[1]["cost"]["usd"] > 0
    assert KEY not in json.dumps(trials) and KEY not in out.err
