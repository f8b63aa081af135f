#!/bin/sh
# The `sbx conformance` command itself: a failing provider gives exit 1 and names the failed case;
# --only selects; --junit writes a JUnit XML file with the cases; an unknown provider, a missing
# --provider and an --only that selects nothing are usage errors (2), and so is a provider config
# the plugin refuses, as for `sbx run`. A failure says what it means, not where in the suite.
#   command_test.sh SBX TEST_PLUGIN_DIR WORK_DIR
set -u
sbx=$1 plugins=$2 work=$3/command_test
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -qF -- "$2" "$1" || fail "$1 lacks '$2':"; }
lacks() { ! grep -qF -- "$2" "$1" || fail "$1 has '$2'"; }

# A provider whose downloads always fail (test_processes' fault injection).
cat > "$work/broken.json" <<JSON
{"providers": {"broken": {"plugin": "test_processes", "config": {"throw_in": "download"}}}}
JSON
"$sbx" conformance --plugin-dir "$plugins" --config "$work/broken.json" --provider broken \
  --only 'files.*' --junit "$work/broken.xml" > "$work/broken.out" 2>&1
rc=$?
cat "$work/broken.out"
[ "$rc" = 1 ] || fail "a failing provider exited $rc, not 1"
has "$work/broken.out" "FAILED      files.round-trip"
has "$work/broken.out" "failed: files.round-trip"
has "$work/broken.out" "injected failure in download"
lacks "$work/broken.out" ".cpp:"                     # no source location of the suite
has "$work/broken.out" "a call the case needed failed"
has "$work/broken.out" "ok          files.startup"  # a case without downloads still passes
lacks "$work/broken.out" "exec."                     # --only selected files.* alone

# The JUnit file: well-formed XML, one testcase per case run, the failure in it.
python3 - "$work/broken.xml" <<'PY' || fail "the JUnit file is not what it should be"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root.find("testsuite")
cases = {c.get("name"): c for c in suite.findall("testcase")}
assert "files.round-trip" in cases and "files.startup" in cases, cases
assert all(n.startswith("files.") for n in cases), cases
assert cases["files.round-trip"].find("failure") is not None
assert cases["files.startup"].find("failure") is None
assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) >= 1
print("junit ok:", len(cases), "cases")
PY

# A substring selects; a passing run exits 0; "not offered" is not a failure.
"$sbx" conformance --plugin-dir "$plugins" --provider test_processes --only exec.user \
  > "$work/user.out" 2>&1
rc=$?
cat "$work/user.out"
[ "$rc" = 0 ] || fail "a run with only 'not offered' exited $rc"
has "$work/user.out" "not offered exec.user"
has "$work/user.out" "1 case on provider 'test_processes': 0 passed, 0 failed, 1 not offered"

# --skip leaves cases out of what --only selects.
"$sbx" conformance --plugin-dir "$plugins" --provider test_processes --only 'exec.*' \
  --skip 'exec.[a-s]*' > "$work/skip.out" 2>&1 || fail "--skip run exited $?"
cat "$work/skip.out"
"$sbx" conformance --list --only 'exec.*' --skip 'exec.[a-s]*' | cut -f1 > "$work/skip-list"
[ -s "$work/skip-list" ] || fail "--list with --skip listed nothing"
! grep -q '^exec\.[a-s]' "$work/skip-list" || fail "--list listed a skipped case"
while read -r name; do has "$work/skip.out" " $name "; done < "$work/skip-list"
lacks "$work/skip.out" "exec.cancel"
# Several patterns, separated by commas: the cases any of them selects.
"$sbx" conformance --list --only 'exec.cwd,files.dot*' --skip 'x.none,files.dot-dot' | cut -f1 \
  > "$work/comma-list"
[ "$(tr '\n' ' ' < "$work/comma-list")" = "exec.cwd " ] ||
  fail "--only 'exec.cwd,files.dot*' --skip 'x.none,files.dot-dot' listed: $(cat "$work/comma-list")"

# A random order from a seed runs every selected case, in another order than the suite's.
"$sbx" conformance --plugin-dir "$plugins" --provider test_processes --only 'exec.*' \
  --seed 7 > "$work/seed.out" 2>&1 || fail "--seed 7 exited $?"
cat "$work/seed.out"
has "$work/seed.out" "12 passed, 0 failed, 1 not offered"
"$sbx" conformance --list --only 'exec.*' | cut -f1 > "$work/suite-order"
grep -E '^(ok|not offered) ' "$work/seed.out" | sed 's/^not offered /not-offered /' |
  awk '{print $2}' > "$work/seed-order"
sort "$work/suite-order" > "$work/a"
sort "$work/seed-order" > "$work/b"
cmp -s "$work/a" "$work/b" || fail "--seed did not run the same cases"
! cmp -s "$work/suite-order" "$work/seed-order" || fail "--seed 7 kept the suite's order"

# Usage errors: exit 2 with a clear message.
usage() {
  expected=$1
  shift
  "$sbx" conformance "$@" > "$work/usage.out" 2>&1
  rc=$?
  cat "$work/usage.out"
  [ "$rc" = 2 ] || fail "sbx conformance $* exited $rc, not 2"
  has "$work/usage.out" "$expected"
}
usage "Unknown sandbox provider 'no_such_provider'" --plugin-dir "$plugins" \
  --provider no_such_provider
usage "conformance needs --provider NAME" --plugin-dir "$plugins"
usage "--only 'nothing.like.this' selects no case" --plugin-dir "$plugins" \
  --provider test_processes --only nothing.like.this
usage "--seed must be > 0" --provider test_processes --seed 0

# A provider config the plugin refuses: 2 from both commands, with the same message.
cat > "$work/refused.json" <<JSON
{"providers": {"p": {"plugin": "test_processes", "config": {"no_such_key": 1}}}}
JSON
usage "config.no_such_key: unknown key" --plugin-dir "$plugins" --config "$work/refused.json" \
  --provider p
"$sbx" run --plugin-dir "$plugins" --config "$work/refused.json" --provider p -- true \
  > "$work/run-refused.out" 2>&1
rc=$?
cat "$work/run-refused.out"
[ "$rc" = 2 ] || fail "sbx run with a refused provider config exited $rc, not 2 as sbx conformance"
has "$work/run-refused.out" "config.no_such_key: unknown key"

# --list names every case without a provider.
"$sbx" conformance --list > "$work/list.out" 2>&1 || fail "--list exited $?"
has "$work/list.out" "ext.renew"
has "$work/list.out" "not offered when: sbx.renew/1 not in the provider's extensions"

[ "$failures" = 0 ] && echo "all checks passed"
exit "$failures"
