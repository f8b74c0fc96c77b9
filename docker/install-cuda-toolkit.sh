#!/usr/bin/env bash
# Lays out the CUDA toolkit inferd builds with (nvcc, its headers, CCCL, cudart, cuBLAS/cuBLASLt, NVTX, NCCL) under
# PREFIX from NVIDIA's PyPI wheels in WHEEL_DIR, each checked against its version and SHA-256 in
# docker/cuda-wheels.txt first (build-images.sh downloads them). The wheels hold nvidia/cu13/{bin,include,lib,nvvm}
# (NCCL's: nvidia/nccl/lib, moved beside the others); nvcc looks for targets/x86_64-linux and CMake for the
# lib*.so links. Needs unzip and sha256sum only.
#   bash docker/install-cuda-toolkit.sh WHEEL_DIR PREFIX
set -euo pipefail
wheels=$1
prefix=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while read -r pin hash; do
  [[ -z $pin || $pin == \#* ]] && continue
  name=${pin%%==*}
  version=${pin#*==}
  want=${hash#--hash=sha256:}
  files=("$wheels/${name//-/_}-$version-"*.whl)
  [[ ${#files[@]} -eq 1 && -f ${files[0]} ]] || { echo "install-cuda-toolkit: no single wheel for $pin in $wheels" >&2; exit 1; }
  got=$(sha256sum "${files[0]}" | cut -d' ' -f1)
  [[ $got == "$want" ]] || { echo "install-cuda-toolkit: ${files[0]} has SHA-256 $got, expected $want" >&2; exit 1; }
  if [[ $name == nvidia-nccl-* ]]; then
    unzip -q -o "${files[0]}" 'nvidia/nccl/lib/*' -d "$work"
    mkdir -p "$work/nvidia/cu13/lib" && mv "$work"/nvidia/nccl/lib/* "$work/nvidia/cu13/lib/"
  else
    unzip -q -o "${files[0]}" 'nvidia/cu13/*' -d "$work"
  fi
done < "$(dirname "$0")/cuda-wheels.txt"
rm -rf "$work/nvidia/cu13/.metadata"
mkdir -p "$prefix"
cp -a "$work/nvidia/cu13/." "$prefix/"
cd "$prefix"
ln -sfn lib lib64
mkdir -p targets/x86_64-linux
ln -sfn ../../include targets/x86_64-linux/include
ln -sfn ../../lib targets/x86_64-linux/lib
for so in lib/lib*.so.[0-9]*; do
  ln -sfn "$(basename "$so")" "${so%%.so.*}.so"
done
echo "install-cuda-toolkit: $("$prefix/bin/nvcc" --version | tail -n 2 | head -n 1) in $prefix ($(du -sh . | cut -f1))"
