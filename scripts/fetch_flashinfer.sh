#!/usr/bin/env bash
# Fetches FlashInfer's CUDA headers (Apache-2.0) from its PyPI wheel, checks the wheel's SHA-256, and extracts
# the headers, the CCCL they are built with and the CUTLASS they ship (BSD-3-Clause: include/ and
# tools/util/include/) into third_party/flashinfer (git-ignored). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.7.2.post1
SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
DEST=third_party/flashinfer
MARK="$SHA256 cutlass"  # what an extraction holds: an older one without CUTLASS is redone
if [[ "$(cat "$DEST/.sha256" 2>/dev/null)" == "$MARK" ]]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --disable-pip-version-check --no-deps "flashinfer-python==$VERSION" -d "$work"
wheel=$(ls "$work"/flashinfer_python-*.whl)
got=$(sha256sum "$wheel" | cut -d' ' -f1)
if [[ "$got" != "$SHA256" ]]; then
  echo "fetch_flashinfer: $wheel has SHA-256 $got, expected $SHA256" >&2
  exit 1
fi
python3 - "$wheel" "$work/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist()
                               if n.startswith(("flashinfer/data/include/", "flashinfer/data/cccl/",
                                                "flashinfer/data/cutlass/include/",
                                                "flashinfer/data/cutlass/tools/util/include/"))])
PY
rm -rf "$DEST" && mkdir -p "$DEST"
mv "$work/x/flashinfer/data/include" "$DEST/include"
mv "$work/x/flashinfer/data/cccl" "$DEST/cccl"
mkdir -p "$DEST/cutlass"
mv "$work/x/flashinfer/data/cutlass/include" "$DEST/cutlass/include"
mv "$work/x/flashinfer/data/cutlass/tools/util/include" "$DEST/cutlass/util_include"
echo "$MARK" > "$DEST/.sha256"
echo "fetch_flashinfer: flashinfer-python $VERSION headers in $DEST ($(du -sh "$DEST" | cut -f1))"
