// Exec: create an exec instance, stream its multiplexed output to the caller as it arrives, read
// the exit code; on timeout or cancellation kill the command's processes inside the container.
#pragma once

#include "docker_api.hpp"

#include <sbx/sdk/provider.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
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
  bool tty = false;         // a terminal (Docker's Tty): one raw stream, no frames
  bool open_stdin = false;  // AttachStdin (a terminal's input)
};

// Creates an exec instance; `tag` (if any) is set as kExecIdVar in its environment. Its id.
std::string create_exec(DockerApi& api, const std::string& container, const ExecParams& params,
                        const std::optional<std::string>& tag, const sdk::CancelToken& cancel);

struct ExecState {
  bool running = true;
  std::optional<int32_t> exit_code;
  int64_t pid = 0;
};
// Once its stream has ended: the exec's state with its exit code (which may lag the stream's end
// by a moment); INTERNAL when the daemon reports none within 2 s.
ExecState wait_exit_code(DockerApi& api, const std::string& exec_id, const std::string& container,
                         const sdk::CancelToken& cancel);

// Kills every process tagged `tag` (kExecIdVar) in the container, with `shell` as `user`, waiting
// for the kill (at most a few seconds); failures are logged, never thrown.
void kill_tagged(DockerApi& api, const std::string& container, const std::string& shell,
                 const std::optional<std::string>& user, const std::string& tag,
                 const sdk::Logger& log);

// Decodes Docker's multiplexed stream: frames of an 8-byte header (stream byte, three zero bytes,
// big-endian payload length) and the payload. Accepts any chunking. `Out` hears
// begin_frame(stream, size), write(stream, bytes) and end_frame(); stream 1 is stdout, 2 stderr.
template <class Out>
class FrameDecoder {
 public:
  explicit FrameDecoder(Out& out) : out_(out) {}

  void feed(std::string_view bytes) {
    while (!bytes.empty()) {
      if (remaining_ == 0) {
        const size_t n = std::min(header_.size() - header_len_, bytes.size());
        std::memcpy(header_.data() + header_len_, bytes.data(), n);
        header_len_ += n;
        bytes.remove_prefix(n);
        if (header_len_ < header_.size()) return;
        begin_frame();
        continue;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
      out_.write(stream_, bytes.substr(0, n));
      remaining_ -= n;
      bytes.remove_prefix(n);
      if (remaining_ == 0) out_.end_frame();
    }
  }

 private:
  void begin_frame() {
    header_len_ = 0;
    stream_ = header_[0];
    if (stream_ > 3 || header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
      throw sdk::Error::internal("exec output: not a multiplexed stream (bad frame header)");
    }
    remaining_ = (uint32_t{header_[4]} << 24) | (uint32_t{header_[5]} << 16) |
                 (uint32_t{header_[6]} << 8) | uint32_t{header_[7]};
    if (stream_ == 0) stream_ = 1;  // stdin echo does not happen without a TTY; treat as stdout
    out_.begin_frame(stream_, remaining_);
    if (remaining_ == 0) out_.end_frame();
  }

  Out& out_;
  std::array<uint8_t, 8> header_{};
  size_t header_len_ = 0;
  uint64_t remaining_ = 0;
  uint8_t stream_ = 1;
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

// What a command whose sandbox's TTL ended while it ran completes with: NOT_FOUND (the sandbox is
// gone; the command, killed with it, has no result), naming the sandbox and its expiry (Unix
// seconds). docs/sandbox-semantics.md, "Closed and gone sandboxes".
sdk::Error sandbox_expired(const std::string& sandbox, int64_t expires_at);

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
