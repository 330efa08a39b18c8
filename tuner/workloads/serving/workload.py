"""The serving workload a search or `compare` holds. Each measurement runs the bench client over
the concurrency ladder against a server started with the candidate's engine settings (a server
per distinct settings, the last `servers_kept` kept running, so an A/B pair alternates between two
running servers instead of restarting one per side), or against the `attach` URL, which is never
started, restarted or stopped (host-knob searches of a running deployment)."""
from __future__ import annotations

import re
import time
from typing import Any, Mapping, Optional

from tuner import redact
from tuner.errors import WorkloadFailed
from tuner.trial import Measurement
from tuner.workloads.base import Untuned, Workload
from tuner.workloads.serving import bench
from tuner.workloads.serving.config import ServingConfig, load
from tuner.workloads.serving.result import size, to_measurement
from tuner.workloads.serving.server import EngineFailed, EngineServer, healthy


_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.I)


class ServingWorkload(Untuned, Workload):
    name = "vllm"
    servers_kept = 2

    def __init__(self, cfg: ServingConfig):
        self.cfg = cfg
        self.engine = cfg.settings_engine()
        self.name = cfg.engine
        self.runtime: dict[str, Any] = {**self.engine.defaults(), **cfg.settings}
        self.servers: dict[str, EngineServer] = {}  # settings key -> running server, oldest first
        for k, v in cfg.env.items():  # a token in the server's environment never reaches a log
            if _SECRET.search(k):
                redact.remember(v)
        self.ports: list[int] = []  # of every server started, in order (each checked free at stop)

    # -- runtime settings: the engine's, as the registry declares them --------------------------
    def runtime_dims(self) -> dict[str, list[Any]]:
        if self.cfg.attach:
            return {}
        dims = self.engine.dims()
        return {k: dims[k] for k in self.cfg.search} if self.cfg.search else dims

    def runtime_settings(self) -> dict[str, Any]:
        return dict(self.runtime)

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        if self.cfg.attach and runtime:
            raise ValueError(f"runtime {sorted(runtime)}: attach mode measures a running endpoint "
                             "as it is; its engine settings are not changed")
        return self.engine.validate(runtime)

    def configure(self, runtime: Mapping[str, Any]) -> None:
        self.runtime = {**self.engine.defaults(), **self.engine.validate(runtime or {})}

    @staticmethod
    def public_env(env: Mapping[str, str]) -> dict[str, str]:
        """`env` as records show it: secret-looking variables' values masked."""
        return {k: redact.MASK if _SECRET.search(k) else v for k, v in env.items()}

    def launch(self) -> tuple[list[str], dict[str, str]]:
        """(server flags, server environment) for the settings in force."""
        flags, env = self.engine.launch(self.runtime)
        return [*self.cfg.flags, *flags], {**self.cfg.env, **env}

    # -- servers -------------------------------------------------------------------------------
    def _key(self) -> str:
        return repr(sorted(self.runtime.items(), key=lambda kv: kv[0]))

    def _server(self, timeout_s: Optional[float]) -> EngineServer:
        key = self._key()
        srv = self.servers.pop(key, None)
        if srv is not None and not srv.alive():
            srv.check_alive()  # EngineFailed("engine_crashed") with its log's end
        if srv is None:
            while len(self.servers) >= self.servers_kept:
                self.servers.pop(next(iter(self.servers))).close()
            flags, env = self.launch()
            srv = EngineServer(str(self.cfg.python()), str(self.cfg.model), flags, env,
                               start_timeout_s=min(self.cfg.start_timeout_s, timeout_s or 1e9))
            self.ports.append(srv.port)
            srv.start()  # EngineFailed: start failed or timed out; nothing left running
        self.servers[key] = srv  # the newest last
        return srv

    def _drop(self, key: str) -> None:
        srv = self.servers.pop(key, None)
        if srv is not None:
            srv.close()

    def close(self) -> None:
        """Stop every server; a leak one of them left is raised after all were stopped."""
        errors = []
        while self.servers:
            try:
                self.servers.pop(next(iter(self.servers))).close()
            except WorkloadFailed as e:
                errors.append(e)
        if errors:
            raise errors[0]

    # -- one measurement -----------------------------------------------------------------------
    def measure(self, repeats: int = 1, timeout_s: Optional[float] = None) -> Measurement:
        repeats = max(1, repeats)
        key = self._key()
        if self.cfg.attach:
            url, srv = self.cfg.attach, None
            if not healthy(url):
                raise WorkloadFailed(f"attach: {url}/health does not answer 200")
        else:
            srv = self._server(timeout_s)
            url = srv.url
        limit = self.cfg.bench_timeout_s * len(self.cfg.concurrency) * repeats
        t0 = time.monotonic()
        try:
            runs, watts, source = self._bench(url, repeats, min(limit, timeout_s or limit))
        except EngineFailed:
            if srv is not None and not srv.alive():
                self.servers.pop(key, None)
                srv.check_alive()  # the engine died under the client: engine_crashed
            raise
        if srv is not None and not srv.alive():
            self.servers.pop(key, None)
            srv.check_alive()
        flags, env = self.launch()
        extra = {"engine": self.engine.name, "settings": dict(self.runtime),
                 "server": {"attach": url} if srv is None else
                 {"flags": flags, "env": self.public_env(env), "ready_s": srv.ready_s},
                 "bench": {"input_len": self.cfg.input_len, "output_len": self.cfg.output_len,
                           "num_prompts": self.cfg.num_prompts, "ttft_ms": self.cfg.ttft_ms,
                           "tpot_ms": self.cfg.tpot_ms, "repeats": repeats},
                 "seconds": time.monotonic() - t0}
        return to_measurement(runs, extra, watts, source)

    def _bench(self, url: str, repeats: int, timeout_s: float
               ) -> tuple[list[dict[str, Any]], dict[str, float], str]:
        """The ladder's runs; where NVML has a board to read, one client per level, each level's
        mean watts read by this process over its own window."""
        meter = _meter()
        if meter is None:
            return bench.run(self.cfg, url, self.cfg.concurrency, repeats, timeout_s), {}, ""
        runs: list[dict[str, Any]] = []
        watts: dict[str, list[float]] = {}
        sources = set()
        try:
            for c in self.cfg.concurrency:
                meter.start()
                got = bench.run(self.cfg, url, [c], repeats, timeout_s)
                r = meter.stop()
                runs += got
                if r.mean_w:
                    watts.setdefault(size(c), []).append(r.mean_w)
                    sources.add(r.source)
        finally:
            meter.close()
        return runs, {k: sum(v) / len(v) for k, v in watts.items()}, min(sources) if sources else ""


def _meter() -> Any:
    """An EnergyMeter on GPU 0 where NVML answers (the real backend's boards), else None."""
    try:
        import pynvml  # noqa: F401 - optional

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, no GPU: nothing to read
        return None
    from kernelsearch.energy import EnergyMeter

    return EnergyMeter(0, keep_open=True)


def from_spec(spec: Any) -> ServingWorkload:
    """`vllm:<config.toml|yaml>` or `vllm:model=DIR[,key=value...]` (tuner.workloads.factory)."""
    return ServingWorkload(load(spec.args))
