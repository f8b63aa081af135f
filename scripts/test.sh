#!/usr/bin/env bash
# test.sh — runs every test: installs dependencies, brings up Docker, the
# test images and the local registry (scripts/docker-up.sh), then for each
# CMake preset configures, builds and runs ctest; finally fails if a Docker
# container labelled sbx.sandbox was left behind. After the default preset's
# tests, scripts/kit-test.sh checks the install, the Debian packages and the
# out-of-tree examples. The default preset also builds the Python package's
# module and runs its tests (python/, in a venv from scripts/python-env.sh), and
# scripts/python-wheel-test.sh builds the wheel and runs it installed.
# While a preset's tests run (they mostly wait on Docker and on time: about
# half the CPU is idle), the next preset is configured and built beside them at
# the lowest priority (nice 19), so the tests keep the CPU they ask for.
# Beside the last preset's tests, scripts/fuzz.sh fuzzes the parsers of what sandboxes send
# (fuzz/) for a bounded time. Stops at the first failure.
#
# Usage: scripts/test.sh [PRESET...]      (default: default asan tsan)
# Environment:
#   SBX_PRESETS="default"    presets to run when none are given as arguments
#   SBX_JOBS=N               build parallelism (default: nproc)
#   SBX_CTEST_JOBS=N         tests run in parallel (default: 2)
#   SBX_CTEST_TIMEOUT=S      per-test timeout in seconds (default: 900)
#   SBX_KEEP_LEFTOVERS=1     do not remove leaked sbx.sandbox containers
#   SBX_OVERLAP_BUILDS=0     build each preset only after the previous one's tests
#   SBX_FUZZ=0               no fuzzing run (scripts/fuzz.sh) beside the last preset's tests
#   SBX_FUZZ_SECONDS=S       how long it fuzzes each target (default: 20)
set -Eeuo pipefail
trap 'printf "test.sh: ERROR: failed at line %s: %s\n" "${LINENO}" "${BASH_COMMAND}" >&2' ERR

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'test.sh: ERROR: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

if (($# > 0)); then
  presets=("$@")
else
  read -r -a presets <<<"${SBX_PRESETS:-default asan tsan}"
fi
((${#presets[@]} > 0)) || die "no presets to run"
jobs=${SBX_JOBS:-$(nproc)}
ctest_jobs=${SBX_CTEST_JOBS:-2}
ctest_timeout=${SBX_CTEST_TIMEOUT:-900}

step "install dependencies (scripts/install-deps.sh)"
scripts/install-deps.sh

step "Docker daemon, test images, local registry (scripts/docker-up.sh)"
scripts/docker-up.sh

if [[ -x /usr/bin/docker ]]; then docker=/usr/bin/docker; else docker=docker; fi
docker_ps_sandboxes() { "${docker}" -H unix:///var/run/docker.sock ps -aq --no-trunc --filter label=sbx.sandbox; }

# Containers from earlier (e.g. killed) runs or from other sessions on this
# machine are not this run's leaks: remember them and ignore them at the end.
preexisting=$(docker_ps_sandboxes | sort)
if [[ -n ${preexisting} ]]; then
  printf 'test.sh: note: %s sbx.sandbox container(s) already exist and are ignored by the leak check:\n' \
    "$(wc -l <<<"${preexisting}")"
  "${docker}" -H unix:///var/run/docker.sock ps -a --filter label=sbx.sandbox \
    --format '  {{.ID}} {{.Image}} {{.Status}} {{.Names}}'
fi

launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR=${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}
  # The build directory is not part of a compile's key: the Python wheel's build of the same
  # sources (scripts/python-wheel-test.sh) hits what the presets compiled.
  export CCACHE_NOHASHDIR=1
  mkdir -p "${CCACHE_DIR}"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  printf 'test.sh: using ccache (CCACHE_DIR=%s)\n' "${CCACHE_DIR}"
fi

# GCC's ThreadSanitizer cannot map its shadow memory with more than 28 bits
# of mmap randomization ("unexpected memory mapping").
if [[ " ${presets[*]} " == *" tsan "* ]]; then
  rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
  if ((rnd_bits > 28)); then
    if [[ ${EUID} -eq 0 ]]; then
      printf 'test.sh: lowering vm.mmap_rnd_bits from %s to 28 for TSan\n' "${rnd_bits}"
      sysctl -qw vm.mmap_rnd_bits=28
    else
      printf 'test.sh: warning: vm.mmap_rnd_bits=%s; TSan may fail (run: sudo sysctl -w vm.mmap_rnd_bits=28)\n' "${rnd_bits}" >&2
    fi
  fi
fi

# A daemon that stops answering would otherwise cost every Docker test its whole
# timeout (over an hour in all): every 30 s a watchdog runs a container; after
# three failures in a row (each bounded at 60 s) it prints what the daemon is
# waiting on (scripts/docker-diagnose.sh) and ends the preset's ctest.
watch_docker() { # ctest-pid
  local ctest_pid=$1 failures=0
  while kill -0 "${ctest_pid}" 2>/dev/null; do
    sleep 30
    if timeout 60 "${docker}" -H unix:///var/run/docker.sock run --rm --network none \
      --label sbx.watchdog=1 sbx-busybox:latest true >/dev/null 2>&1; then
      failures=0
    elif ((++failures >= 3)); then
      printf '\ntest.sh: ERROR: the Docker daemon ran no container in the last %s attempts; ending the tests\n' \
        "${failures}" >&2
      scripts/docker-diagnose.sh "the daemon stopped running containers" >&2
      kill -TERM -- "-${ctest_pid}" 2>/dev/null
      return
    fi
  done
}

# ctest in a process group of its own (the watchdog ends the whole group); on a
# failure, the machine's and the daemon's state are printed after its output.
run_ctest() { # preset
  local rc=0 ctest_pid watchdog_pid
  setsid ctest --preset "$1" --output-on-failure --no-tests=error \
    --timeout "${ctest_timeout}" --parallel "${ctest_jobs}" &
  ctest_pid=$!
  # Interrupted, the tests go too (they no longer share our process group).
  trap 'kill -TERM -- "-${ctest_pid}" 2>/dev/null; exit 130' INT TERM
  watch_docker "${ctest_pid}" &
  watchdog_pid=$!
  wait "${ctest_pid}" || rc=$?
  kill "${watchdog_pid}" 2>/dev/null || true
  wait "${watchdog_pid}" 2>/dev/null || true
  trap - INT TERM
  if ((rc != 0)); then
    scripts/docker-diagnose.sh "ctest (${1}) failed" >&2
    die "ctest (${1}) failed (exit ${rc})"
  fi
}

# configure <preset>: the Python package's module and its pytest suite (python_test) in the
# default preset only: a sanitizer build of a module would need the interpreter started under the
# sanitizer.
configure() {
  local python_args=()
  if [[ $1 == default ]]; then
    step "the Python package's venv (scripts/python-env.sh)"
    python_args=(-DSBX_PYTHON=ON "-DPython_EXECUTABLE=$(scripts/python-env.sh)")
  fi
  step "configure ($1)"
  cmake --preset "$1" "${launcher[@]}" "${python_args[@]}"
}

# The next preset's configure and build, started beside the current preset's tests at nice 19
# (its processes inherit it), its output in a log printed when it is waited for.
prebuild_pid=
prebuild_log=
start_prebuild() { # preset
  prebuild_log=$(mktemp /tmp/sbx-prebuild-"$1".XXXXXX)
  (
    renice -n 19 -p "${BASHPID}" >/dev/null
    configure "$1"
    step "build ($1)"
    cmake --build --preset "$1" --parallel "${jobs}"
  ) >"${prebuild_log}" 2>&1 &
  prebuild_pid=$!
}
finish_prebuild() { # preset
  local rc=0
  wait "${prebuild_pid}" || rc=$?
  prebuild_pid=
  printf '\n==> configure and build (%s), done beside the previous tests at nice 19: its output\n' "$1"
  cat "${prebuild_log}"
  rm -f "${prebuild_log}"
  ((rc == 0)) || die "configuring or building preset $1 beside the tests failed (exit ${rc})"
}
kill_tree() { # pid: it and every descendant
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "${child}"; done
  kill -TERM "$1" 2>/dev/null || true
}
trap '[[ -z ${prebuild_pid} ]] || kill_tree "${prebuild_pid}"' EXIT

# The fuzzing run (scripts/fuzz.sh) beside the last preset's tests, at nice 19 like the builds:
# libFuzzer's time limit is wall-clock, so it costs the tests little and the run no time.
fuzz_pid=
fuzz_log=
start_fuzz() {
  fuzz_log=$(mktemp /tmp/sbx-fuzz.XXXXXX)
  (
    renice -n 19 -p "${BASHPID}" >/dev/null
    scripts/fuzz.sh "${SBX_FUZZ_SECONDS:-20}"
  ) >"${fuzz_log}" 2>&1 &
  fuzz_pid=$!
}
finish_fuzz() {
  local rc=0
  wait "${fuzz_pid}" || rc=$?
  fuzz_pid=
  printf '\n==> fuzzing (scripts/fuzz.sh), done beside the last tests at nice 19: its output\n'
  cat "${fuzz_log}"
  rm -f "${fuzz_log}"
  ((rc == 0)) || die "scripts/fuzz.sh failed (exit ${rc})"
}
trap '[[ -z ${prebuild_pid} ]] || kill_tree "${prebuild_pid}"; [[ -z ${fuzz_pid} ]] || kill_tree "${fuzz_pid}"' EXIT

prebuilt=
for i in "${!presets[@]}"; do
  preset=${presets[i]}
  if [[ ${prebuilt} == "${preset}" ]]; then
    finish_prebuild "${preset}"
  else
    configure "${preset}"
    step "build (${preset})"
    cmake --build --preset "${preset}" --parallel "${jobs}"
  fi
  prebuilt=
  next=${presets[i + 1]:-}
  if [[ -n ${next} && ${SBX_OVERLAP_BUILDS:-1} != 0 ]]; then
    start_prebuild "${next}"
    prebuilt=${next}
  elif [[ -z ${next} && ${SBX_FUZZ:-1} != 0 ]]; then
    start_fuzz
  fi
  step "test (${preset})"
  run_ctest "${preset}"
  if [[ ${preset} == default ]]; then
    step "the plugin author's kit: install, packages, out-of-tree examples (scripts/kit-test.sh)"
    scripts/kit-test.sh build
    step "the Python package's wheel: pip wheel ./python, installed and run (scripts/python-wheel-test.sh)"
    scripts/python-wheel-test.sh
  fi
done

if [[ -n ${fuzz_pid} ]]; then finish_fuzz; fi

step "check that no sbx.sandbox container was left behind"
now=$(docker_ps_sandboxes | sort)
leaked=$(comm -13 <(printf '%s\n' "${preexisting}") <(printf '%s\n' "${now}") | sed '/^$/d')
if [[ -n ${leaked} ]]; then
  printf 'test.sh: ERROR: %s container(s) labelled sbx.sandbox were left behind:\n' "$(wc -l <<<"${leaked}")" >&2
  while read -r id; do
    "${docker}" -H unix:///var/run/docker.sock ps -a --filter "id=${id}" \
      --format '  {{.ID}} {{.Image}} {{.Status}} {{.Names}} {{.Labels}}' >&2
  done <<<"${leaked}"
  if [[ ${SBX_KEEP_LEFTOVERS:-0} != 1 ]]; then
    # shellcheck disable=SC2086 # one id per word
    "${docker}" -H unix:///var/run/docker.sock rm -f ${leaked} >/dev/null || true
    printf 'test.sh: removed them (set SBX_KEEP_LEFTOVERS=1 to keep them for debugging)\n' >&2
  fi
  exit 1
fi
printf 'test.sh: no sbx.sandbox containers left\n'

step "all presets passed: ${presets[*]}"
