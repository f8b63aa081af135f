// The argument parser and the help texts of `sbx`, generated from the command table (args.hpp).

#include "args.hpp"

#include <algorithm>
#include <charconv>
#include <sstream>

namespace sbx::cli {

double Arg::number() const {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    throw UsageError(std::string(name) + " must be a number, got '" + text + "'");
  }
}

int64_t Arg::whole_number() const {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError(std::string(name) + " must be a whole number, got '" + text + "'");
  }
  return v;
}

std::pair<std::string, std::string> Arg::pair(char separator) const {
  const size_t at = text.find(separator);
  if (at == std::string::npos || at == 0) {
    throw UsageError(std::string(name) + " must look like A" + separator + "B, got '" + text + "'");
  }
  return {text.substr(0, at), text.substr(at + 1)};
}

const std::vector<Option<Global>>& global_options() {
  static const std::vector<Option<Global>> options{
      value<Global>("--config", "FILE", "Host configuration (JSON); default: $SBX_CONFIG if set",
                    [](Global& g, const Arg& a) { g.config = a.text; }),
      repeatable<Global>("--plugin-dir", "DIR",
                         "Also look for plugins in DIR; $SBX_PLUGIN_PATH is also used",
                         [](Global& g, const Arg& a) { g.plugin_dirs.emplace_back(a.text); }),
      value<Global>("--log-level", "LEVEL",
                    "trace, debug, info, warn, error, off; also for plugins' log lines;\n"
                    "default: $SBX_LOG_LEVEL if set, else warn",
                    [](Global& g, const Arg& a) { g.log_level = a.text; }),
  };
  return options;
}

namespace {

bool is_help(const std::string& arg) {
  return arg == "-h" || arg == "--help";
}

// An argument that names an option: "-x", "--name", "--name=value" (a lone "-" is a value).
bool looks_like_option(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-';
}

// Finds the option `arg` names among `options`; `inline_value` gets what follows a '='.
std::optional<size_t> find_option(const std::vector<ArgInfo>& options, const std::string& arg,
                                  std::optional<std::string>& inline_value) {
  const size_t eq = arg.starts_with("--") ? arg.find('=') : std::string::npos;
  const std::string name = arg.substr(0, eq);
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].name == name) {
      if (eq != std::string::npos) inline_value = arg.substr(eq + 1);
      return i;
    }
  }
  return std::nullopt;
}

const std::vector<ArgInfo>& global_infos() {
  static const std::vector<ArgInfo> infos = [] {
    std::vector<ArgInfo> out;
    for (const auto& o : global_options())
      out.push_back(o.info);
    return out;
  }();
  return infos;
}

// Takes the value of the option `option` met at args[i] (inline after '=' or the next argument),
// advancing i past what it used.
std::string take_value(const ArgInfo& option, const std::optional<std::string>& inline_value,
                       const std::vector<std::string>& args, size_t& i) {
  if (option.is_flag()) {
    if (inline_value) throw UsageError(option.name + " takes no value");
    return {};
  }
  if (inline_value) return *inline_value;
  if (i + 1 >= args.size()) throw UsageError(option.name + " needs a value");
  return args[++i];
}

// Applies the global option at args[i], if it is one.
bool take_global(const std::vector<std::string>& args, size_t& i, Global& global) {
  std::optional<std::string> inline_value;
  const auto index = find_option(global_infos(), args[i], inline_value);
  if (!index) return false;
  const Option<Global>& option = global_options()[*index];
  const std::string v = take_value(option.info, inline_value, args, i);
  option.set(global, Arg{option.info.name, v});
  return true;
}

}  // namespace

Scanned scan(const CommandInfo& info, const std::vector<std::string>& args, Global& global,
             const std::function<void(size_t index, const std::string& value)>& on_option) {
  Scanned out;
  const std::string hint = info.trailing.empty() ? "" : " (put the command after --)";
  bool dashes = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      dashes = true;
      auto& into = info.trailing.empty() ? out.positionals : out.trailing;
      into.insert(into.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (is_help(arg)) {
      out.help = true;
      return out;
    }
    if (!looks_like_option(arg)) {
      out.positionals.push_back(arg);
      continue;
    }
    std::optional<std::string> inline_value;
    if (const auto index = find_option(info.options, arg, inline_value)) {
      const std::string v = take_value(info.options[*index], inline_value, args, i);
      on_option(*index, v);
    } else if (!take_global(args, i, global)) {
      throw UsageError("unknown option for " + info.name + ": " + arg + hint);
    }
  }
  if (out.positionals.size() > info.positionals.size()) {
    throw UsageError("unexpected argument for " + info.name + ": '" +
                     out.positionals[info.positionals.size()] + "'" + hint);
  }
  if (out.positionals.size() < info.positionals.size()) {
    throw UsageError(info.name + " needs " + info.positionals[out.positionals.size()].name +
                     " (usage: sbx " + info.name + " " + info.usage + ")");
  }
  if (!info.trailing.empty() && (!dashes || out.trailing.empty())) {
    throw UsageError(info.name + " needs a command after --");
  }
  return out;
}

CommandLine parse_command_line(const std::vector<Command>& table,
                               const std::vector<std::string>& argv, Global& global) {
  CommandLine out;
  size_t i = 0;
  for (; i < argv.size() && looks_like_option(argv[i]); ++i) {
    if (is_help(argv[i])) {
      out.kind = CommandLine::Kind::help;
      return out;
    }
    if (argv[i] == "--version") {
      out.kind = CommandLine::Kind::version;
      return out;
    }
    if (!take_global(argv, i, global)) throw UsageError("unknown option: " + argv[i]);
  }
  if (i >= argv.size()) return out;  // no_command
  const std::string& name = argv[i];
  const auto command = std::find_if(table.begin(), table.end(),
                                    [&](const Command& c) { return c.info.name == name; });
  if (command == table.end()) {
    throw UsageError("unknown command '" + name + "' (try sbx --help)");
  }
  out.command = &*command;
  out.run = command->parse({argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end()}, global);
  out.kind = out.run ? CommandLine::Kind::run : CommandLine::Kind::help;
  return out;
}

namespace {

// One section of a help text: each entry's left column (e.g. "--image IMAGE") padded to `width`,
// then its help, continuation lines indented to the same column.
void write_rows(std::ostringstream& out,
                const std::vector<std::pair<std::string, std::string>>& rows, size_t width) {
  for (const auto& [left, help] : rows) {
    out << "  " << left;
    std::istringstream lines(help);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      out << std::string(first ? width - left.size() : width + 2, ' ') << line << "\n";
      first = false;
    }
    if (first) out << "\n";
  }
}

std::vector<std::pair<std::string, std::string>> option_rows(const std::vector<ArgInfo>& options) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& o : options) {
    std::string help = o.help;
    if (o.repeatable) {
      const size_t end = help.find('\n');
      help.insert(end == std::string::npos ? help.size() : end, " (repeatable)");
    }
    rows.emplace_back(o.name + (o.is_flag() ? "" : " " + o.value_name), help);
  }
  return rows;
}

size_t column(const std::vector<std::vector<std::pair<std::string, std::string>>>& sections) {
  size_t width = 0;
  for (const auto& rows : sections) {
    for (const auto& row : rows)
      width = std::max(width, row.first.size());
  }
  return width + 3;
}

}  // namespace

std::string main_help(std::string_view about, const std::vector<Command>& table) {
  std::vector<std::pair<std::string, std::string>> commands;
  for (const auto& c : table)
    commands.emplace_back(c.info.name, c.info.summary);
  auto globals = option_rows(global_infos());
  globals.emplace_back("-h, --help", "Show help (also: sbx <command> --help)");
  globals.emplace_back("--version", "Show the sbx and ABI versions");
  std::ostringstream out;
  out << about << "\n\nUsage:\n  sbx [global options] <command> [options]\n\nCommands:\n";
  write_rows(out, commands, column({commands}));
  out << "\nGlobal options (also after the command):\n";
  write_rows(out, globals, column({globals}));
  return out.str();
}

std::string command_help(const CommandInfo& info) {
  std::vector<std::pair<std::string, std::string>> positionals;
  for (const auto& p : info.positionals)
    positionals.emplace_back(p.name, p.help);
  const auto options = option_rows(info.options);
  auto globals = option_rows(global_infos());
  globals.emplace_back("-h, --help", "Show this help");
  const size_t width = column({positionals, options, globals});
  std::ostringstream out;
  out << "Usage: sbx " << info.name << " " << info.usage << "\n\n" << info.description;
  if (!positionals.empty()) {
    out << "\nArguments:\n";
    write_rows(out, positionals, width);
  }
  if (!options.empty()) {
    out << "\nOptions:\n";
    write_rows(out, options, width);
  }
  out << "\nGlobal options:\n";
  write_rows(out, globals, width);
  return out.str();
}

}  // namespace sbx::cli
