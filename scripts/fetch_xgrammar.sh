#!/usr/bin/env bash
# Fetches xgrammar's source distribution (Apache-2.0: the C++ grammar engine behind structured output) from PyPI,
# checks its SHA-256, and extracts the C++ library's parts (include/, cpp/ without its Python bindings, the
# picojson and dlpack headers, CMake files) into third_party/xgrammar (git-ignored). CMakeLists.txt builds it as a
# static library. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.2.8
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
URL=https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-$VERSION.tar.gz
DEST=third_party/xgrammar
if [[ "$(cat "$DEST/.sha256" 2>/dev/null)" == "$SHA256" ]]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$URL" "$work/xgrammar.tar.gz" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=120) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
PY
got=$(sha256sum "$work/xgrammar.tar.gz" | cut -d' ' -f1)
if [[ "$got" != "$SHA256" ]]; then
  echo "fetch_xgrammar: xgrammar-$VERSION.tar.gz has SHA-256 $got, expected $SHA256" >&2
  exit 1
fi
tar -C "$work" -xzf "$work/xgrammar.tar.gz" "xgrammar-$VERSION/include" "xgrammar-$VERSION/cpp" \
  "xgrammar-$VERSION/3rdparty/picojson" "xgrammar-$VERSION/3rdparty/dlpack/include" "xgrammar-$VERSION/LICENSE" \
  "xgrammar-$VERSION/NOTICE"
rm -rf "$DEST" && mkdir -p "$(dirname "$DEST")"
mv "$work/xgrammar-$VERSION" "$DEST"
echo "$SHA256" > "$DEST/.sha256"
echo "fetch_xgrammar: xgrammar $VERSION sources in $DEST ($(du -sh "$DEST" | cut -f1))"
