"""Host search: knob values through the safety transaction (`evaluator`), and the search that
runs them through the loop (`run`: `search host` and the demo)."""
