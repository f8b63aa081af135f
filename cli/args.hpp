// The command table of `sbx` and its argument parser.
//
// Every command is declared once, as a CommandSpec<F>: its name, a one-line summary, a usage line,
// a description, its options (name, value or flag, repeatable, help text, and the parser that
// stores the value into a typed field of F), its positional arguments and, for commands that run
// something, the words after `--`. The parser, `sbx --help` and `sbx <command> --help` are all
// generated from those declarations; nothing else lists options.
//
// Rules of the command line (docs/decisions.md, 60):
//   - `--name value` and `--name=value`; a value option takes the next argument whatever it looks
//     like (`--timeout -5`, `--image --json`); a flag refuses `=value`;
//   - a repeatable option adds each value; any other option given twice keeps the last value;
//   - global options (--config, --plugin-dir, --log-level) are taken before or after the command
//     name, anywhere before `--`; -h/--help anywhere before `--` asks for the help;
//   - `--` ends the options: what follows is the command to run (run, exec) or more positional
//     arguments (other commands), never options.
//
// This file and args.cpp use the standard library only; they are the static library
// sbx_cli_args, which the parsing unit tests (tests/cli_args_test.cpp) link alone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::cli {

// A command line the user got wrong: `sbx` prints the message and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The global options, parsed once wherever they appear: what every command needs to make a host.
struct Global {
  std::optional<std::string> config;  // --config FILE (else $SBX_CONFIG, read by the command)
  std::vector<std::filesystem::path> plugin_dirs;  // --plugin-dir DIR, in order
  std::optional<std::string> log_level;  // --log-level LEVEL (else $SBX_LOG_LEVEL, else warn)
};

// A value from the command line with the name it was given for, so that parsers can say which
// option or argument is wrong in the words `sbx` has always used.
struct Arg {
  std::string_view name;  // "--ttl", or a positional argument's name such as "ID"
  const std::string& text;

  // A number (fractions allowed): "--ttl must be a number, got 'x'".
  double number() const;
  // A whole number: "--memory must be a whole number, got '4096.5'".
  int64_t whole_number() const;
  // "A<sep>B" with a non-empty A: "--env must look like A=B, got 'x'".
  std::pair<std::string, std::string> pair(char separator) const;
};

// Stores a parsed value into a field of F; throws UsageError for a value it refuses.
template <class F>
using Setter = std::function<void(F&, const Arg&)>;

// How an option or a positional argument is shown in help texts and recognised by the parser.
struct ArgInfo {
  std::string name;        // "--image" for an option, "ID" for a positional argument
  std::string value_name;  // "IMAGE"; empty for a flag (and for positional arguments)
  std::string help;        // one or more lines, without the column layout
  bool repeatable = false;

  bool is_flag() const { return value_name.empty(); }
};

// One option of a command whose parsed arguments are an F.
template <class F>
struct Option {
  ArgInfo info;
  Setter<F> set;  // a flag's setter gets an empty text
};

// A flag: `--json`.
template <class F>
Option<F> flag(std::string name, std::string help, bool F::*field) {
  return {{std::move(name), "", std::move(help), false},
          [field](F& f, const Arg&) { f.*field = true; }};
}
// An option with a value: `--image IMAGE`.
template <class F>
Option<F> value(std::string name, std::string value_name, std::string help, Setter<F> set) {
  return {{std::move(name), std::move(value_name), std::move(help), false}, std::move(set)};
}
// An option that may be given several times, each value going through `set`: `--env K=V`.
template <class F>
Option<F> repeatable(std::string name, std::string value_name, std::string help, Setter<F> set) {
  return {{std::move(name), std::move(value_name), std::move(help), true}, std::move(set)};
}

// The options of a part of a command's fields (e.g. the spec options shared by run and create),
// as options of the whole: `member` selects the part.
template <class F, class Part>
std::vector<Option<F>> options_of(Part F::*member, const std::vector<Option<Part>>& options) {
  std::vector<Option<F>> out;
  for (const auto& o : options) {
    out.push_back({o.info, [member, set = o.set](F& f, const Arg& a) { set(f.*member, a); }});
  }
  return out;
}

// A required positional argument of a command whose parsed arguments are an F.
template <class F>
struct Positional {
  std::string name;  // "ID", "SOURCE"
  std::string help;
  Setter<F> set;
};

// The words after `--` of a command that runs something (run, exec): required, at least one.
template <class F>
struct Trailing {
  std::string name;  // "COMMAND [ARG...]"
  std::function<void(F&, std::vector<std::string>)> set;
};

// What the parser and the help texts know of a command, whatever its fields.
struct CommandInfo {
  std::string name;
  std::string summary;      // one line, for `sbx --help`
  std::string usage;        // the usage line after "sbx <name> "
  std::string description;  // paragraphs of `sbx <name> --help`, each line ending in '\n'
  std::vector<ArgInfo> options;
  std::vector<ArgInfo> positionals;  // all required, in order
  std::string trailing;              // "COMMAND [ARG...]" after `--`; empty: none
};

// A command ready for the table: its description and its parser. `parse` reads the arguments
// after the command's name (global options among them go into `global`) and returns the command's
// handler bound to its parsed fields, or an empty function when the arguments asked for help.
struct Command {
  CommandInfo info;
  std::function<std::function<int(const Global&)>(const std::vector<std::string>& args,
                                                  Global& global)>
      parse;
};

// The declaration of a command whose parsed arguments are an F (default-constructed, so F's
// member initialisers are the defaults).
template <class F>
struct CommandSpec {
  std::string name;
  std::string summary;
  std::string usage;
  std::string description;
  std::vector<Option<F>> options;
  std::vector<Positional<F>> positionals;
  std::optional<Trailing<F>> trailing;
  // Checks what needs several fields or the file system, after parsing and before the handler
  // (everything a user can get wrong before a sandbox exists is a usage error). May be empty.
  std::function<void(F&)> check;
  std::function<int(F&, const Global&)> handler;
};

// The global options, as options of Global.
const std::vector<Option<Global>>& global_options();

// What a command's arguments held besides its options, which `scan` hands to a callback as it
// meets them (so that a value is refused in command-line order).
struct Scanned {
  bool help = false;  // -h/--help came first; the scan stopped there
  std::vector<std::string> positionals;
  std::vector<std::string> trailing;  // after `--`, for a command with CommandInfo::trailing
};

// Reads the arguments after a command's name: each option of `info` goes to
// `on_option(index, value)` (an empty value for a flag), each global option into `global`.
// Throws UsageError for an unknown option, a missing value, a value given to a flag, and wrong
// numbers of positional arguments or a missing command after `--`.
Scanned scan(const CommandInfo& info, const std::vector<std::string>& args, Global& global,
             const std::function<void(size_t index, const std::string& value)>& on_option);

// Makes a table entry of a declaration.
template <class F>
Command make_command(CommandSpec<F> spec) {
  CommandInfo info{spec.name, spec.summary, spec.usage, spec.description, {}, {}, {}};
  for (const auto& o : spec.options)
    info.options.push_back(o.info);
  for (const auto& p : spec.positionals)
    info.positionals.push_back({p.name, "", p.help, false});
  if (spec.trailing) info.trailing = spec.trailing->name;
  auto shared = std::make_shared<const CommandSpec<F>>(std::move(spec));
  return {
      info,
      [info, spec = std::move(shared)](const std::vector<std::string>& args,
                                       Global& global) -> std::function<int(const Global&)> {
        auto fields = std::make_shared<F>();
        const Scanned scanned = scan(info, args, global, [&](size_t i, const std::string& v) {
          spec->options[i].set(*fields, Arg{spec->options[i].info.name, v});
        });
        if (scanned.help) return {};
        for (size_t i = 0; i < scanned.positionals.size(); ++i) {
          spec->positionals[i].set(*fields, Arg{spec->positionals[i].name, scanned.positionals[i]});
        }
        if (spec->trailing) spec->trailing->set(*fields, scanned.trailing);
        if (spec->check) spec->check(*fields);
        return [spec, fields](const Global& g) { return spec->handler(*fields, g); };
      }};
}

// What a whole command line asks for.
struct CommandLine {
  enum class Kind {
    help,        // print the help of `command`, or the main help when it is null; exit 0
    version,     // print the version; exit 0
    no_command,  // print the main help to stderr; exit 2
    run,         // call `run`
  };
  Kind kind = Kind::no_command;
  const Command* command = nullptr;
  std::function<int(const Global&)> run;
};

// Parses `sbx [global options] <command> [arguments]` against `table`; global options go into
// `global`. Throws UsageError ("unknown command 'x' (try sbx --help)", "unknown option: --x", and
// whatever the command's parser refuses).
CommandLine parse_command_line(const std::vector<Command>& table,
                               const std::vector<std::string>& argv, Global& global);

// `sbx --help`: `about`, the usage line, the commands with their summaries, the global options.
std::string main_help(std::string_view about, const std::vector<Command>& table);
// `sbx <command> --help`: usage, description, arguments, options, global options.
std::string command_help(const CommandInfo& info);

}  // namespace sbx::cli
