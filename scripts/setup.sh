#!/usr/bin/env bash
# Installs everything inferd needs to build, test and serve on Debian 12. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  prometheus-cpp-dev libcpp-httplib-dev prometheus libboost1.81-dev libssl-dev libzmq3-dev cppzmq-dev libmsgpuck-dev
  python3-venv clang libclang-rt-14-dev bible-kjv
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python environment for the black-box tests and tools (real gRPC client, fixtures).
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
want=$(sha256sum tools/requirements.txt | cut -d' ' -f1)
if [[ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$want" ]]; then
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements.txt
  echo "$want" > .venv/.requirements.sha256
fi
# FlashInfer headers for the CUDA backend (attention).
bash scripts/fetch_flashinfer.sh
# xgrammar's C++ sources (structured output: JSON schemas, regexes, grammars).
bash scripts/fetch_xgrammar.sh
# ggml's sources from llama.cpp (the cpu backend's kernels over GGUF's quantized formats).
bash scripts/fetch_ggml.sh
# The bundled default model (configs/default.yaml serves it), and Gemma 3 270M, whose parity with transformers
# the tests check (Gemma terms of use; fetched, never committed).
bash scripts/fetch_model.sh
bash scripts/fetch_model.sh gemma3-270m
# The public-domain text `inferd-bench perplexity` measures accuracy on (the King James Version's Genesis and Exodus).
bash scripts/fetch_eval_text.sh
echo "setup: ok"
