#!/usr/bin/env bash
# fuzz.sh — fuzzes the parsers of bytes that come from outside (fuzz/README.md) for a bounded
# time: builds fuzz/ with clang's libFuzzer, ASan and UBSan in build-fuzz/ (on its own, `cmake -S
# fuzz`), then runs each target for SECONDS from its corpus in the tree. New inputs go to a
# temporary directory, never into the tree. A crash, a leak or a sanitizer report fails it; the
# input is left in build-fuzz/findings/<target>/, to be fixed and added to fuzz/corpus/<target>/
# as a regression (the presets' ctest fuzz_<target> runs the corpus).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (default: 30 s each, every target)
# Environment: SBX_FUZZ_JOBS=N build parallelism (default: nproc)
set -Eeuo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

seconds=${1:-30}
shift || true
[[ ${seconds} =~ ^[0-9]+$ && ${seconds} -gt 0 ]] || { echo "fuzz.sh: SECONDS must be a positive number" >&2; exit 2; }
clang=$(command -v clang++-14 || command -v clang++ || true)
[[ -n ${clang} ]] || { echo "fuzz.sh: no clang++ (scripts/install-deps.sh installs clang-14)" >&2; exit 1; }
cc=${clang/clang++/clang}

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
build=build-fuzz
cmake -S fuzz -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER="${cc}" \
  -DCMAKE_CXX_COMPILER="${clang}" "${launcher[@]}" >/dev/null
cmake --build "${build}" --parallel "${SBX_FUZZ_JOBS:-$(nproc)}"

if (($# > 0)); then
  targets=("$@")
else
  mapfile -t targets < <(sed -n 's/^sbx_fuzz_target(\([a-z_]*\).*/\1/p' fuzz/CMakeLists.txt)
fi
work=$(mktemp -d /tmp/sbx-fuzz.XXXXXX)
trap 'rm -rf "${work}"' EXIT
failed=()
for target in "${targets[@]}"; do
  corpus=fuzz/corpus/${target}
  [[ -d ${corpus} ]] || { echo "fuzz.sh: no corpus ${corpus}" >&2; exit 2; }
  findings=${build}/findings/${target}
  mkdir -p "${work}/${target}" "${findings}"
  printf '==> fuzz_%s for %s s\n' "${target}" "${seconds}"
  # New inputs into the temporary directory (first corpus argument); the tree's corpus is read.
  if ! "${build}/fuzz_${target}" "${work}/${target}" "${corpus}" -max_total_time="${seconds}" \
    -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="${findings}/" >"${work}/${target}.log" 2>&1; then
    tail -n 60 "${work}/${target}.log"
    failed+=("${target}")
  else
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "${work}/${target}.log" || true
  fi
done
if ((${#failed[@]} > 0)); then
  printf 'fuzz.sh: ERROR: findings in: %s (inputs in %s/findings/)\n' "${failed[*]}" "${build}" >&2
  exit 1
fi
printf 'fuzz.sh: %s target(s) fuzzed %s s each, nothing found\n' "${#targets[@]}" "${seconds}"
