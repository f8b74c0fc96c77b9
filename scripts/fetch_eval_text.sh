#!/usr/bin/env bash
# Writes the text `inferd-bench perplexity` measures accuracy on: Genesis and Exodus of the King James Version
# (1611; its copyright has expired), as printed by the Debian package bible-kjv (scripts/setup.sh installs it),
# one paragraph per chapter, verse numbers removed. Checks the result's SHA-256. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

TEXT=models/eval/kjv-genesis-exodus.txt
TEXT_SHA256=cf0421927819ddcb56b5727a1c1a3cd05ef4f9e4852d8c1d14dd908240759247

if [[ -f "$TEXT" ]] && echo "$TEXT_SHA256  $TEXT" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
command -v bible >/dev/null || { echo "fetch_eval_text: the 'bible' program (Debian package bible-kjv) is missing; run scripts/setup.sh" >&2; exit 1; }
mkdir -p models/eval
# bible prints "Genesis 1" and then "  N verse" lines; a chapter becomes "Genesis 1" and one paragraph of its verses.
bible -l0 "Genesis1:1-50:26" "Exodus1:1-40:38" </dev/null 2>/dev/null | awk '
  /^(Genesis|Exodus) [0-9]+$/ { if (para != "") print para "\n"; print $0 "\n"; para = ""; next }
  /^ *[0-9]+ / { sub(/^ *[0-9]+ /, ""); para = (para == "" ? $0 : para " " $0); next }
  END { if (para != "") print para }' > "$TEXT.part"
mv "$TEXT.part" "$TEXT"
echo "$TEXT_SHA256  $TEXT" | sha256sum -c --quiet - || { echo "fetch_eval_text: $TEXT does not match its recorded SHA-256" >&2; exit 1; }
echo "fetch_eval_text: $TEXT verified ($(wc -c <"$TEXT") bytes)"
