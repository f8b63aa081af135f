#!/usr/bin/env bash
# Every plugin exports exactly one dynamic symbol: sbx_plugin_entry.
# Usage: check_exports.sh <plugin.so>...
set -euo pipefail
[[ $# -gt 0 ]] || { echo "no plugins given" >&2; exit 1; }
status=0
for plugin in "$@"; do
  symbols=$(nm -D --defined-only "$plugin" | awk '{print $3}')
  if [[ "$symbols" == "sbx_plugin_entry" ]]; then
    printf 'ok  %s\n' "$plugin"
  else
    printf 'FAIL %s exports:\n%s\n' "$plugin" "$symbols" >&2
    status=1
  fi
done
exit $status
