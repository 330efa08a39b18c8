#!/usr/bin/env bash
# Put `metaltune` on PATH after bootstrap: as root, a symlink BIN_DIR/metaltune -> .venv/bin/metaltune
# (BIN_DIR: $METALTUNE_BIN_DIR, default /usr/local/bin); never over a file that is not such a
# link (another install's metaltune stays). Otherwise, one line saying how.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$PWD/.venv/bin/metaltune"
bin_dir=${METALTUNE_BIN_DIR:-/usr/local/bin}
link="$bin_dir/metaltune"
if [ ! -x "$target" ]; then
  echo "bootstrap: $target is missing: run scripts/bootstrap.sh first" >&2
  exit 1
fi
if [ -e "$link" ] && [ ! -L "$link" ]; then
  echo "bootstrap: $link exists and is not a link: left alone; run $target (or put $PWD/.venv/bin on PATH)"
elif [ -w "$bin_dir" ] || [ "$(id -u)" = 0 ] && [ -d "$bin_dir" ]; then
  ln -sfn "$target" "$link"
  echo "bootstrap: metaltune is on PATH ($link -> $target)"
else
  echo "bootstrap: to run \`metaltune\`: export PATH=\"$PWD/.venv/bin:\$PATH\" (or run $target)"
fi
