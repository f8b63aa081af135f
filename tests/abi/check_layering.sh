#!/usr/bin/env bash
# Plugins depend on sdk/ only: no file under sdk/, plugins/ or tests/plugins/ includes a core
# header, and no plugin target links the core library. The host depends on the SDK's layer-neutral
# parts only: core/ includes sbx/abi.h, sbx/abi/* and sbx/base/* from sdk/, never sbx/sdk/*, and
# names no sdk:: type (it never catches sdk::Error); sdk/base/ includes nothing of sbx/sdk/ either.
# The apps beside core/ (cli/, serve/, conformance/) hold to the same and use core/ through its
# public headers (sbx/core/*, sbx/sbx.hpp) only, never a file of core/src/.
# Usage: check_layering.sh <repo root> <file listing "target: link libraries" per plugin>
set -euo pipefail
root=$1 links=$2
host=("$root/core" "$root/cli" "$root/serve" "$root/conformance")
bad=$(grep -rnE '#\s*include\s*[<"](sbx/core/|sbx/sbx\.hpp|core/)' \
  "$root/sdk" "$root/plugins" "$root/tests/plugins" || true)
if [[ -n "$bad" ]]; then
  printf 'core headers included from plugin-side code:\n%s\n' "$bad" >&2
  exit 1
fi
bad=$(grep -rnE '#\s*include\s*[<"]sbx/sdk/' "${host[@]}" "$root/sdk/base" \
  "$root/sdk/include/sbx/base" || true)
if [[ -n "$bad" ]]; then
  printf 'SDK headers included from the host or from sbx::base (use sbx/base/*):\n%s\n' "$bad" >&2
  exit 1
fi
bad=$(grep -rnE --include='*.cpp' --include='*.hpp' --include='*.h' '\bsdk::' "${host[@]}" \
  "$root/sdk/base" "$root/sdk/include/sbx/base" | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [[ -n "$bad" ]]; then
  printf 'SDK names used in the host or in sbx::base:\n%s\n' "$bad" >&2
  exit 1
fi
bad=$(grep -rnE --include='CMakeLists.txt' '\bsbx(::|_)sdk\b' "${host[@]}" || true)
if [[ -n "$bad" ]]; then
  printf 'the host links the SDK (link sbx::base instead):\n%s\n' "$bad" >&2
  exit 1
fi
bad=$(grep -rnE '#\s*include\s*"[^"]*(src/|internal\.hpp|abi_glue\.hpp)' "$root/cli" "$root/serve" \
  "$root/conformance" || true)
if [[ -n "$bad" ]]; then
  printf 'an app includes core internals (use the public headers):\n%s\n' "$bad" >&2
  exit 1
fi
[[ -s "$links" ]] || { echo "no plugin link information in $links" >&2; exit 1; }
if grep -E 'sbx_core|sbx::core' "$links"; then
  echo "a plugin links the core library" >&2
  exit 1
fi
cat "$links"
echo "ok: $(wc -l < "$links") plugin targets link sdk only"
