// Exec: create an exec instance, stream its multiplexed output to the caller as it arrives, read
// the exit code; on timeout or cancellation kill the command's processes inside the container.
#pragma once

#include "docker_api.hpp"

#include <sbx/sdk/provider.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace sbx::local_docker {

// The environment variable that tags every process of one exec (inherited by its children), so a
// timeout can find and kill them all, also those that left the process group.
inline constexpr std::string_view kExecIdVar = "SBX_EXEC_ID";

struct ExecParams {
  std::vector<std::string> argv;  // e.g. {"bash", "-c", command}
  sdk::KeyValues env;             // merged by Docker over the container's env; these win
  std::optional<std::string> cwd;
  std::optional<std::string> user;  // Docker's User: name, uid or uid:gid
  std::chrono::milliseconds timeout{180'000};
};

// Runs one exec to completion and writes its output to `out` as it arrives.
//   - the command ran: its exit code;
//   - `timeout` passed: its tagged processes are killed inside the container and the result is
//     125/"timeout" with the output so far;
//   - the runtime could not start it (no such shell, unknown user...): 125/"sandbox", the runtime's
//     message on stderr;
//   - cancellation: the processes are killed, then Error::cancelled is thrown;
//   - a container that is gone or stopped: NOT_FOUND / FAILED_PRECONDITION errors.
// `started` (optional) is set once the daemon has made the exec, i.e. when an error came after
// the command may have begun.
sdk::ExitStatus run_exec(DockerApi& api, const std::string& container, const ExecParams& params,
                         sdk::OutputSink& out, const sdk::Logger& log,
                         const sdk::CancelToken& cancel, bool* started = nullptr);

// For a command that cannot be started because one of its strings is longer than execve takes
// (MAX_ARG_STRLEN): the message for the caller's stderr, or nothing.
std::optional<std::string> oversized_argument(const ExecParams& params);

// An OutputSink that keeps everything in memory (probe, shell detection).
class CollectingSink final : public sdk::OutputSink {
 public:
  void write(sdk::StdStream stream, std::string_view bytes) override {
    (stream == sdk::StdStream::err ? stderr_text : stdout_text).append(bytes);
  }
  std::string stdout_text;
  std::string stderr_text;
};

// `bytes` random bytes as lowercase hex (names, exec tags).
std::string random_hex(size_t bytes);

// The longest argument or environment string execve takes, counting its NUL (MAX_ARG_STRLEN: 32
// pages, 131072 bytes with 4 KiB pages). The daemon is local, so its kernel is this one.
size_t max_arg_strlen();

}  // namespace sbx::local_docker
