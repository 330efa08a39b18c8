"""metaltune's kernels as a local layer repository of the `kernels` package (what
`kernels.LocalLayerRepository(repo_path=<this folder>, layer_name=...)` loads): the layers
transformers marks with `use_kernel_forward_from_hub`, computed by metaltune's torch custom ops
(the dispatch table picks the kernel per shape; torch outside it). Loaded by
`kernelsearch.integrations.transformers.use_kernels`."""
from . import layers  # noqa: F401  (what `kernels` looks up: <package>.layers.<layer_name>)
