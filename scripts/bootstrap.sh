#!/usr/bin/env bash
# Set up everything metaltune needs on a fresh Debian machine, from the project's own files:
# the system packages its tests start as real peers, and a virtual environment in .venv with
# metaltune installed (editable) and the CPU build of torch (constraints/cpu.txt), never the
# multi-GB CUDA build a bare `torch` would pull. Safe to run again: it only adds what is missing.
#   bash scripts/bootstrap.sh [--engines]
# --engines also builds the serving engine's own environment (.venv-vllm: vLLM's CPU build,
# scripts/engine_env.sh), which the tests that start a real vLLM server need.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINES=0
for a in "$@"; do
  case "$a" in
    --engines) ENGINES=1 ;;
    *) echo "bootstrap: unknown option $a (expected --engines)" >&2; exit 2 ;;
  esac
done

# System packages: sshd (fleet tests), iproute2 (network namespaces), libvirt headers (the Redfish
# emulator's libvirt driver), pciutils (lspci decodes PCIe config dumps), systemd (systemd-analyze).
# grub-common (grub-editenv: the boot-trial tests write real grubenv files).
APT_PKGS=(openssh-server openssh-client iproute2 libvirt-dev pkg-config gcc pciutils systemd grub-common)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: apt-get install ${missing[*]}"
    # another apt (unattended-upgrades on a fresh machine) may hold the lock: wait up to 5 min,
    # then apt names the lock and the process holding it
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "bootstrap: not root (or no apt-get): skipping system packages; peer tests will skip" >&2
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned to the CPU build, then the project with its test extras under the same pin
.venv/bin/pip install -q -c constraints/cpu.txt "torch==$(sed -n 's/^torch==//p' constraints/cpu.txt)"
.venv/bin/pip install -q -c constraints/cpu.txt -e ".[test]"
# the H200's Triton, beside the venv's (never on its path): the Gluon kernels' compile check
# for sm_90 on a machine without a GPU (constraints/gluon.txt)
[ -d .venv/triton-gluon/triton ] || .venv/bin/pip install -q --no-deps --target .venv/triton-gluon \
  -r constraints/gluon.txt
[ "$ENGINES" = 1 ] && bash scripts/engine_env.sh
echo "bootstrap: ready (.venv)"
bash scripts/link_cli.sh  # `metaltune` on PATH (root: /usr/local/bin), or how to get it there
