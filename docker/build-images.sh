#!/usr/bin/env bash
# Builds inferd's CPU image with podman, without a registry: a Debian 12 minbase made here by mmdebstrap (cached
# under build/images, its package list checked against docker/base-packages.txt), imported as
# localhost/inferd-base:bookworm, then docker/Dockerfile on it as localhost/inferd:cpu. Installs podman,
# buildah, mmdebstrap and runc from Debian when missing.
#   bash docker/build-images.sh              BASE_ONLY=1 for the base alone
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

cache=build/images
mkdir -p "$cache"
if [[ ! -f $cache/bookworm-minbase.tar ]]; then
  mmdebstrap --quiet --variant=minbase --format=tar \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package} \${Version}\n" > "$1/tmp/packages.txt"' \
    --customize-hook='copy-out /tmp/packages.txt '"$cache" --customize-hook='rm "$1/tmp/packages.txt"' \
    bookworm "$cache/bookworm-minbase.tar.part"
  mv "$cache/bookworm-minbase.tar.part" "$cache/bookworm-minbase.tar"
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
podman import --quiet "$cache/bookworm-minbase.tar" localhost/inferd-base:bookworm >/dev/null
echo "build-images: localhost/inferd-base:bookworm ($(sha256sum "$cache/bookworm-minbase.tar" | cut -c1-16))"
[[ -n "${BASE_ONLY:-}" ]] && exit 0
podman build --quiet --format docker --network host --timestamp "$SOURCE_DATE_EPOCH" \
  --ignorefile docker/Dockerfile.dockerignore -f docker/Dockerfile -t localhost/inferd:cpu . \
  >/dev/null
podman images --format "build-images: {{.Repository}}:{{.Tag}} {{.Size}}" localhost/inferd:cpu
