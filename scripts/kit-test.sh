#!/usr/bin/env bash
# kit-test.sh — the plugin author's kit, end to end, as CI runs it after the default preset's
# tests (scripts/test.sh): from a built tree (default: build/), twice —
#   A. `cmake --install` into a temporary prefix;
#   B. the Debian packages (`cpack --config BUILD_DIR/CPackConfig.cmake -B DIR -G DEB`, which must
#      write nothing into the build tree), installed with apt-get (fresh Debian 12, as root),
#      then removed again; before that, their fields and files are checked against
#      docs/packaging.md (the relationship fields of its control block, the sbx description's
#      plugins, the copyright files, libsbx-dev's doc directory, sbx-testing.pc);
# and against each: check that every relative link of every installed .md file resolves in the
# installed tree (and that the sources the guide cites are there), build sdk/examples/hello and
# sdk/examples/c_provider out of tree with find_package alone, build and run a fake-host unit test
# of hello with `pkg-config sbx-testing` alone, check that the installed `sbx` finds its plugins
# and probe with no environment variable, and run `sbx conformance`: the whole suite on the two
# examples built out of tree (what an author does), and on the installed local_docker the cases
# that reach each installed binary (the plugin, its agent, the probe: a create, an exec, a file
# each way, a session, a terminal). The whole suite on every in-tree provider is ctest's (the
# same code, from the build tree).
#
# Usage: scripts/kit-test.sh [BUILD_DIR]
# Environment:
#   SBX_KIT_DEB=install   B as above (default; needs root and apt-get; packages named sbx or
#                         libsbx-dev installed before are removed at the end as well)
#   SBX_KIT_DEB=inspect   B without touching the system: the packages are checked with dpkg-deb,
#                         `apt-get install --simulate` and extracted into a temporary directory
#                         (dpkg -x), which then serves as the prefix
#   SBX_KIT_CONFORMANCE=skip  do not run `sbx conformance` (for working on this script before the
#                         command exists); the script then ends with exit status 77, INCOMPLETE
set -Eeuo pipefail
trap 'printf "kit-test: ERROR: failed at line %s: %s\n" "${LINENO}" "${BASH_COMMAND}" >&2' ERR

step() { printf '\n==> kit-test: %s\n' "$*"; }
die() { printf 'kit-test: ERROR: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
src=$PWD
build=$(readlink -f "${1:-build}")
deb_mode=${SBX_KIT_DEB:-install}
conformance_mode=${SBX_KIT_CONFORMANCE:-run}
[[ -x ${build}/bin/sbx ]] || die "${build}/bin/sbx does not exist: build the default preset first"
[[ ${deb_mode} == install || ${deb_mode} == inspect ]] || die "SBX_KIT_DEB must be install or inspect"
[[ ${conformance_mode} == run || ${conformance_mode} == skip ]] ||
  die "SBX_KIT_CONFORMANCE must be run or skip"

work=$(mktemp -d /tmp/sbx-kit.XXXXXX)
installed_debs=0
cleanup() {
  if ((installed_debs)); then
    printf 'kit-test: removing the sbx packages again\n'
    apt-get remove -y -q sbx libsbx-dev >/dev/null || printf 'kit-test: WARNING: apt-get remove failed\n' >&2
  fi
  rm -rf -- "${work}"
}
trap cleanup EXIT

# Nothing in the environment may tell sbx where its files are; no probe cache in $HOME.
unset SBX_PLUGIN_PATH SBX_PLUGIN_PROBE SBX_CONFIG
export SBX_PLUGIN_CACHE=off
launchers=()
if command -v ccache >/dev/null 2>&1; then
  launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

# build_examples <label> [<prefix for CMAKE_PREFIX_PATH>]: each example folder, as it is, out of
# tree with find_package alone; the .so lands in ${work}/<label>/<example>/.
build_examples() {
  local label=$1 prefix=${2:-} example dir
  mkdir -p "${work}/${label}"
  for example in hello c_provider; do
    dir=${work}/${label}/${example}
    cmake -S "${src}/sdk/examples/${example}" -B "${dir}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      ${prefix:+-DCMAKE_PREFIX_PATH="${prefix}"} "${launchers[@]}" >"${dir}.log" 2>&1 ||
      { cat "${dir}.log"; die "configuring ${example} against ${label}"; }
    cmake --build "${dir}" >>"${dir}.log" 2>&1 || { cat "${dir}.log"; die "building ${example}"; }
    grep '^sbx_DIR:' "${dir}/CMakeCache.txt"
    [[ -f ${dir}/${example}.so ]] || die "no ${dir}/${example}.so"
    symbols=$(nm -D --defined-only "${dir}/${example}.so" | awk '{print $3}')
    [[ ${symbols} == sbx_plugin_entry ]] || die "${example}.so exports: ${symbols}"
  done
}

# check_finds_own_files <sbx> <plugin dir>: with no flag and no environment, `sbx plugins` lists
# the local_docker.so of <plugin dir> and says nothing on stderr (a missing probe is a warning).
check_finds_own_files() {
  local sbx=$1 plugin_dir=$2 out err
  out=$("${sbx}" plugins 2>"${work}/plugins.err")
  err=$(cat "${work}/plugins.err")
  printf '%s\n' "${out}"
  grep -qx "${plugin_dir}/local_docker.so" <<<"${out}" || die "${sbx} does not find ${plugin_dir}/local_docker.so"
  grep -q "error:" <<<"${out}" && die "${sbx} lists an unusable plugin file"
  [[ -z ${err} ]] || die "${sbx} plugins wrote to stderr: ${err}"
}

# check_doc_links <root> <.md file relative to root>...: every relative link of each file (inline
# `[text](target)` and reference definitions `[label]: target`, outside code blocks and code spans;
# not http:, https:, mailto: or another scheme, not a bare #anchor) names a path that exists under
# <root>. Fails naming each one that does not.
check_doc_links() {
  local root=$1
  shift
  (($# > 0)) || die "no .md file to check under ${root}"
  # shellcheck disable=SC2016 # Perl, not shell
  perl -e '
    use strict; use warnings; use File::Basename qw(dirname); use File::Spec;
    my $root = shift; my $bad = 0;
    for my $file (@ARGV) {
      open my $fh, "<", "$root/$file" or die "$root/$file: $!\n";
      my ($text, $fence) = ("", "");
      while (my $line = <$fh>) {  # fenced code blocks become empty lines (line numbers kept)
        if ($fence) { $fence = "" if $line =~ /^\s*\Q$fence\E\s*$/; $line = "\n"; }
        elsif ($line =~ /^\s*(```+|~~~+)/) { $fence = $1; $line = "\n"; }
        $text .= $line;
      }
      # Code spans become blanks, their newlines kept.
      $text =~ s/(`+)(?:(?!\1|\n\n).)+?\1/(my $s = $&) =~ tr|\n| |c; $s/gse;
      my @links;
      push @links, [$1, $-[1]] while $text =~ /\]\((?:[ \t]*\n)?[ \t]*(<[^>\n]*>|[^)\s]+)/g;
      push @links, [$1, $-[1]] while $text =~ /^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)/mg;
      for my $link (sort { $a->[1] <=> $b->[1] } @links) {
        my ($target, $at) = @$link;
        $target =~ s/^<(.*)>$/$1/;
        next if $target =~ m{^(?:[a-z][a-z0-9+.-]*:|#)}i;
        (my $path = $target) =~ s/[#?].*//s;
        $path =~ s/%([0-9a-f]{2})/chr(hex($1))/gie;
        next if -e File::Spec->catfile($root, dirname($file), $path);
        printf STDERR "kit-test: broken link in %s/%s:%d: %s\n", $root, $file,
          1 + (substr($text, 0, $at) =~ tr/\n//), $target;
        $bad++;
      }
    }
    exit 1 if $bad;
    printf "ok: every relative link of %d .md files resolves under %s\n", scalar(@ARGV), $root;
  ' "${root}" "$@" || die "links in the installed docs name paths that are not installed (above)"
}

# check_guide_citations <doc dir>: the sources docs/writing-a-plugin.md names by path (in code
# spans: `tests/sdk/fake_host_test.cpp`, `sdk/examples/hello/hello.cpp`) are installed with it, in
# the source tree's layout under <doc dir>.
check_guide_citations() {
  local doc_dir=$1 cited missing=0
  for cited in $(grep -oE '`(tests|sdk)/[A-Za-z0-9_./-]+\.(c|cpp|hpp|h|txt|md)`' \
    "${doc_dir}/docs/writing-a-plugin.md" | tr -d '`' | sort -u); do
    if [[ -e ${doc_dir}/${cited} ]]; then
      echo "ok: the guide cites ${cited}, installed as ${doc_dir}/${cited}"
    else
      printf 'kit-test: the guide cites %s, not installed in %s\n' "${cited}" "${doc_dir}" >&2
      missing=1
    fi
  done
  ((!missing)) || die "sources the guide cites are not installed (above)"
}

# check_control_fields <doc> <deb>...: the relationship fields of each package (Depends,
# Recommends, Suggests, ...; `dpkg-deb -f`) are the ones <doc> documents, in the fenced block after
# the line `<!-- kit-test: control fields -->` (control-file paragraphs: `Package:`, then its
# fields). Compared as sets of entries, alternatives (`a | b`) kept together; a documented entry
# with a version (`sbx (= 1.3.0)`) must have the package's version too, one without matches any
# version (dpkg-shlibdeps' minimum versions follow the build machine's libraries). A field, or an
# entry, on one side only fails.
check_control_fields() {
  local doc=$1
  shift
  # shellcheck disable=SC2016 # Perl, not shell
  perl -e '
    use strict; use warnings;
    my $doc = shift;
    my @relations = qw(Pre-Depends Depends Recommends Suggests Enhances Breaks Conflicts Provides
                       Replaces);
    # Control paragraphs -> { package => { field => value } }; continuation lines folded.
    sub paragraphs {
      my %out; my ($package, $field, %fields);
      my $end = sub { $out{$package} = {%fields} if defined $package; undef $package; %fields = () };
      for my $line (split /\n/, shift) {
        if ($line =~ /^\s*$/) { $end->(); next; }
        if ($line =~ /^\s+(.*)/ && $field) { $fields{$field} .= " $1"; next; }
        next unless $line =~ /^([A-Za-z-]+):\s*(.*)$/;
        ($field, my $value) = ($1, $2);
        $package = $value if $field eq "Package";
        $fields{$field} = $value;
      }
      $end->();
      return \%out;
    }
    sub entries {  # "a (>= 1) | b, c" -> { "a|b" => "a (>= 1) | b", "c" => "c" }
      my %out;
      for my $entry (split /\s*,\s*/, shift // "") {
        $entry =~ s/\s+/ /g; $entry =~ s/^ | $//g;
        next if $entry eq "";
        (my $names = $entry) =~ s/\s*\([^)]*\)//g;
        $names =~ s/\s*\|\s*/|/g;
        $out{$names} = $entry;
      }
      return \%out;
    }
    open my $fh, "<", $doc or die "$doc: $!\n";
    my $text = do { local $/; <$fh> };
    $text =~ /^<!-- kit-test: control fields -->\n```[^\n]*\n(.*?)^```/ms or
      die "kit-test: no <!-- kit-test: control fields --> block in $doc\n";
    my $documented = paragraphs($1);
    my $bad = 0;
    for my $deb (@ARGV) {
      my $actual = paragraphs(scalar `dpkg-deb -f "$deb"`);
      my ($package) = keys %$actual;
      my $want = $documented->{$package} or do {
        print STDERR "kit-test: $doc documents no package $package\n"; $bad++; next; };
      for my $field (@relations) {
        my ($doc_entries, $deb_entries) = (entries($want->{$field}), entries($actual->{$package}{$field}));
        my @problems;
        for my $name (sort keys %$doc_entries) {
          my $entry = $doc_entries->{$name};
          if (!exists $deb_entries->{$name}) { push @problems, "documented, not in the package: $entry"; }
          elsif ($entry =~ /\(/ && $entry ne $deb_entries->{$name}) {
            push @problems, "documented as $entry, the package has $deb_entries->{$name}";
          }
        }
        for my $name (sort keys %$deb_entries) {
          push @problems, "in the package, not documented: $deb_entries->{$name}"
            unless exists $doc_entries->{$name};
        }
        if (@problems) {
          print STDERR "kit-test: $package $field vs $doc: $_\n" for @problems;
          $bad++;
        } elsif (%$deb_entries) {
          print "ok: $package $field as documented: ", join(", ", sort keys %$deb_entries), "\n";
        }
      }
    }
    exit($bad ? 1 : 0);
  ' "${doc}" "$@" || die "the packages' relationship fields differ from ${doc} (above)"
}

# check_package_files <sbx .deb> <libsbx-dev .deb>: what docs/packaging.md says of the packages'
# files: sbx's description names every plugin it ships (lib/sbx/plugins/*.so); each package has
# /usr/share/doc/<package>/copyright, sbx as a file (Debian's copyright format), libsbx-dev through
# /usr/share/doc/libsbx-dev, its own, a link to sbx's (it depends on that very sbx); libsbx-dev's
# files under /usr/share/doc are that link and the docs under /usr/share/doc/sbx/; sbx-testing.pc
# is beside sbx.pc.
check_package_files() {
  local sbx_deb=$1 dev_deb=$2 sbx_list dev_list plugins plugin description format
  # "<type> <path>[ -> <target>]", type as ls -l shows it (- file, d directory, l link)
  local listing='{l = substr($1, 1, 1) " " $6; if ($7 == "->") l = l " -> " $8; print l}'
  sbx_list=$(dpkg-deb -c "${sbx_deb}" | awk "${listing}")
  dev_list=$(dpkg-deb -c "${dev_deb}" | awk "${listing}")
  plugins=$(awk '$2 ~ /^\.\/usr\/lib\/sbx\/plugins\/[^/]+\.so$/ {n = $2; sub(/.*\//, "", n); sub(/\.so$/, "", n); print n}' \
    <<<"${sbx_list}")
  [[ -n ${plugins} ]] || die "the sbx package has no plugin"
  description=$(dpkg-deb -f "${sbx_deb}" Description)
  for plugin in ${plugins}; do
    grep -qw -- "${plugin}" <<<"${description}" ||
      die "the sbx package ships ${plugin}.so, its description does not name it: ${description}"
  done
  echo "ok: the sbx package's description names its plugins:" ${plugins}
  grep -qx -- '- ./usr/share/doc/sbx/copyright' <<<"${sbx_list}" || die "the sbx package has no /usr/share/doc/sbx/copyright"
  format=$(dpkg-deb --fsys-tarfile "${sbx_deb}" | tar -xO ./usr/share/doc/sbx/copyright | head -1)
  [[ ${format} == "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" ]] ||
    die "sbx's copyright file is not in Debian's format: ${format}"
  grep -qx -- 'l ./usr/share/doc/libsbx-dev -> sbx' <<<"${dev_list}" ||
    die "libsbx-dev has no /usr/share/doc/libsbx-dev -> sbx"
  [[ $(dpkg-deb -f "${dev_deb}" Depends) == *"sbx (= $(dpkg-deb -f "${sbx_deb}" Version))"* ]] ||
    die "libsbx-dev links its doc directory to sbx's without depending on that very sbx"
  echo "ok: sbx has /usr/share/doc/sbx/copyright; libsbx-dev's /usr/share/doc/libsbx-dev links to it"
  local stray
  stray=$(awk '$2 ~ /^\.\/usr\/share\/doc\/./ && $2 != "./usr/share/doc/libsbx-dev" && $2 !~ /^\.\/usr\/share\/doc\/sbx\// {print $2}' \
    <<<"${dev_list}")
  [[ -z ${stray} ]] || die "libsbx-dev has files in /usr/share/doc outside sbx/: ${stray}"
  grep -qx -- '- ./usr/share/doc/sbx/docs/writing-a-plugin.md' <<<"${dev_list}" ||
    die "libsbx-dev has no /usr/share/doc/sbx/docs/writing-a-plugin.md"
  echo "ok: libsbx-dev's docs are under /usr/share/doc/sbx/, its own doc directory is the link"
  for pc in sbx sbx-abi sbx-http sbx-testing; do
    grep -qx -- "- ./usr/lib/pkgconfig/${pc}.pc" <<<"${dev_list}" || die "libsbx-dev has no ${pc}.pc"
  done
  echo "ok: libsbx-dev has sbx-testing.pc beside sbx.pc"
}

# fake_host_test <label> <prefix>: a plugin's unit test on the SDK's fake host (the installed hello
# example linked into it), compiled with `pkg-config --cflags --libs sbx-testing` alone, found
# beside sbx.pc in <prefix>/lib/pkgconfig (on pkg-config's own path for /usr), then run.
fake_host_test() {
  local label=$1 prefix=$2 dir=${work}/${1}/fake_host cxx=(c++) flags out pc_dir pc_path
  pc_dir=${prefix}/lib/pkgconfig
  pc_path=${pc_dir}
  [[ ${prefix} == /usr ]] && pc_path=""
  [[ -f ${pc_dir}/sbx.pc && -f ${pc_dir}/sbx-testing.pc ]] || die "no sbx-testing.pc beside sbx.pc in ${pc_dir}"
  [[ $(PKG_CONFIG_PATH=${pc_path} pkg-config --variable=pcfiledir sbx-testing) -ef ${pc_dir} ]] ||
    die "pkg-config finds another sbx-testing.pc than ${pc_dir}'s"
  mkdir -p "${dir}/tmp"
  command -v ccache >/dev/null 2>&1 && cxx=(ccache c++)
  cat >"${dir}/hello_test.cpp" <<'EOF'
// hello's unit test on the fake host: a sandbox, a command, a file there and back, exactly once.
#include <sbx/sdk/testing/fake_host.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" const sbx_plugin* sbx_plugin_entry(void);  // hello.cpp's SBX_PLUGIN line defines it

#define EXPECT(c) ((c) ? (void)0 : (std::fprintf(stderr, "failed: %s\n", #c), std::exit(1)))

int main() {
  using namespace sbx::sdk::testing;
  FakeHost host(&sbx_plugin_entry);
  {
    FakeProvider provider = host.provider("hello");
    FakeSandbox box = provider.create();
    ExecOutcome r = provider.exec(box, "echo hi");
    EXPECT(r.completed && !r.error && r.return_code == 0 && r.stdout_text == "hi\n");
    EXPECT(provider.upload(box, "in.txt", "data").ok());
    std::string back;
    EXPECT(provider.download(box, "in.txt", back).ok() && back == "data");
    EXPECT(provider.close(box).ok());
    provider.release(box);
  }
  EXPECT(host.problems().empty());
  std::puts("fake host: hello created, ran echo hi, moved a file both ways, closed");
}
EOF
  flags=$(PKG_CONFIG_PATH=${pc_path} pkg-config --cflags --libs sbx-testing) ||
    die "pkg-config sbx-testing failed against ${label}"
  echo "pkg-config --cflags --libs sbx-testing: ${flags}"
  # shellcheck disable=SC2086 # pkg-config's output is a list of words
  "${cxx[@]}" -std=c++20 -o "${dir}/hello_test" "${dir}/hello_test.cpp" \
    "${prefix}/share/doc/sbx/sdk/examples/hello/hello.cpp" ${flags} >"${dir}.log" 2>&1 ||
    { cat "${dir}.log"; die "building the fake host test against ${label}"; }
  out=$(TMPDIR=${dir}/tmp "${dir}/hello_test" 2>&1) || { printf '%s\n' "${out}"; die "the fake host test failed against ${label}"; }
  echo "ok: ${out}"
}

# ---- sbx conformance (needs the `sbx conformance` command) -----------------------------------
conformance_skipped=0
# conformance <sbx> <plugin dir> <provider> [<more args>...]
conformance() {
  local sbx=$1 dir=$2 provider=$3
  shift 3
  if [[ ${conformance_mode} == skip ]]; then
    printf 'kit-test: WARNING: NOT RUN (SBX_KIT_CONFORMANCE=skip): %s conformance --plugin-dir %s --provider %s %s\n' \
      "${sbx}" "${dir}" "${provider}" "$*" >&2
    conformance_skipped=1
    return 0
  fi
  "${sbx}" conformance --help >/dev/null 2>&1 ||
    die "sbx conformance not available: '${sbx} conformance --help' failed"
  printf '\n-- %s conformance --plugin-dir %s --provider %s %s\n' "${sbx}" "${dir}" "${provider}" "$*"
  "${sbx}" conformance --plugin-dir "${dir}" --provider "${provider}" "$@" ||
    die "sbx conformance failed for ${provider}"
}

# run_conformance <label> <sbx> <installed plugin dir>: first one `sbx run` in each example (a
# quick check that does not need `sbx conformance`), then the suite on the examples and the
# installed local_docker's binaries.
run_conformance() {
  local label=$1 sbx=$2 plugin_dir=$3 example out
  for example in hello c_provider; do
    out=$("${sbx}" run --plugin-dir "${work}/${label}/${example}" --provider "${example}" -- echo "hi from ${example}")
    [[ ${out} == "hi from ${example}" ]] || die "sbx run --provider ${example} printed: ${out}"
    echo "ok: ${sbx} run --provider ${example}: ${out}"
  done
  conformance "${sbx}" "${work}/${label}/hello" hello
  conformance "${sbx}" "${work}/${label}/c_provider" c_provider
  conformance "${sbx}" "${plugin_dir}" local_docker --image sbx-busybox:latest \
    --only 'lifecycle.create,exec.exit-code,files.round-trip,ext.session,ext.pty.tty'
}

# ---- A. an installed prefix -------------------------------------------------------------------
step "A. cmake --install ${build} into a temporary prefix"
prefix=${work}/prefix
cmake --install "${build}" --prefix "${prefix}" >"${work}/install.log"
check_finds_own_files "${prefix}/bin/sbx" "${prefix}/lib/sbx/plugins"

step "A. the installed docs: every relative link resolves in the prefix"
mapfile -t docs_md < <(cd "${prefix}" && find . -name '*.md' -printf '%P\n' | sort)
check_doc_links "${prefix}" "${docs_md[@]}"
check_guide_citations "${prefix}/share/doc/sbx"

step "A. the examples out of tree against the prefix (find_package alone)"
build_examples against-prefix "${prefix}"

step "A. a plugin's unit test on the fake host, built with pkg-config sbx-testing"
fake_host_test against-prefix "${prefix}"

step "A. sbx conformance with the installed sbx"
run_conformance against-prefix "${prefix}/bin/sbx" "${prefix}/lib/sbx/plugins"

step "A. docs/writing-a-plugin.md: from an empty folder to a passing sbx conformance, as printed"
# The guide's first sh block under "From an empty folder", run as it stands in the guide, with
# the two variables it asks the reader to set (the examples as the install carries them).
guide_script=${work}/guide.sh
awk '/^## From an empty folder/ {section = 1; next}
     section && /^```sh$/ {copy = 1; next}
     copy && /^```$/ {exit}
     copy {print}' "${src}/docs/writing-a-plugin.md" >"${guide_script}"
grep -q 'sbx" conformance' "${guide_script}" || die "no walk-through with sbx conformance in the guide"
mkdir -p "${work}/guide"
guide_out=$(cd "${work}/guide" && SBX_SRC=${prefix}/share/doc/sbx PREFIX=${prefix} bash -euo pipefail "${guide_script}" 2>&1) ||
  { printf '%s\n' "${guide_out}"; die "the guide's walk-through failed"; }
printf '%s\n' "${guide_out}" | tail -4
[[ $(tail -1 <<<"${guide_out}") == hi ]] || die "the guide's last command did not print hi"

# ---- B. the Debian packages -------------------------------------------------------------------
# As docs/packaging.md shows it: from outside the build tree, packages and staging in ${debs}. The
# build tree is listed before and after: only CMake's install manifests may change there (its
# install script writes install_manifest_<component>.txt into the build tree, as every install
# from it does).
debs=${work}/debs
step "B. cpack --config ${build}/CPackConfig.cmake -B ${debs} -G DEB"
list_build_tree() {
  find "${build}" \( -type d -printf '%P/\n' \) -o \( -not -name 'install_manifest*.txt' -printf '%P %s %T@\n' \) |
    sort >"$1"
}
list_build_tree "${work}/build-before.txt"
(cd "${work}" && cpack --config "${build}/CPackConfig.cmake" -B "${debs}" -G DEB >"${work}/cpack.log" 2>&1) ||
  { cat "${work}/cpack.log"; die "cpack failed"; }
list_build_tree "${work}/build-after.txt"
diff "${work}/build-before.txt" "${work}/build-after.txt" >&2 ||
  die "cpack wrote into the build tree ${build} (above: < before, > after)"
echo "ok: cpack wrote nothing into ${build} but CMake's install manifests"
sbx_deb=$(ls "${debs}"/sbx_*.deb)
dev_deb=$(ls "${debs}"/libsbx-dev_*.deb)
for deb in "${sbx_deb}" "${dev_deb}"; do
  printf '%s:\n' "$(basename "${deb}")"
  dpkg-deb -f "${deb}" Package Version Architecture Depends Recommends Suggests | sed 's/^/  /'
done
check_control_fields "${src}/docs/packaging.md" "${sbx_deb}" "${dev_deb}"
[[ $(dpkg-deb -f "${dev_deb}" Depends) == *"sbx (= $(dpkg-deb -f "${sbx_deb}" Version))"* ]] ||
  die "libsbx-dev does not depend on this very sbx"
check_package_files "${sbx_deb}" "${dev_deb}"

if [[ ${deb_mode} == install ]]; then
  [[ ${EUID} -eq 0 ]] || die "installing the packages needs root (or SBX_KIT_DEB=inspect)"
  step "B. apt-get install the packages"
  installed_debs=1  # also after a failed install: remove whatever got in
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${sbx_deb}" "${dev_deb}"
  root=/usr
  deb_prefix=""  # found where find_package looks by default
else
  step "B. inspect the packages (SBX_KIT_DEB=inspect: nothing is installed)"
  apt-get install --simulate -q "${sbx_deb}" "${dev_deb}" | grep -E '^(Inst|Conf) ' ||
    die "apt-get cannot install the packages"
  dpkg -x "${sbx_deb}" "${work}/root"
  dpkg -x "${dev_deb}" "${work}/root"
  root=${work}/root/usr
  deb_prefix=${root}
fi
check_finds_own_files "${root}/bin/sbx" "${root}/lib/sbx/plugins"

step "B. the packaged docs: every relative link resolves in the installed packages"
mapfile -t docs_md < <(for deb in "${sbx_deb}" "${dev_deb}"; do dpkg-deb -c "${deb}"; done |
  awk '$6 ~ /\.md$/ {sub(/^\.\//, "", $6); print $6}' | sort)
check_doc_links "${root%/usr}/" "${docs_md[@]}"
check_guide_citations "${root}/share/doc/sbx"
for package in sbx libsbx-dev; do
  [[ $(head -1 "${root}/share/doc/${package}/copyright") == "Format: "* ]] ||
    die "no ${root}/share/doc/${package}/copyright"
  echo "ok: ${root}/share/doc/${package}/copyright"
done

step "B. the examples out of tree against the packages (find_package alone)"
build_examples against-deb "${deb_prefix}"
grep -q "^sbx_DIR:PATH=${root}/lib/cmake/sbx" "${work}/against-deb/hello/CMakeCache.txt" ||
  die "hello did not find the packaged sbx in ${root}"

step "B. a plugin's unit test on the fake host, built with pkg-config sbx-testing"
fake_host_test against-deb "${root}"

step "B. sbx conformance with the packaged sbx"
run_conformance against-deb "${root}/bin/sbx" "${root}/lib/sbx/plugins"

if ((conformance_skipped)); then
  printf '\nkit-test: INCOMPLETE: sbx conformance was not run (SBX_KIT_CONFORMANCE=skip)\n' >&2
  exit 77
fi
step "the plugin author's kit works from an install and from the packages"
