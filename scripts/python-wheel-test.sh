#!/usr/bin/env bash
# python-wheel-test.sh — the Python package as a user gets it: `pip wheel ./python` (scikit-build-
# core builds the module, the in-tree plugins and the probe into the wheel), the wheel installed
# into a fresh venv of Debian's python3 (3.11), and, from outside the source tree, NeMo Gym's
# entry point listed and a sandbox created, used and closed on local_docker with the wheel's own
# plugins and probe. Run by test.sh after the default preset; the compiler cache is shared with
# it (CCACHE_NOHASHDIR: the same sources and flags hit whatever the build directory).
#
# Usage: scripts/python-wheel-test.sh
set -Eeuo pipefail

die() { printf 'python-wheel-test.sh: ERROR: %s\n' "$*" >&2; exit 1; }
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/sbx-wheel-test-XXXXXX")
trap 'rm -rf "${work}"' EXIT
export CCACHE_NOHASHDIR=1
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_ARGS="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
fi
/usr/bin/python3 -m venv "${work}/venv" || die "python3 -m venv failed"
started=${SECONDS}
"${work}/venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "${work}/wheel" ./python ||
  die "pip wheel ./python failed"
wheel=$(ls "${work}"/wheel/sbx_host-*.whl)
printf 'python-wheel-test.sh: built %s (%s) in %d s\n' "$(basename "${wheel}")" \
  "$(du -h "${wheel}" | cut -f1)" $((SECONDS - started))
"${work}/venv/bin/pip" install -q --disable-pip-version-check "${wheel}" || die "pip install failed"
cd "${work}"
"${work}/venv/bin/python" - <<'PY' || die "the installed wheel does not work"
import asyncio
import importlib.metadata as md
import pathlib

import sbx

package = pathlib.Path(sbx.__file__).parent
assert "site-packages" in str(package), package
assert (package / "plugins" / "local_docker.so").exists() and (package / "libexec" / "sbx-plugin-probe").exists()
points = [e.value for e in md.entry_points(group="nemo_gym.sandbox_providers")]
assert points == ["sbx.nemo_gym:SbxProvider"], points


async def main() -> None:
    docker = sbx.Host({"providers": {"docker": {"plugin": "local_docker"}}},
                      labels={"sbx.python-test": "wheel"}).provider("docker")
    box = await docker.create(sbx.SandboxSpec(image="sbx-busybox:latest", ttl_s=300))
    try:
        result = await docker.exec(box, "echo from-the-wheel; exit 3")
        assert (result.stdout, result.return_code) == ("from-the-wheel\n", 3), result
    finally:
        await docker.close(box)
    assert await docker.status(box) is sbx.SandboxStatus.STOPPED


asyncio.run(main())
print("python-wheel-test.sh: the installed wheel runs a sandbox on its own local_docker plugin")
PY
