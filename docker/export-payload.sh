#!/usr/bin/env bash
# Packs the CUDA image's root filesystem for a GPU host without a container runtime (scripts/gpu_run.sh image runs
# it there in a chroot, as the NVIDIA runtime would run the container): the image's files as they are, less its
# CUDA libraries (the host has them at the same version: their SHA-256 travel to check that) and the bundled
# SmolLM2 (the check serves the 8B-shaped model), plus Python gRPC stubs for the outside client.
#   bash docker/build-images.sh cuda && bash docker/export-payload.sh    → .image-payload/payload.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/docker/containers.conf"
image=${1:-localhost/inferd:cuda}
[[ -x .venv/bin/python ]] || bash scripts/setup.sh   # grpcio-tools for the stubs
work=$(mktemp -d)
cid=$(podman create "$image")
trap 'podman rm -f "$cid" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
mkdir -p "$work/rootfs" "$work/pystubs"
podman export "$cid" | tar -C "$work/rootfs" -x --numeric-owner
( cd "$work/rootfs" && sha256sum usr/local/cuda/lib/*.so.* ) > "$work/cuda-libs.sha256"
rm -f "$work"/rootfs/usr/local/cuda/lib/*.so.* "$work"/rootfs/models/*.gguf
.venv/bin/python -m grpc_tools.protoc -Iproto --python_out="$work/pystubs" --grpc_python_out="$work/pystubs" \
  proto/inferd/v1/inferd.proto
cp -r .venv/lib/python3*/site-packages/grpc_health "$work/pystubs/"
rm -rf .image-payload && mkdir -p .image-payload
tar -C "$work" --numeric-owner -c rootfs pystubs cuda-libs.sha256 | xz -T0 -6 > .image-payload/payload.tar.xz
echo "export-payload: $image less its CUDA libraries and model: $(du -sh "$work/rootfs" | cut -f1)," \
  "$(du -h .image-payload/payload.tar.xz | cut -f1) packed"
