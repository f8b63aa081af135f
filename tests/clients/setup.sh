#!/usr/bin/env bash
# setup.sh DIR — installs the pinned official clients for tests/clients into DIR (the build
# directory's clients/): a Python venv DIR/venv with requirements.txt (opensandbox,
# opensandbox-cli, the OpenAPI checker) and an npm prefix DIR/npm with package.json
# (@alibaba-group/opensandbox). Cached: DIR/stamp holds the hash of both pin files and the
# Python and Node versions; when it matches nothing is done, else both are re-created.
# Runs under a lock (DIR/setup.lock), so tests started in parallel install once.
#
# Environment: SBX_CLIENTS_PYTHON (default python3), the interpreter the venv is made from.
# Exit status 1, with a message saying what could not be installed, when anything fails: a test
# whose client cannot be installed fails, it is never skipped.
set -Eeuo pipefail

die() {
  printf 'tests/clients/setup.sh: ERROR: %s\n' "$*" >&2
  exit 1
}

(($# == 1)) || die "usage: setup.sh DIR"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1
python=${SBX_CLIENTS_PYTHON:-python3}

mkdir -p "${dir}"
dir=$(cd "${dir}" && pwd)
# DIR is ours only if it is empty or carries our marker: never delete inside anything else.
if [[ ! -e ${dir}/.sbx-clients ]]; then
  [[ -z $(ls -A "${dir}") ]] || die "${dir} is not empty and was not made by this script"
  : >"${dir}/.sbx-clients"
fi

exec 9>"${dir}/setup.lock"
flock 9

command -v "${python}" >/dev/null || die "no ${python} on PATH (needed for the Python clients)"
command -v node >/dev/null || die "no node on PATH (needed for the JavaScript SDK; Node 20)"
command -v npm >/dev/null || die "no npm on PATH (needed to install the JavaScript SDK)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || die "node $(node --version) is too old: the JavaScript SDK needs Node >= 20"

want=$(
  cat "${here}/requirements.txt" "${here}/package.json"
  "${python}" --version 2>&1
  node --version
)
want=$(sha256sum <<<"${want}" | cut -d' ' -f1)
if [[ -f ${dir}/stamp && $(cat "${dir}/stamp") == "${want}" ]]; then
  exit 0
fi

printf 'tests/clients/setup.sh: installing the pinned clients into %s\n' "${dir}"
rm -f "${dir}/stamp"
rm -rf "${dir}/venv" "${dir}/npm"

"${python}" -m venv "${dir}/venv" || die "${python} -m venv failed (is the venv module installed?)"
if ! timeout 900 "${dir}/venv/bin/python" -m pip install --no-input --disable-pip-version-check \
  -r "${here}/requirements.txt"; then
  die "could not install the pinned Python clients ($(grep -v '^#' "${here}/requirements.txt" |
    tr '\n' ' ')) from PyPI: see pip's output above"
fi
"${dir}/venv/bin/python" - <<'EOF' || die "the installed Python clients are not the pinned versions"
import importlib.metadata as m
for name, version in (("opensandbox", "1.1.1"), ("opensandbox-cli", "1.1.1")):
    got = m.version(name)
    assert got == version, f"{name} {got} installed, {version} pinned"
EOF

mkdir -p "${dir}/npm"
cp "${here}/package.json" "${dir}/npm/package.json"
if ! (cd "${dir}/npm" && timeout 900 npm install --no-audit --no-fund --ignore-scripts \
  --no-package-lock --loglevel=error); then
  die "could not install the pinned JavaScript SDK (@alibaba-group/opensandbox@0.1.11) from npm: see npm's output above"
fi
# (by path: the package's "exports" do not include its package.json)
got=$(cd "${dir}/npm" && node -p 'require("./node_modules/@alibaba-group/opensandbox/package.json").version')
[[ ${got} == 0.1.11 ]] || die "@alibaba-group/opensandbox ${got} installed, 0.1.11 pinned"

printf '%s\n' "${want}" >"${dir}/stamp"
printf 'tests/clients/setup.sh: installed\n'
