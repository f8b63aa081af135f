#!/bin/sh
# The ABI cannot drift unnoticed: hashes the provider ABI's headers (sbx/abi/**/*.h under the
# include directory) and compares the hash with the one abi_hashes.txt records for the version
# version.h states. A header changed without a version bump, or a bump without its hash, fails
# and says what to do. (Envoy's dynamic modules hash abi.h the same way.)
#   check_abi_hash.sh INCLUDE_DIR HASHES_FILE
#   check_abi_hash.sh --print INCLUDE_DIR      the hash of the headers as they are
set -eu

headers_hash() { # include-dir: SHA-256 over each header's path and contents, in C-locale order
  (cd "$1" && find sbx/abi -name '*.h' | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -d' ' -f1
}

if [ "${1:-}" = --print ]; then
  headers_hash "$2"
  exit 0
fi
include=$1 hashes=$2
version_h=$include/sbx/abi/version.h
part() { sed -n "s/^#define SBX_ABI_VERSION_$1 \([0-9]*\)u.*/\1/p" "$version_h"; }
version="$(part MAJOR).$(part MINOR).$(part PATCH)"
hash=$(headers_hash "$include")

# The recorded lines (comments and blank lines left out), oldest first.
recorded=$(grep -v '^[[:space:]]*\(#\|$\)' "$hashes")
last_version=$(printf '%s\n' "$recorded" | tail -n 1 | cut -d' ' -f1)
last_hash=$(printf '%s\n' "$recorded" | tail -n 1 | cut -d' ' -f2)
status=0

# Each version once, in increasing order.
if ! printf '%s\n' "$recorded" | cut -d' ' -f1 | sort -c -t. -k1,1n -k2,2n -k3,3n -u 2>/dev/null; then
  echo "FAIL: $hashes: the versions must be unique and in increasing order"
  status=1
fi

if [ "$version" != "$last_version" ]; then
  echo "FAIL: version.h says ABI $version, but the last line of $hashes is for $last_version."
  echo "      Record the headers of $version there, in the same commit as the bump:"
  echo "      $version $hash"
  status=1
elif [ "$hash" != "$last_hash" ]; then
  echo "FAIL: the ABI headers changed, but version.h still says $version (recorded hash $last_hash,"
  echo "      the headers now hash to $hash). If the change is meant, bump the version in"
  echo "      sdk/include/sbx/abi/version.h (PATCH for comments only, MINOR for appended fields,"
  echo "      statuses or extensions, never MAJOR lightly: docs/abi/versioning.md) and add the line"
  echo "      '<new version> $hash' to $hashes in the same commit. A released version's line"
  echo "      never changes."
  status=1
fi
[ "$status" = 0 ] && echo "ABI $version: headers hash to the recorded $hash"
exit "$status"
