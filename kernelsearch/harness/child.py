"""Child-process entry: `python -m kernelsearch.harness.child REQUEST.json RESULT.json`.
Runs the judge on one candidate and writes the verdict; anything worse (a crash, a hang, an
out-of-memory kill) is seen by the parent from the outside."""
from __future__ import annotations

import json
import os
import sys


def main() -> int:
    req_path, out_path = sys.argv[1], sys.argv[2]
    with open(req_path) as f:
        req = json.load(f)
    from kernelsearch.harness.judge import judge
    from kernelsearch.harness.timing import Ceilings

    ceil = req.pop("ceilings", None)
    req["ceilings"] = Ceilings(**ceil) if ceil else None
    gpu_mb = req.pop("gpu_mem_limit_mb", None)
    if gpu_mb and req.get("device") == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_mb * 2 ** 20 / total))
    source = req.pop("source")
    family = req.pop("family")
    config = req.pop("config", None)
    v = judge(family, source, config, **req)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(v.to_dict(), f)
    os.replace(tmp, out_path)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate objects may misbehave in finalisers


if __name__ == "__main__":
    sys.exit(main())
