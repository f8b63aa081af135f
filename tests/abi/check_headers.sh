#!/usr/bin/env bash
# Each ABI header compiles on its own as C11 and as C++20, warnings as errors.
# Usage: check_headers.sh <c compiler> <c++ compiler> <sdk include dir>
set -euo pipefail
cc=$1 cxx=$2 include=$3
count=0
while IFS= read -r header; do
  rel=${header#"$include"/}
  "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c "$header"
  "$cxx" -std=c++20 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c++ "$header"
  printf 'ok  %s\n' "$rel"
  count=$((count + 1))
done < <(find "$include/sbx/abi" "$include/sbx/abi.h" -name '*.h' | sort)
[[ $count -ge 9 ]] || { echo "expected at least 9 ABI headers, found $count" >&2; exit 1; }
