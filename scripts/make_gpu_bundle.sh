#!/usr/bin/env bash
# Builds the GPU-machine bundle here (sm_90a, Release) as .bundle/bundle.tar.xz: binaries in bin/, the non-system
# shared libraries they need in lib/ (gRPC, protobuf, abseil, spdlog, yaml-cpp, openblas, ...). The GPU
# machine has CUDA, cuBLAS and libstdc++ but none of Debian's C++ libraries.
#   bash scripts/make_gpu_bundle.sh    then, on the device:  bash scripts/gpu_run.sh
# INFERD_CUDA_ARCHS picks the code it carries (CMake's CUDA_ARCHITECTURES; default 90a, the Hopper host's): e.g.
# 80-virtual or 89-virtual, PTX for compute_80 or compute_89 alone, which a Hopper GPU's driver compiles at load, to
# run the Ampere or Ada code path on an H100; inferd-all, every generation's (as the CUDA image; about seven times
# the device code and compile time). Each choice builds in a directory of its own (build-gpu, build-gpu-80-virtual,
# ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
archs=${INFERD_CUDA_ARCHS:-90a}
build=build-gpu && [[ $archs != 90a ]] && build="build-gpu-${archs//[^0-9a-z-]/_}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERD_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" >/dev/null
cmake --build "$build" --target inferd core_tests engine_tests gpu_tests bench_rms_norm inferd-bench
B=$build/bundle
rm -rf "$B" && mkdir -p "$B/bin" "$B/lib"
cp "$build"/server/inferd "$build"/tests/core_tests "$build"/tests/engine_tests "$build"/tests/gpu_tests \
   "$build"/tools/bench_rms_norm "$build"/tools/inferd-bench "$B/bin/"
strip "$B"/bin/*
# System and CUDA libraries are on the device already; everything else travels.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libnvidia|libnccl)'
for bin in "$B"/bin/*; do
  ldd "$bin" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -f "$B/lib/$name" ]] || cp -L "$path" "$B/lib/$name"
  done
done
# Python gRPC stubs for the black-box tests (the GPU machine has grpcio but not grpcio-tools).
mkdir -p "$B/pystubs"
.venv/bin/python -m grpc_tools.protoc -Iproto --python_out="$B/pystubs" --grpc_python_out="$B/pystubs" \
  proto/inferd/v1/inferd.proto
cp -r .venv/lib/python3*/site-packages/grpc_health "$B/pystubs/"
# Compressed, it travels well under the device tool's 64 MiB limit (OpenBLAS alone is 36 MB).
mkdir -p .bundle && rm -f .bundle/bundle.tar.xz  # base.tar.xz, the build before for A/B runs, stays
tar -C "$B" -cJf .bundle/bundle.tar.xz bin lib pystubs
du -sh .bundle/bundle.tar.xz
