#!/usr/bin/env bash
# The plugin author's kit, installed (tests/install/CMakeLists.txt):
#   1. `cmake --install` the build into WORK/staged, then move it to WORK/prefix: nothing may
#      depend on the path it was installed to;
#   2. the layout: the command, probe and in-tree plugins, headers, static libraries, CMake
#      package and pkg-config files are there, and no test, benchmark or example file is;
#   3. find_package(sbx)'s version and component rules (find_package/);
#   4. each sdk/examples/ folder, as it is, built against the prefix with find_package alone: it
#      exports sbx_plugin_entry only and was linked with --no-undefined and the version script;
#   5. the installed `sbx`, with no environment variable telling it where anything is, finds its
#      own plugins and probe, loads each example from --plugin-dir and runs a command in it;
#   6. a host program of its own on sbx::core (host/) lists the installed plugins;
#   7. the examples built with pkg-config (sbx, sbx-abi) and no CMake load and run too.
# Usage: check_install.sh <source dir> <build dir> <work dir> <version> [<C launcher> <C++ launcher>]
set -euo pipefail
src=$1 build=$2 work=$3 version=$4 c_launcher=${5:-} cxx_launcher=${6:-}
step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# The work directory is this test's own (build/tests/install/work): start from nothing.
[[ ${work} == */tests/install/work ]] || fail "refusing to use ${work} as the work directory"
rm -rf -- "${work}"
mkdir -p "${work}"
prefix=${work}/prefix

# Nothing from the environment may point sbx at its files; the probe cache stays out of $HOME.
unset SBX_PLUGIN_PATH SBX_PLUGIN_PROBE SBX_CONFIG
export SBX_PLUGIN_CACHE=off
launchers=(-DCMAKE_C_COMPILER_LAUNCHER="${c_launcher}" -DCMAKE_CXX_COMPILER_LAUNCHER="${cxx_launcher}")

step "1. cmake --install, then move the prefix"
cmake --install "${build}" --prefix "${work}/staged" >"${work}/install.log"
mv "${work}/staged" "${prefix}"

step "2. layout"
for f in bin/sbx libexec/sbx/sbx-plugin-probe lib/sbx/plugins/local_docker.so \
  include/sbx/abi.h include/sbx/abi/version.h include/sbx/sdk/plugin.hpp include/sbx/sdk/http.hpp \
  include/sbx/sbx.hpp include/sbx/core/host.hpp \
  lib/libsbx_sdk.a lib/libsbx_sdk_http.a lib/libsbx_core.a \
  lib/cmake/sbx/sbx-config.cmake lib/cmake/sbx/sbx-config-version.cmake \
  lib/cmake/sbx/SbxAddPlugin.cmake lib/cmake/sbx/plugin.version \
  lib/pkgconfig/sbx.pc lib/pkgconfig/sbx-abi.pc lib/pkgconfig/sbx-http.pc \
  share/doc/sbx/docs/writing-a-plugin.md share/doc/sbx/docs/sandbox-semantics.md \
  share/doc/sbx/sdk/examples/hello/hello.cpp share/doc/sbx/sdk/examples/c_provider/c_provider.c; do
  [[ -e ${prefix}/${f} ]] || fail "not installed: ${f}"
done
# The examples' sources are documentation (share/doc/sbx); nothing built from them is installed.
unwanted=$(cd "${prefix}" && find . -path ./share/doc -prune -o \( -name '*_test' -o -name '*_test.*' -o -name 'test_*' \
  -o -name 'hello*' -o -name 'c_provider*' -o -name 'noop*' -o -name 'abi_dispatch*' \
  -o -name '*_vs_cli*' -o -name 'misbehave*' -o -name 'init_counter*' -o -name 'v1_0_*' \
  -o -name 'libsbx_cli_args*' \) -print)
[[ -z ${unwanted} ]] || fail "installed but not part of the kit: ${unwanted}"
if grep -rqF "${work}/staged" "${prefix}/lib/cmake" "${prefix}/lib/pkgconfig"; then
  fail "the CMake package or a .pc file names the path it was installed to"
fi
echo "ok: $(cd "${prefix}" && find . -type f | wc -l) files"

step "3. find_package(sbx) version and component rules"
cmake -S "${src}/tests/install/find_package" -B "${work}/find_package" -G Ninja \
  -DCMAKE_PREFIX_PATH="${prefix}" -DSBX_PREFIX="${prefix}" -DSBX_EXPECTED_VERSION="${version}" \
  >"${work}/find_package.log" 2>&1 || { cat "${work}/find_package.log"; fail "find_package rules"; }
grep -E 'refused as it should|rules hold' "${work}/find_package.log"

exports_only_entry() {
  local symbols
  symbols=$(nm -D --defined-only "$1" | awk '{print $3}')
  [[ ${symbols} == sbx_plugin_entry ]] || fail "$1 exports: ${symbols}"
}

step "4. the examples, each folder as it is, against the prefix"
for example in hello c_provider; do
  cmake -S "${src}/sdk/examples/${example}" -B "${work}/${example}" -G Ninja \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_PREFIX_PATH="${prefix}" "${launchers[@]}" \
    >"${work}/${example}.log" 2>&1 || { cat "${work}/${example}.log"; fail "configuring ${example}"; }
  grep -q "sbx_DIR:PATH=${prefix}/lib/cmake/sbx" "${work}/${example}/CMakeCache.txt" ||
    fail "${example} did not find the sbx in ${prefix}"
  cmake --build "${work}/${example}" >>"${work}/${example}.log" 2>&1 ||
    { cat "${work}/${example}.log"; fail "building ${example}"; }
  link=$(cmake --build "${work}/${example}" -- -t commands "${example}.so")
  [[ ${link} == *"--no-undefined"* ]] || fail "${example}.so was linked without --no-undefined"
  [[ ${link} == *"--version-script=${prefix}/lib/cmake/sbx/plugin.version"* ]] ||
    fail "${example}.so was linked without the installed version script"
  exports_only_entry "${work}/${example}/${example}.so"
  echo "ok: ${example}.so"
done

step "5. the installed sbx finds its probe and plugins, loads the examples, runs a command"
"${prefix}/bin/sbx" plugins >"${work}/plugins.out" 2>"${work}/plugins.err"
cat "${work}/plugins.out" "${work}/plugins.err"
grep -qx "${prefix}/lib/sbx/plugins/local_docker.so" "${work}/plugins.out" ||
  fail "the installed sbx does not list its own local_docker.so"
[[ ! -s ${work}/plugins.err ]] || fail "sbx plugins wrote to stderr (is the probe not found?)"
for example in hello c_provider; do
  dir=${work}/${example}
  "${prefix}/bin/sbx" plugins --plugin-dir "${dir}" >"${work}/plugins.out" 2>&1
  grep -q "^  provider:  ${example} " "${work}/plugins.out" || { cat "${work}/plugins.out"; fail "${example} not listed"; }
  grep -q "error:" "${work}/plugins.out" && { cat "${work}/plugins.out"; fail "a plugin file is unusable"; }
  out=$("${prefix}/bin/sbx" run --plugin-dir "${dir}" --provider "${example}" -- echo "hi from ${example}")
  [[ ${out} == "hi from ${example}" ]] || fail "sbx run on ${example} printed: ${out}"
  echo "ok: sbx run --provider ${example}: ${out}"
done

step "6. a host program on sbx::core"
cmake -S "${src}/tests/install/host" -B "${work}/host" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_PREFIX_PATH="${prefix}" "${launchers[@]}" >"${work}/host.log" 2>&1 &&
  cmake --build "${work}/host" >>"${work}/host.log" 2>&1 || { cat "${work}/host.log"; fail "building the host"; }
"${work}/host/kit_host" >"${work}/host.out" 2>"${work}/host.err" || { cat "${work}/host.out" "${work}/host.err"; fail "kit_host"; }
cat "${work}/host.out"
grep -qx "provider local_docker in ${prefix}/lib/sbx/plugins/local_docker.so" "${work}/host.out" ||
  fail "kit_host did not list the installed local_docker"
[[ ! -s ${work}/host.err ]] || { cat "${work}/host.err"; fail "kit_host wrote to stderr"; }

step "7. the examples built with pkg-config, without CMake"
export PKG_CONFIG_PATH=${prefix}/lib/pkgconfig
[[ $(pkg-config --modversion sbx) == "${version}" ]] || fail "pkg-config --modversion sbx"
[[ $(pkg-config --libs sbx-http) == *-lcurl* ]] || fail "sbx-http does not link libcurl"
[[ $(pkg-config --libs sbx) != *-lcurl* ]] || fail "sbx links libcurl"
script=$(pkg-config --variable=plugin_version_script sbx)
[[ -f ${script} ]] || fail "plugin_version_script ${script} is not a file"
mkdir -p "${work}/pc"
# shellcheck disable=SC2046 # pkg-config's output is a list of words
c++ -std=c++20 -shared -fPIC -fvisibility=hidden -o "${work}/pc/hello.so" \
  "${src}/sdk/examples/hello/hello.cpp" $(pkg-config --cflags --libs sbx) \
  -Wl,--version-script="${script}" -Wl,--no-undefined
# shellcheck disable=SC2046
cc -std=c11 -shared -fPIC -fvisibility=hidden -o "${work}/pc/c_provider.so" \
  "${src}/sdk/examples/c_provider/c_provider.c" $(pkg-config --cflags sbx-abi) \
  -Wl,--version-script="$(pkg-config --variable=plugin_version_script sbx-abi)" -Wl,--no-undefined
for example in hello c_provider; do
  exports_only_entry "${work}/pc/${example}.so"
  out=$("${prefix}/bin/sbx" run --plugin-dir "${work}/pc" --provider "${example}" -- echo "hi from ${example}")
  [[ ${out} == "hi from ${example}" ]] || fail "sbx run on the pkg-config ${example} printed: ${out}"
  echo "ok: pkg-config ${example}.so: ${out}"
done

printf '\nall checks passed\n'
