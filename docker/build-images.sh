#!/usr/bin/env bash
# Builds inferd's images with podman, without a registry: a Debian 12 minbase made here by mmdebstrap (cached
# under build/images, its package list checked against docker/base-packages.txt), imported as
# localhost/inferd-base:bookworm, then docker/Dockerfile on it as localhost/inferd:cpu and localhost/inferd:cuda
# (the CUDA toolkit from pinned PyPI wheels; compiling the kernels takes a while on few cores, ccache keeps it).
# Each image's packages are checked against docker/image-packages.txt. Installs podman, buildah, mmdebstrap and
# runc from Debian when missing.
#   bash docker/build-images.sh [cpu] [cuda]     (default both; BASE_ONLY=1 for the base alone)
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/docker/containers.conf"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1732406400}  # 2024-11-24: the base's files and dates are fixed
need=()
for p in podman buildah mmdebstrap runc uidmap containernetworking-plugins; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]] || bash scripts/fetch_model.sh
bash scripts/fetch_xgrammar.sh  # structured output's grammar engine, built into inferd (checked by its SHA-256)
bash scripts/fetch_ggml.sh      # llama.cpp's ggml: the cpu backend's kernels over GGUF's blocks (SHA-256 checked)

cache=build/images
mkdir -p "$cache"
# Slim as Debian's own slim images: no manual pages, translations or documentation but the copyright files (the
# setting stays in the base's dpkg configuration, so the packages installed on it later leave them out too).
slim=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')
base=$cache/bookworm-minbase-$(echo "${slim[*]}" | sha256sum | cut -c1-8).tar
if [[ ! -f $base ]]; then
  mmdebstrap --quiet --variant=minbase --format=tar "${slim[@]}" \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package} \${Version}\n" > "$1/tmp/packages.txt"' \
    --customize-hook='copy-out /tmp/packages.txt '"$cache" --customize-hook='rm "$1/tmp/packages.txt"' \
    bookworm "$base.part"
  mv "$base.part" "$base"
fi
# The base is what the committed manifest says, or the build stops: Debian's archive moved on (review the list
# above and commit it as docker/base-packages.txt). INFERD_BASE_DRIFT=warn goes on with a warning instead (CI:
# the archive moves between a commit and its test, and no snapshot of it is reachable from here).
if ! diff -u docker/base-packages.txt "$cache/packages.txt" >&2; then
  if [[ "${INFERD_BASE_DRIFT:-}" != warn ]]; then
    echo "build-images: the minbase's packages differ from docker/base-packages.txt (above)" >&2
    exit 1
  fi
  echo "build-images: warning: the minbase's packages differ from docker/base-packages.txt (above)" >&2
fi
previous=$(podman image inspect --format '{{.Id}}' localhost/inferd-base:bookworm 2>/dev/null || true)
podman import --quiet "$base" localhost/inferd-base:bookworm >/dev/null
# Each import is a new image: the one it replaced goes, unless an image still built on it keeps it.
current=$(podman image inspect --format '{{.Id}}' localhost/inferd-base:bookworm)
[[ -z $previous || $previous == "$current" ]] || podman rmi "$previous" >/dev/null 2>&1 || true
echo "build-images: localhost/inferd-base:bookworm ($(sha256sum "$base" | cut -c1-16))"
[[ -n "${BASE_ONLY:-}" ]] && exit 0
variants=("$@")
((${#variants[@]})) || variants=(cpu cuda)
if [[ " ${variants[*]} " == *" cuda "* ]]; then
  # The CUDA image's inputs, checked here: the toolkit's wheels (pip checks each against its pinned SHA-256 and
  # keeps what it has) and FlashInfer's headers.
  python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes -r docker/cuda-wheels.txt \
    -d "$cache/cuda-wheels"
  bash scripts/fetch_flashinfer.sh
fi
for variant in "${variants[@]}"; do
  [[ $variant == cpu || $variant == cuda ]] || { echo "build-images: unknown variant '$variant' (cpu, cuda)" >&2; exit 2; }
  begin=$SECONDS
  podman build --quiet --format docker --network host --timestamp "$SOURCE_DATE_EPOCH" \
    --build-arg VARIANT="$variant" --ignorefile docker/Dockerfile.dockerignore -f docker/Dockerfile \
    -t "localhost/inferd:$variant" . >/dev/null
  # The untagged images the build left (its stages, the image the tag pointed at before): 1.6 GB a build, which
  # filled the disk of a machine that builds on every commit. ccache's cache mount, which makes the next build
  # fast, is not an image and stays.
  podman image prune -f --filter label=org.inferd.built-by=build-images >/dev/null
  # What the runtime stage installed from Debian, against the committed list (drift as for the base).
  podman run --rm --network none --entrypoint dpkg-query "localhost/inferd:$variant" -W -f '${Package} ${Version}\n' \
    > "$cache/image-packages.txt"
  if ! diff -u docker/image-packages.txt "$cache/image-packages.txt" >&2; then
    [[ "${INFERD_BASE_DRIFT:-}" == warn ]] || {
      echo "build-images: localhost/inferd:$variant's packages differ from docker/image-packages.txt (above)" >&2
      exit 1
    }
    echo "build-images: warning: localhost/inferd:$variant's packages differ from docker/image-packages.txt" >&2
  fi
  # The layers' digest: the same on a rebuild from the same commit, base and wheels (compare to check).
  layers=$(podman inspect --format '{{.RootFS.Layers}}' "localhost/inferd:$variant" | sha256sum | cut -c1-16)
  podman images --format "build-images: {{.Repository}}:{{.Tag}} {{.Size}}, layers $layers (built in $((SECONDS - begin)) s)" \
    "localhost/inferd:$variant"
done
