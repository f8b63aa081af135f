// The `sbx` command line, without running anything: the parser and help texts generated from a
// command table (core/cli/args.hpp). The table here is a small one of its own;
// tests/core/cli_test.cpp runs the real commands.

#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/test_helpers.hpp"
#include "args.hpp"

using namespace sbx::cli;
using sbx::testing::error_of;

namespace {

// The fields of the test commands.
struct DemoFields {
  std::optional<std::string> image;
  std::map<std::string, std::string> env;
  std::vector<std::string> uploads;
  std::optional<double> ttl;
  std::optional<int64_t> memory;
  bool json = false;
  std::string id;
  std::vector<std::string> command;
};

// A part of DemoFields' options declared as a group of their own, as shared option groups are.
struct Part {
  std::optional<std::string> provider;
};

// What a test command saw when it ran.
struct Seen {
  DemoFields fields;
  Global global;
  int runs = 0;
};
Seen seen;

std::vector<Option<DemoFields>> demo_options() {
  using F = DemoFields;
  return {
      value<F>("--image", "IMAGE", "Sandbox image", [](F& f, const Arg& a) { f.image = a.text; }),
      repeatable<F>("--env", "K=V", "Environment variable\nsecond line of help",
                    [](F& f, const Arg& a) {
                      auto [k, v] = a.pair('=');
                      f.env[k] = v;
                    }),
      repeatable<F>("--upload", "LOCAL:REMOTE", "Copy a file in",
                    [](F& f, const Arg& a) { f.uploads.push_back(a.text); }),
      value<F>("--ttl", "S", "Lifetime", [](F& f, const Arg& a) { f.ttl = a.number(); }),
      value<F>("--memory", "MIB", "Memory",
               [](F& f, const Arg& a) { f.memory = a.whole_number(); }),
      flag("--json", "Print JSON", &F::json),
  };
}

int record(DemoFields& f, const Global& g) {
  seen.fields = f;
  seen.global = g;
  ++seen.runs;
  return 7;
}

// `demo [options] -- COMMAND`, `show [options] ID` and `group` (options from a Part).
const std::vector<Command>& table() {
  struct GroupFields {
    Part part;
  };
  static const std::vector<Command> commands{
      make_command<DemoFields>({
          .name = "demo",
          .summary = "Run a command",
          .usage = "[options] -- COMMAND [ARG...]",
          .description = "Runs a command.\n",
          .options = demo_options(),
          .trailing = Trailing<DemoFields>{"COMMAND [ARG...]",
                                           [](DemoFields& f, std::vector<std::string> words) {
                                             f.command = std::move(words);
                                           }},
          .handler = record,
      }),
      make_command<DemoFields>({
          .name = "show",
          .summary = "Show a sandbox",
          .usage = "[--json] ID",
          .description = "Shows a sandbox.\n",
          .options = {flag("--json", "Print JSON", &DemoFields::json)},
          .positionals = {{"ID", "The sandbox",
                           [](DemoFields& f, const Arg& a) { f.id = a.text; }}},
          .check =
              [](DemoFields& f) {
                if (f.id == "bad") throw UsageError("show refuses bad");
              },
          .handler = record,
      }),
      make_command<GroupFields>({
          .name = "group",
          .summary = "Options from a group",
          .usage = "[--provider NAME]",
          .description = "Group.\n",
          .options = options_of(&GroupFields::part,
                                std::vector<Option<Part>>{value<Part>(
                                    "--provider", "NAME", "Provider",
                                    [](Part& p, const Arg& a) { p.provider = a.text; })}),
          .handler =
              [](GroupFields& f, const Global&) {
                seen.fields.image = f.part.provider;
                return 0;
              },
      }),
  };
  return commands;
}

// Parses and runs a command line; returns the handler's exit code.
int run(const std::vector<std::string>& argv) {
  seen = {};
  Global global;
  const CommandLine line = parse_command_line(table(), argv, global);
  REQUIRE(line.kind == CommandLine::Kind::run);
  return line.run(global);
}

std::string usage_error(const std::vector<std::string>& argv) {
  Global global;
  return error_of<UsageError>([&] { parse_command_line(table(), argv, global); }).what();
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("--name value and --name=value") {
  CHECK(run({"demo", "--image", "a", "--ttl=2.5", "--memory=64", "--", "true"}) == 7);
  CHECK(seen.fields.image == "a");
  CHECK(seen.fields.ttl == 2.5);
  CHECK(seen.fields.memory == 64);
  run({"demo", "--image=x=y", "--", "true"});  // only the first '=' separates
  CHECK(seen.fields.image == "x=y");
  run({"demo", "--image=", "--", "true"});  // an empty value is a value
  CHECK(seen.fields.image == "");
}

TEST_CASE("flags take no value") {
  run({"demo", "--json", "--", "true"});
  CHECK(seen.fields.json);
  run({"demo", "--", "true"});
  CHECK_FALSE(seen.fields.json);
  CHECK(usage_error({"demo", "--json=yes", "--", "true"}) == "--json takes no value");
}

TEST_CASE("repeatable options add each value; others keep the last") {
  run({"demo", "--env", "A=1", "--env=B=2", "--upload", "x:/x", "--upload", "y:/y", "--image",
       "first", "--image", "second", "--", "true"});
  CHECK(seen.fields.env == std::map<std::string, std::string>{{"A", "1"}, {"B", "2"}});
  CHECK(seen.fields.uploads == std::vector<std::string>{"x:/x", "y:/y"});
  CHECK(seen.fields.image == "second");
}

TEST_CASE("unknown options name the command; before the command they are global") {
  CHECK(usage_error({"demo", "--bogus", "--", "true"}) ==
        "unknown option for demo: --bogus (put the command after --)");
  CHECK(usage_error({"show", "-x", "id"}) == "unknown option for show: -x");
  CHECK(usage_error({"--bogus", "demo"}) == "unknown option: --bogus");
  CHECK(usage_error({"--image", "a", "demo"}) == "unknown option: --image");
  CHECK(usage_error({"frobnicate"}) == "unknown command 'frobnicate' (try sbx --help)");
}

TEST_CASE("a value option at the end needs its value") {
  CHECK(usage_error({"demo", "--image"}) == "--image needs a value");
  CHECK(usage_error({"--config"}) == "--config needs a value");
  CHECK(usage_error({"show", "id", "--log-level"}) == "--log-level needs a value");
}

TEST_CASE("a value option takes the next argument even when it looks like an option") {
  run({"demo", "--image", "--json", "--", "true"});
  CHECK(seen.fields.image == "--json");
  CHECK_FALSE(seen.fields.json);
  run({"demo", "--ttl", "-5", "--", "true"});  // refused later, by the spec's own check
  CHECK(seen.fields.ttl == -5);
  run({"demo", "--image", "--help", "--", "true"});  // a value, not a request for help
  CHECK(seen.fields.image == "--help");
}

TEST_CASE("-- ends the options: the command after it, or more positional arguments") {
  run({"demo", "--image", "a", "--", "ls", "--json", "-h", "--"});
  CHECK(seen.fields.command == std::vector<std::string>{"ls", "--json", "-h", "--"});
  CHECK_FALSE(seen.fields.json);
  run({"demo", "--", "--config", "x"});  // a global option after -- belongs to the command
  CHECK(seen.global.config == std::nullopt);
  CHECK(seen.fields.command == std::vector<std::string>{"--config", "x"});
  CHECK(usage_error({"demo", "--image", "a"}) == "demo needs a command after --");
  CHECK(usage_error({"demo", "--"}) == "demo needs a command after --");
  CHECK(usage_error({"demo", "ls"}) ==
        "unexpected argument for demo: 'ls' (put the command after --)");
  run({"show", "--", "-id-with-a-dash"});  // without a command, -- ends the options only
  CHECK(seen.fields.id == "-id-with-a-dash");
  run({"show", "-"});  // a lone '-' is an argument
  CHECK(seen.fields.id == "-");
}

TEST_CASE("positional arguments: anywhere before --, all required, no more") {
  run({"show", "sbx-1", "--json"});
  CHECK(seen.fields.id == "sbx-1");
  CHECK(seen.fields.json);
  run({"show", "--json", "sbx-2"});
  CHECK(seen.fields.id == "sbx-2");
  CHECK(usage_error({"show", "--json"}) == "show needs ID (usage: sbx show [--json] ID)");
  CHECK(usage_error({"show", "a", "b"}) == "unexpected argument for show: 'b'");
  CHECK(usage_error({"show", "bad"}) == "show refuses bad");  // the command's own check
}

TEST_CASE("global options before and after the command, parsed once") {
  run({"--config", "a.json", "--plugin-dir", "/p1", "demo", "--plugin-dir=/p2", "--log-level",
       "debug", "--image", "i", "--", "true"});
  CHECK(seen.global.config == "a.json");
  CHECK(seen.global.plugin_dirs == std::vector<std::filesystem::path>{"/p1", "/p2"});
  CHECK(seen.global.log_level == "debug");
  CHECK(seen.fields.image == "i");
  run({"show", "id", "--config=b.json", "--log-level=info"});
  CHECK(seen.global.config == "b.json");
  CHECK(seen.global.log_level == "info");
  run({"show", "id"});
  CHECK(seen.global.log_level == "warn");  // the default
}

TEST_CASE("options of a group, lifted into a command's fields") {
  seen = {};
  Global global;
  const CommandLine line = parse_command_line(table(), {"group", "--provider=p"}, global);
  REQUIRE(line.run);
  line.run(global);
  CHECK(seen.fields.image == "p");
}

TEST_CASE("numbers and pairs are refused with sbx's messages") {
  CHECK(usage_error({"demo", "--ttl", "x", "--", "true"}) == "--ttl must be a number, got 'x'");
  CHECK(usage_error({"demo", "--ttl", "1s", "--", "true"}) == "--ttl must be a number, got '1s'");
  CHECK(usage_error({"demo", "--memory", "4096.5", "--", "true"}) ==
        "--memory must be a whole number, got '4096.5'");
  CHECK(usage_error({"demo", "--memory=", "--", "true"}) ==
        "--memory must be a whole number, got ''");
  CHECK(usage_error({"demo", "--env", "NOVALUE", "--", "true"}) ==
        "--env must look like A=B, got 'NOVALUE'");
  CHECK(usage_error({"demo", "--env", "=v", "--", "true"}) == "--env must look like A=B, got '=v'");
  // Values are parsed in command-line order: the first bad one is reported.
  CHECK(usage_error({"demo", "--ttl", "x", "--bogus"}) == "--ttl must be a number, got 'x'");
}

TEST_CASE("help, version and no command") {
  Global global;
  for (const auto& argv :
       std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"--config", "x", "--help"}}) {
    const CommandLine line = parse_command_line(table(), argv, global);
    CHECK(line.kind == CommandLine::Kind::help);
    CHECK(line.command == nullptr);
  }
  for (const auto& argv : std::vector<std::vector<std::string>>{{"demo", "--help"},
                                                                {"demo", "-h"},
                                                                {"demo", "--image", "a", "--help"},
                                                                {"show", "-h"}}) {
    const CommandLine line = parse_command_line(table(), argv, global);
    CHECK(line.kind == CommandLine::Kind::help);
    REQUIRE(line.command != nullptr);
    CHECK(line.command->info.name == argv[0]);
  }
  // -h after -- belongs to the command.
  CHECK(parse_command_line(table(), {"demo", "--", "ls", "-h"}, global).kind ==
        CommandLine::Kind::run);
  CHECK(parse_command_line(table(), {"--version"}, global).kind == CommandLine::Kind::version);
  CHECK(parse_command_line(table(), {}, global).kind == CommandLine::Kind::no_command);
  CHECK(parse_command_line(table(), {"--log-level", "debug"}, global).kind ==
        CommandLine::Kind::no_command);
}

TEST_CASE("the main help is generated from the table") {
  const std::string help = main_help("sbx - test", table());
  CHECK(help.starts_with("sbx - test\n\nUsage:\n  sbx [global options] <command> [options]\n"));
  CHECK(has(help, "\n  demo    Run a command\n"));
  CHECK(has(help, "\n  show    Show a sandbox\n"));
  CHECK(has(help, "\n  group   Options from a group\n"));
  CHECK(has(help, "--config FILE"));
  CHECK(has(help, "--plugin-dir DIR"));
  CHECK(has(help, "(repeatable)"));
  CHECK(has(help, "--log-level LEVEL"));
  CHECK(has(help, "--version"));
}

TEST_CASE("a command's help is generated from its declaration") {
  const std::string help = command_help(table()[0].info);
  CHECK(help.starts_with("Usage: sbx demo [options] -- COMMAND [ARG...]\n\nRuns a command.\n"));
  // One column for every section; (repeatable) on the first line; continuation lines aligned.
  CHECK(has(help, "\nOptions:\n  --image IMAGE           Sandbox image\n"));
  CHECK(has(help,
            "  --env K=V               Environment variable (repeatable)\n"
            "                          second line of help\n"));
  CHECK(has(help, "  --json                  Print JSON\n"));
  CHECK(has(help, "\nGlobal options:\n  --config FILE           Host configuration"));
  CHECK(has(help, "  -h, --help              Show this help\n"));
  CHECK_FALSE(has(help, "Arguments:"));
  const std::string show = command_help(table()[1].info);
  CHECK(has(show, "\nArguments:\n  ID "));
  CHECK(has(show, "The sandbox\n"));
  // Every declared option appears.
  for (const auto& o : table()[0].info.options)
    CHECK(has(help, "  " + o.name + " "));
}
