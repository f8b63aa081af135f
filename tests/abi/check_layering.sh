#!/usr/bin/env bash
# Plugins depend on sdk/ only: no file under sdk/, plugins/ or tests/plugins/ includes a core
# header, and no plugin target links the core library.
# Usage: check_layering.sh <repo root> <file listing "target: link libraries" per plugin>
set -euo pipefail
root=$1 links=$2
bad=$(grep -rnE '#\s*include\s*[<"](sbx/core/|sbx/sbx\.hpp|core/)' \
  "$root/sdk" "$root/plugins" "$root/tests/plugins" || true)
if [[ -n "$bad" ]]; then
  printf 'core headers included from plugin-side code:\n%s\n' "$bad" >&2
  exit 1
fi
[[ -s "$links" ]] || { echo "no plugin link information in $links" >&2; exit 1; }
if grep -E 'sbx_core|sbx::core' "$links"; then
  echo "a plugin links the core library" >&2
  exit 1
fi
cat "$links"
echo "ok: $(wc -l < "$links") plugin targets link sdk only"
