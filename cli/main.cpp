// The `sbx` command: a thin host over the core library.
//
// This file holds the command table and what happens around every command: the global options
// and the command line are parsed (args.hpp), logging is set up, the command runs, and every error
// becomes an exit status. The commands are in cmd_*.cpp (see commands.hpp for which is where).

#include "args.hpp"
#include "commands.hpp"
#include "shared.hpp"

#include <sbx/sbx.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace sbx::cli;

constexpr const char* kAbout = "sbx - run commands in sandboxes through provider plugins";

// Every command, in the order `sbx --help` lists them.
const std::vector<Command>& command_table() {
  static const std::vector<Command> table{
      plugins_command(), providers_command(),   run_command(),    create_command(),
      exec_command(),    cp_command(),          status_command(), pause_command(),
      resume_command(),  close_command(),       shell_command(),  list_command(),
      reap_command(),    conformance_command(), serve_command(),  reload_command(),
  };
  return table;
}

// One level for every log line, the host's and the plugins' (their loggers are made later with
// the "sbx" logger's level, and the host drops a plugin's line below it before formatting it; a
// plugin asks sbx_host.log_enabled to skip formatting its own): --log-level, else $SBX_LOG_LEVEL,
// else warn.
void setup_logging(const std::optional<std::string>& option) {
  const char* env = std::getenv("SBX_LOG_LEVEL");
  const bool from_env = !option && env && *env;
  const std::string level = option ? *option : from_env ? env : "warn";
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw UsageError("unknown log level '" + level + "'" + (from_env ? " in SBX_LOG_LEVEL" : ""));
  }
  auto logger = spdlog::stderr_color_mt("sbx");
  spdlog::set_default_logger(logger);
  spdlog::set_level(parsed);
}

int run(const std::vector<std::string>& argv) {
  Global global;
  const CommandLine line = parse_command_line(command_table(), argv, global);
  switch (line.kind) {
    case CommandLine::Kind::help:
      std::cout << (line.command ? command_help(line.command->info)
                                 : main_help(kAbout, command_table()));
      return 0;
    case CommandLine::Kind::version:
      std::cout << "sbx " << SBX_VERSION << " (provider ABI " << SBX_ABI_VERSION_MAJOR << "."
                << SBX_ABI_VERSION_MINOR << ")\n";
      return 0;
    case CommandLine::Kind::no_command:
      std::cerr << main_help(kAbout, command_table());
      return kExitUsage;
    case CommandLine::Kind::run:
      break;
  }
  setup_logging(global.log_level);
  return line.run(global);
}

}  // namespace

int main(int argc, char** argv) {
  // A closed stdout is an EPIPE from write(), handled where output is written (sbx run stops the
  // command and closes the sandbox); the default SIGPIPE would kill sbx with the sandbox alive.
  ::signal(SIGPIPE, SIG_IGN);
  try {
    const int code = run(std::vector<std::string>(argv + 1, argv + argc));
    // What the commands printed with std::cout (lists, JSON) must have reached stdout.
    errno = 0;
    if (!std::cout.flush() || std::fflush(stdout) != 0) {
      const int err = errno;
      std::cerr << "sbx: writing to stdout failed"
                << (err != 0 ? std::string(": ") + std::strerror(err) : std::string()) << "\n";
      return code == 0 ? kExitLocalIo : code;
    }
    return code;
  } catch (const UsageError& e) {
    std::cerr << "sbx: " << e.what() << "\n";
    return kExitUsage;
  } catch (const sbx::ConfigError& e) {  // a config file or a provider's config it refused
    std::cerr << "sbx: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const sbx::Error& e) {
    std::cerr << "sbx: error: " << e.what()
              << (e.reason().empty() ? "" : " (reason: " + e.reason() + ")") << "\n";
    return e.local_errno() != 0 ? kExitLocalIo : kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "sbx: error: " << e.what() << "\n";
    return kExitFailure;
  }
}
