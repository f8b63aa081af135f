// What several `sbx` commands share: exit codes, making the host, picking the provider, and the
// option groups declared once for all commands that take them (--provider; the sandbox spec of
// run and create; the command options of run and exec; --stop-timeout).
#pragma once

#include "args.hpp"

#include <sbx/sbx.hpp>

#include <signal.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sbx::cli {

// Exit codes (docs/decisions.md, 17, 41, 43 and 63). A command's own return code passes through.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitLocalIo = 74;   // EX_IOERR: writing our output or a local file failed
inline constexpr int kExitFailure = 125;  // like `docker run`: the sandbox, not the command, failed
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitBrokenPipe = 128 + SIGPIPE;  // 141, as a shell reports SIGPIPE
inline constexpr double kDefaultStopTimeout = 10;

// The host of a command: --config (else $SBX_CONFIG) and --plugin-dir.
sbx::Host make_host(const Global& global);

// --provider NAME.
struct ProviderChoice {
  std::optional<std::string> name;

  // The named provider, else the host's default (the config's default_provider, its only block,
  // or local_docker when it has none).
  sbx::Provider pick(sbx::Host& host) const;
};
std::vector<Option<ProviderChoice>> provider_options();

// The sandbox `sbx run` and `sbx create` make: the spec options and --upload.
struct SandboxChoice {
  sbx::SandboxSpec spec;
  std::vector<std::pair<std::string, std::string>> uploads;  // local, remote

  // Everything checkable before a sandbox exists, as usage errors: the spec's values, readable
  // upload files.
  void check() const;
};
std::vector<Option<SandboxChoice>> sandbox_options();

// --timeout S and --user USER, the exec options of `sbx run` and `sbx exec`.
std::vector<Option<sbx::ExecOptions>> command_options();

// --stop-timeout S.
struct StopChoice {
  double stop_timeout_s = kDefaultStopTimeout;
};
std::vector<Option<StopChoice>> stop_options();

// Appends the options of `more` to `options` (for building a command's option list from groups).
template <class F>
void append(std::vector<Option<F>>& options, std::vector<Option<F>> more) {
  for (auto& o : more)
    options.push_back(std::move(o));
}

// Throws UsageError unless `local` is a regular file this process can read ("<what>: X is not a
// readable file").
void require_readable_file(const std::string& local, const std::string& what);

// Starts COMMAND [ARG...] of `sbx run` and `sbx exec`: one word is a command line for the
// sandbox's shell; several are the program and its arguments, run without a shell (as docker exec
// runs them; an image without a shell runs them too).
sbx::Operation<sbx::ExecResult> start_exec(sbx::Sandbox& sandbox,
                                           const std::vector<std::string>& words,
                                           sbx::ExecOptions options);

}  // namespace sbx::cli
