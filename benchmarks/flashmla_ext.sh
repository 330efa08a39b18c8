# Sourced by the H200 library scripts: `flashmla_ext BUILD [PYTHON]` prints the FlashMLA parts
# the kit's build_flashmla.sh built in BUILD (their .so files, ':'-joined, the form
# $METALTUNE_FLASHMLA_EXT takes: kernelsearch.libraries), skipping parts whose build failed.
flashmla_ext() {
  "${2:-python3}" - "$1" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
sos = []
for p in ("dense", "sparse_bf16", "sparse_fp8"):
    try:
        r = json.loads((d / f"{p}.json").read_text())
    except Exception:
        continue
    if r.get("ok"):
        sos.append(r["so"])
print(":".join(sos))
PY
}
