"""The serving workload (`--workload vllm:...`): a serving engine started as its user starts it, in
its own environment (vLLM never becomes a dependency of metaltune's core), driven by the engine's
own bench client over a concurrency ladder, read from the client's JSON result.

- config.py: what the user writes (a TOML/YAML file or inline key=value), validated by pydantic;
- engines.py: the engine settings a search may change, per engine, with their domains;
- server.py: the engine server as a child process group that dies with its parent;
- bench.py: the bench client run with the engine's python, its JSON result read back;
- result.py: bench results into a Measurement (per size: output tok/s, goodput, latencies);
- workload.py: the Workload a search or `compare` holds (servers per engine setting, attach mode).
docs/serving.md is the user's page."""
