"""The verified loop and what it calls: propose -> gate -> measure -> keep or roll back.

- `loop.run` (the while loop), `gates` (cheap checks first, each with a failure code),
  `store` (the trial store), `keep` (the keep rule, with the per-size veto),
  `safety_context` (the policy, journal and transaction every host change goes through);
- the evaluators and the searches built on them: `host/` (knob values), `runtime` (runtime
  settings of the holistic workload), `kernel` (kernel candidates through kernelsearch's
  harness), `mixed/` (all three in one search); `demo` runs the whole loop on a simulated host.
"""
