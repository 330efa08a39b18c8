"""`metaltune compare`: the same benchmark suite and host facts on several targets (this host, a
remote host over SSH, a simulated host), and a side-by-side report with ratios and confidence
intervals. The suite runs in a child process (`python -m tuner.compare.run --json`) so that the
CLI never imports torch, and so that the very same code runs locally and on a remote target.

Modules: `stats` (summaries, bootstrap/Welch), `facts` (host facts), `suite` (real benchmarks),
`simbench` (numbers for a simulated host), `run` (the child), `targets` (where a child runs),
`report` (Markdown, HTML, PNG, JSON). The child needs only the standard library plus what a GPU
host already has (torch, numpy, optionally pynvml): no pydantic, paramiko or typer.
"""
