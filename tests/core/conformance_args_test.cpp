// `sbx conformance` without running a provider: the command's options as the real table entry
// parses them (cli/cmd_conformance.cpp), case selection and the JUnit document
// (conformance). tests/conformance/command_test.sh runs the command itself.

#include <doctest/doctest.h>

#include <sbx/conformance/conformance.hpp>

#include <set>
#include <string>
#include <vector>

#include "../common/test_helpers.hpp"
#include "args.hpp"
#include "commands.hpp"

using namespace sbx::cli;
using sbx::testing::error_of;

namespace {

CommandLine parse(const std::vector<std::string>& argv, Global& global) {
  static const std::vector<Command> table{conformance_command()};
  return parse_command_line(table, argv, global);
}

std::string usage_error(const std::vector<std::string>& argv) {
  Global global;
  return error_of<UsageError>([&] { parse(argv, global); }).what();
}

}  // namespace

TEST_CASE("sbx conformance: options, global options among them") {
  Global global;
  const auto line =
      parse({"conformance", "--plugin-dir", "/p", "--provider", "hello", "--only", "exec.*",
             "--junit", "out.xml", "--image", "img", "--seed", "3", "--config", "c.json"},
            global);
  CHECK(line.kind == CommandLine::Kind::run);
  CHECK(static_cast<bool>(line.run));
  REQUIRE(global.plugin_dirs.size() == 1);
  CHECK(global.plugin_dirs[0] == "/p");
  CHECK(global.config == std::optional<std::string>("c.json"));
}

TEST_CASE("sbx conformance: what it refuses before running anything") {
  CHECK(usage_error({"conformance"}) == "conformance needs --provider NAME");
  CHECK(usage_error({"conformance", "--provider", "p", "--seed", "0"}) ==
        "--seed must be > 0, got '0'");
  CHECK(usage_error({"conformance", "--provider", "p", "--seed", "x"}) ==
        "--seed must be a whole number, got 'x'");
  CHECK(usage_error({"conformance", "--provider", "p", "--only", "no.such.*"}) ==
        "--only 'no.such.*' selects no case (sbx conformance --list shows them)");
  CHECK(usage_error(
            {"conformance", "--provider", "p", "--only", "exec.timeout", "--skip", "exec.*"}) ==
        "--only 'exec.timeout' and --skip 'exec.*' leave no case "
        "(sbx conformance --list shows them)");
  CHECK(usage_error({"conformance", "--provider", "p", "--skip", "*"}) ==
        "--only '' and --skip '*' leave no case (sbx conformance --list shows them)");
  CHECK(usage_error({"conformance", "--provider"}).find("--provider") != std::string::npos);
  CHECK(usage_error({"conformance", "--provider", "p", "extra"}).find("extra") !=
        std::string::npos);
  // --list needs no provider.
  Global global;
  CHECK(parse({"conformance", "--list"}, global).kind == CommandLine::Kind::run);
  // The help names the exit codes.
  const auto help = parse({"conformance", "--help"}, global);
  CHECK(help.kind == CommandLine::Kind::help);
  const std::string text = command_help(help.command->info);
  CHECK(text.find("1 when one did") != std::string::npos);
}

TEST_CASE("--skip leaves out what it matches of what --only selects") {
  using sbx::conformance::selected_by;
  CHECK(selected_by("", "", "lifecycle.ttl"));
  CHECK_FALSE(selected_by("", "lifecycle.ttl", "lifecycle.ttl"));
  CHECK(selected_by("", "lifecycle.ttl", "lifecycle.create"));
  CHECK_FALSE(selected_by("exec.*", "", "files.modes"));
  CHECK_FALSE(selected_by("exec.*", "*.timeout", "exec.timeout"));
  CHECK(selected_by("exec.*", "*.timeout", "exec.cancel"));
  CHECK_FALSE(selected_by("", "FILES", "files.modes"));  // case-insensitive, as --only
}

TEST_CASE("case names are unique and selection is a glob or a substring") {
  using sbx::conformance::matches;
  std::set<std::string> names;
  for (const auto& c : sbx::conformance::cases()) {
    CHECK_MESSAGE(names.insert(c.name).second, c.name);
    CHECK_FALSE(c.description.empty());
  }
  CHECK(names.count("lifecycle.gone") == 1);
  CHECK(names.count("ext.renew") == 1);
  CHECK(matches("", "exec.cwd"));
  CHECK(matches("cwd", "exec.cwd"));
  CHECK(matches("EXEC", "exec.cwd"));  // case-insensitive
  CHECK(matches("exec.*", "exec.cwd"));
  CHECK_FALSE(matches("exec.*", "files.modes"));
  CHECK_FALSE(matches("exec", "files.modes"));
  CHECK(matches("*.mode?", "files.modes"));
  CHECK(matches("exec.c", "exec.cwd2"));        // a substring is enough without a glob
  CHECK_FALSE(matches("exec.c?", "exec.cwd"));  // a glob matches the whole name
}

TEST_CASE("the JUnit document: a testcase per case, failures and skips, escaped text") {
  sbx::conformance::Summary s;
  s.provider = "p<&>";
  s.results.push_back({"a.ok", sbx::conformance::Outcome::passed, {}, "", 0.5});
  s.results.push_back(
      {"a.bad", sbx::conformance::Outcome::failed, {"x.cpp:1: \"a\" < 'b' & \x01"}, "", 1});
  s.results.push_back({"a.no", sbx::conformance::Outcome::not_offered, {}, "no <ext>", 0});
  s.passed = s.failed = s.not_offered = 1;
  const std::string xml = sbx::conformance::junit_xml(s);
  CHECK(xml.find("<testsuite name=\"sbx conformance: p&lt;&amp;&gt;\" tests=\"3\" "
                 "failures=\"1\" errors=\"0\" skipped=\"1\"") != std::string::npos);
  CHECK(xml.find("<testcase classname=\"conformance.p&lt;&amp;&gt;\" name=\"a.ok\" "
                 "time=\"0.500\"/>") != std::string::npos);
  CHECK(xml.find("<failure message=\"x.cpp:1: &quot;a&quot; &lt; &apos;b&apos; &amp; ?\">") !=
        std::string::npos);
  CHECK(xml.find("<skipped message=\"not offered: no &lt;ext&gt;\"/>") != std::string::npos);
  CHECK(xml.find('\x01') == std::string::npos);
}
