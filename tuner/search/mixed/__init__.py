"""Mixed search: host knobs, runtime settings and kernel choices in one joint space (`space`),
one evaluator over the three kinds (`evaluator`), and the search (`run`: `search mixed`)."""
