"""The metaltune daemon: a small resident root service (issue 7).

Pieces, one job each: `config` (TOML + pydantic), `notify` (sd_notify), `logs` (key=value lines on
stdout for the journal), `server` / `client` (the root-only control socket), `metrics` (opt-in
Prometheus endpoint), `schedule` (when a search may run), `service` (the main loop).

Nothing here imports torch, triton or optuna: searches run in child processes.
"""
