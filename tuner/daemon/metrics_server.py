"""The metrics endpoint's HTTP server: prometheus-client's WSGI app behind wsgiref, with the
limits a root daemon's listener needs (issue 42, item 9: prometheus-client's own server starts a
thread per connection and never times one out; 200 idle connections took the daemon from 4 to
~175 threads).

- A connection waits in a selector (no thread) until its request arrives; one that sends
  nothing for `idle_s` is closed.
- At most `max_conns` connections are open at once; one more makes the longest silent one
  close (so a scraper gets in however many idle ones there are), or is closed at accept when
  every slot is a request being answered.
- Requests are answered by a pool of `workers` threads; each read and write of a request has
  the same `idle_s` timeout, so a slow client holds one worker for a bounded time.

So the endpoint costs at most 1 + `workers` threads and `max_conns` descriptors, however many
clients connect."""
from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger(__name__)

IDLE_S = 10.0
MAX_CONNS = 32
WORKERS = 2


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # no access log
        pass


class _Server(WSGIServer):
    """wsgiref's server for its request handling only: our loop accepts and dispatches."""

    def __init__(self, addr: tuple[str, int], family: int):
        self.address_family = family
        super().__init__(addr, _Quiet)


class MetricsServer:
    def __init__(self, app: Callable[..., Any], address: str, port: int, *,
                 idle_s: float = IDLE_S, max_conns: int = MAX_CONNS, workers: int = WORKERS):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._srv = _Server((address, port), family)
        self._srv.set_app(app)
        self._srv.socket.setblocking(False)
        self.idle_s, self.max_conns = idle_s, max_conns
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="metrics")
        self._sel = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, float] = {}  # connection -> when it is closed idle
        self._busy = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refused = self.closed_idle = 0
        self._thread = threading.Thread(target=self._loop, name="metrics-accept", daemon=True)

    @property
    def port(self) -> int:
        return self._srv.server_port

    def start(self) -> "MetricsServer":
        self._sel.register(self._srv.socket, selectors.EVENT_READ, None)
        self._thread.start()
        return self

    def open_connections(self) -> int:
        with self._lock:
            return len(self._waiting) + self._busy

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._dispatch(key.fileobj, key.data)  # type: ignore[arg-type]
            now = time.monotonic()
            for conn, deadline in list(self._waiting.items()):
                if deadline <= now:
                    self._drop(conn)
                    self.closed_idle += 1

    def _accept(self) -> None:
        try:
            conn, addr = self._srv.socket.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # EMFILE and the like: say it, keep serving the open ones
            log.warning("metrics endpoint: accept failed: %s", e)
            time.sleep(0.1)
            return
        if self.open_connections() >= self.max_conns:
            with self._lock:
                oldest = min(self._waiting, key=self._waiting.__getitem__, default=None)
            if oldest is None:  # every slot is a request being answered
                self.refused += 1
                conn.close()
                return
            self._drop(oldest)  # the longest silent one makes room: a scraper always gets in
            self.closed_idle += 1
        conn.setblocking(False)
        with self._lock:
            self._waiting[conn] = time.monotonic() + self.idle_s
        self._sel.register(conn, selectors.EVENT_READ, addr)

    def _drop(self, conn: socket.socket) -> None:
        self._sel.unregister(conn)
        with self._lock:
            self._waiting.pop(conn, None)
        conn.close()

    def _dispatch(self, conn: socket.socket, addr: Any) -> None:
        self._sel.unregister(conn)
        with self._lock:
            self._waiting.pop(conn, None)
            self._busy += 1
        conn.setblocking(True)
        conn.settimeout(self.idle_s)
        self._pool.submit(self._answer, conn, addr)

    def _answer(self, conn: socket.socket, addr: Any) -> None:
        try:
            self._srv.finish_request(conn, addr)
        except (OSError, ValueError):
            pass  # a client that went away or timed out: nothing to answer
        except Exception:  # noqa: BLE001  # one bad request never stops the endpoint
            log.exception("metrics endpoint: request failed")
        finally:
            self._srv.shutdown_request(conn)
            with self._lock:
                self._busy -= 1

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        for conn in list(self._waiting):
            self._drop(conn)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sel.close()
        self._srv.server_close()
