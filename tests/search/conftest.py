"""The kernel search tests run candidates on Triton's interpreter (CPU), as tests/kernelsearch/
does: set before any kernel module is loaded."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
