// The `sbx` command line, without running anything: the parser and help texts generated from a
// command table (cli/args.hpp), and how sandboxes are named (cli/target.hpp). The table
// here is a small one of its own; tests/cli_test.cpp runs the real commands.

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/test_helpers.hpp"
#include "args.hpp"
#include "target.hpp"

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
  CHECK_FALSE(seen.global.log_level.has_value());  // not given: main.cpp picks the default
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

// ---- Sandbox arguments -------------------------------------------------------------------------

namespace {

SandboxRef sandbox_of(const std::string& text) {
  return sandbox_ref(Arg{"ID", text});
}

std::string sandbox_error(const std::string& text) {
  return error_of<UsageError>([&] { sandbox_of(text); }).what();
}

}  // namespace

TEST_CASE("a sandbox is an id, a descriptor, or @FILE holding one") {
  const SandboxRef id = sandbox_of("sbx-0123");
  CHECK(id.id == "sbx-0123");
  CHECK(boost::json::parse(id.descriptor) == boost::json::parse(R"({"sandbox_id": "sbx-0123"})"));
  // An id with characters JSON must escape is escaped, not spliced.
  CHECK(boost::json::parse(sandbox_of(R"(a"b\c)").descriptor).at("sandbox_id") == R"(a"b\c)");

  const std::string text =
      R"({"format": "sbx.descriptor/1", "provider": "local_docker", "sandbox_id": "sbx-9"})";
  const SandboxRef descriptor = sandbox_of(text);
  CHECK(descriptor.id == "sbx-9");
  CHECK(descriptor.descriptor == text);  // passed on as given

  sbx::testing::TempDir dir("sbx-cli-args");
  sbx::testing::write_file(dir.path / "d.json", text + "\n");
  const SandboxRef file = sandbox_of("@" + (dir.path / "d.json").string());
  CHECK(file.id == "sbx-9");
  CHECK(boost::json::parse(file.descriptor) == boost::json::parse(text));

  CHECK(sandbox_error("") == "ID must not be empty");
  CHECK(has(sandbox_error("{not json"), "the ID is not a sandbox descriptor (a JSON object)"));
  CHECK(sandbox_error(R"({"provider": "x"})") == R"(the ID has no "sandbox_id")");
  CHECK(sandbox_error(R"({"sandbox_id": 5})") == R"(the ID has no "sandbox_id")");
  CHECK(has(sandbox_error("@" + (dir.path / "missing.json").string()),
            "cannot read the sandbox descriptor file"));
  CHECK(has(sandbox_error("@" + dir.path.string()), "is a directory"));
  sbx::testing::write_file(dir.path / "id.txt", "sbx-1\n");
  CHECK(has(sandbox_error("@" + (dir.path / "id.txt").string()),
            "is not a sandbox descriptor (a JSON object)"));
}

TEST_CASE("cp: one side in a sandbox, the other local") {
  const CopyPaths up = copy_paths("in.txt", "sbx-1:/work/in.txt");
  CHECK(up.upload);
  CHECK(up.local == "in.txt");
  CHECK(up.sandbox.id == "sbx-1");
  CHECK(up.remote == "/work/in.txt");

  const CopyPaths down = copy_paths("sbx-1:out.txt", "/tmp/x/out.txt");
  CHECK_FALSE(down.upload);
  CHECK(down.remote == "out.txt");  // relative: the sandbox's workdir
  CHECK(down.local == "/tmp/x/out.txt");

  // Local paths with a colon: starting with '/' or '.'.
  CHECK(copy_paths("./a:b", "sbx-1:/x").local == "./a:b");
  CHECK(copy_paths("sbx-1:/x", "/tmp/a:b").local == "/tmp/a:b");

  // A descriptor side ends where its JSON does, whatever colons it holds.
  const CopyPaths json = copy_paths(R"({"sandbox_id": "a:b", "x": "}:"}:/r:s)", "local");
  CHECK(json.sandbox.id == "a:b");
  CHECK(json.remote == "/r:s");

  sbx::testing::TempDir dir("sbx-cli-cp");
  sbx::testing::write_file(dir.path / "d.json", R"({"sandbox_id": "sbx-7"})");
  const CopyPaths file = copy_paths("@" + (dir.path / "d.json").string() + ":/r", "local");
  CHECK(file.sandbox.id == "sbx-7");
  CHECK(file.remote == "/r");

  // A directory target gets the other side's file name.
  CHECK(copy_paths("sbx-1:/w/out.txt", dir.path.string()).local == (dir.path / "out.txt").string());
  CHECK(copy_paths("/tmp/in.txt", "sbx-1:/w/").remote == "/w/in.txt");

  auto cp_error = [](const std::string& a, const std::string& b) {
    return std::string(error_of<UsageError>([&] { copy_paths(a, b); }).what());
  };
  CHECK(cp_error("a", "b") == "cp needs one side in a sandbox, as ID:PATH");
  CHECK(has(cp_error("sbx-1:/a", "sbx-2:/b"), "one side must be a local path"));
  CHECK(cp_error("sbx-1:", "b") == "'sbx-1:' has no path after the ':'");
  CHECK(has(cp_error(R"({"sandbox_id": "a"})", "b"), "does not look like {DESCRIPTOR}:PATH"));
  CHECK(has(cp_error("@file", "b"), "names a sandbox but no path in it"));
  CHECK(cp_error(":/x", "b") == "SANDBOX must not be empty");
}
