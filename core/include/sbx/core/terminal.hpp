// sbx::Session and sbx::Pty: a sandbox's persistent shells (sbx.session/1) and terminals
// (sbx.pty/1), from Sandbox::open_session, Sandbox::open_pty and Sandbox::pty. See
// docs/terminals.md for what each guarantees.
//
// Both are named by an id the provider made, valid for any handle to the same sandbox (in any
// process) until closed: id() and Sandbox::pty(id) are how a second client finds a terminal.
// Each holds its sandbox (not the Sandbox object): the sandbox handle lives until they are gone.
// Destroying a Session or Pty does NOT close it (a terminal outlives the client that opened it,
// as in NeMo Gym); call close().
//
// THREADING: both may be used from several threads at once. Output callbacks run on a plugin
// thread, one call at a time, in order: keep them short.
#pragma once

#include <sbx/core/operation.hpp>
#include <sbx/core/spec.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sbx {

namespace detail {
struct SandboxState;
}

// NeMo Gym's preserve_background_services: a shell whose cwd, exported variables and background
// jobs carry from one command to the next.
struct SessionOptions {
  std::optional<std::string> cwd;   // default: the spec's workdir
  StringMap env;                    // exported before the first command
  std::optional<std::string> user;  // default: the sandbox's
};

class Session {
 public:
  Session() = default;
  Session(std::shared_ptr<detail::SandboxState> sandbox, std::string id);

  bool valid() const noexcept { return sandbox_ != nullptr; }
  const std::string& id() const noexcept { return id_; }

  // One command in the session, with exec's options and results (options.user is ignored: the
  // session's user runs it). NotFoundError once the session was closed.
  ExecResult run(std::string_view command, ExecOptions options = {});
  Operation<ExecResult> run_async(std::string command, ExecOptions options = {});

  // Kills the session's commands still running; what they started in the background lives on.
  void close();
  Operation<void> close_async();

 private:
  std::shared_ptr<detail::SandboxState> sandbox_;
  std::string id_;
};

// NeMo Gym's PtySpec: a command (or the user's shell) on a terminal of rows x cols, or in pipe
// mode (tty false: stdout and stderr apart, no line discipline).
struct PtyOptions {
  std::optional<std::string> command;  // run by `sh -c`; none: the user's shell
  std::optional<std::string> cwd;
  StringMap env;
  std::optional<std::string> user;
  uint16_t rows = 24;
  uint16_t cols = 80;
  bool tty = true;
};

// How an attachment reads: from an offset of the terminal's output (0: all that is kept; none:
// only what comes next), taking the terminal over from another attachment or not.
struct PtyAttachOptions {
  std::optional<uint64_t> since = 0;
  bool takeover = true;
  // Output with its offset (the first call's says where the replay really starts). Required.
  std::function<void(OutputStream, uint64_t offset, std::string_view)> on_output;
  // Optional: the attachment is in place (the terminal exists and this attachment holds it), once,
  // before any output, on a plugin thread; never for an attach that fails at once (an unknown id:
  // NotFoundError). From a plugin built before ABI 1.3, which cannot say, it is called on the
  // calling thread as soon as the attach has started (output may have come first). Like
  // on_output, it must not block for long.
  std::function<void()> on_attached;
};

class Pty {
 public:
  Pty() = default;
  Pty(std::shared_ptr<detail::SandboxState> sandbox, std::string id);

  bool valid() const noexcept { return sandbox_ != nullptr; }
  const std::string& id() const noexcept { return id_; }

  // Reads the terminal until its process exits (the operation's value: its exit code). Ends with
  // FailedPreconditionError (reason "taken_over") when another attach took the terminal over,
  // NotFoundError when it was closed, CancelledError when cancelled (a detach: the process goes
  // on). Never bounded by a deadline of the host's: cancel it to stop reading.
  Operation<int32_t> attach_async(PtyAttachOptions options);

  // Sends keys (bytes) to the terminal, in the order the writes were started.
  void write(std::string_view input);
  Operation<void> write_async(std::string input);
  void resize(uint16_t rows, uint16_t cols);
  Operation<void> resize_async(uint16_t rows, uint16_t cols);
  // Kills the process if it still runs and forgets the terminal.
  void close();
  Operation<void> close_async();

 private:
  std::shared_ptr<detail::SandboxState> sandbox_;
  std::string id_;
};

}  // namespace sbx
