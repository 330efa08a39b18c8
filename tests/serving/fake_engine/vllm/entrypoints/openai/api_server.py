"""A stand-in server for the process-handling tests of tuner/workloads/serving/server.py only (the
real engine is started by test_serving_engine.py): it ignores SIGTERM, starts a grandchild that
ignores it too, listens on --port, and answers /health with 200 unless FAKE_ENGINE=hang."""
import argparse
import http.server
import os
import signal
import subprocess
import sys

signal.signal(signal.SIGTERM, signal.SIG_IGN)
p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
a, _ = p.parse_known_args()
child = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"])
with open(os.environ["FAKE_ENGINE_PIDS"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\n")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if os.environ.get("FAKE_ENGINE") == "hang":
            return  # no answer: the client times out
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


http.server.HTTPServer(("127.0.0.1", a.port), Health).serve_forever()
