"""`metaltune fleet`: run metaltune on many hosts over SSH (paramiko, host keys verified), and roll
a profile out in waves with canaries, probation, health checks, halt-and-rollback and resume.

Modules: `ssh` (connections, commands, host-key policy), `inventory` (the YAML inventory, pydantic),
`remote` (how a metaltune command is run on a host), `rollout` (waves, state file), `summary`
(rich tables)."""
