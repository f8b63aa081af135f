// sbx-agent in local_docker's sandboxes (agent/README.md; decisions 203-208, 251): commands and
// file transfers through it. Where its binary and socket are on the host: host_dirs.hpp.
//
// Every byte read from an agent is the sandbox's: its root can stop the agent's socket from
// answering and bind a program of its own in its place. What this client reads is bounded (a
// frame's length, an answer's head and error body, a download's declared length) and each
// request has an idle timeout, so such a program fails its own sandbox's calls with a clear
// error and nothing else.
#pragma once

#include "exec.hpp"
#include "frames.hpp"
#include "host_dirs.hpp"

#include <sbx/sdk/http.hpp>
#include <sbx/sdk/provider.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::local_docker {

// The agent's bytes and content hash (16 hex digits), embedded by the build.
std::string_view agent_program() noexcept;
std::string_view agent_hash() noexcept;

// Label of a sandbox whose main process is the agent: the host directory of its socket.
inline constexpr std::string_view kAgentLabel = "sbx.agent";
// Label of such a sandbox whose image's USER is not root: that user (AgentLaunch::user).
inline constexpr std::string_view kAgentUserLabel = "sbx.agent.user";

// Whether `error` (a connection to an agent's socket) failed because the socket's path was changed
// from inside the sandbox (sdk::kUnixSocketRefused): the sandbox is then unreachable, not gone.
bool route_refused(const sdk::Error& error);
// The error for sandbox `name` whose route was refused: UNAVAILABLE, saying so.
sdk::Error unreachable(const std::string& name, const sdk::Error& error);

// How a command through the agent ended: an exit status, or an error (exactly one is set).
using AgentDoneFn = std::function<void(const sdk::ExitStatus* status, const sdk::Error* error)>;

// A command started through an agent, as far as its output flow goes: hold(true) stops reading
// its stream, hold(false) reads again; from any thread, also from inside its output's write;
// nothing once it has ended. THREADING: thread-safe.
class AgentCommand {
 public:
  AgentCommand() = default;
  explicit AgentCommand(std::function<void(bool)> hold) : hold_(std::move(hold)) {}
  void hold(bool hold) const {
    if (hold_) hold_(hold);
  }

 private:
  std::function<void(bool)> hold_;
};

// Commands through the agents of many sandboxes, over the SDK's HTTP client: one loop thread for
// all of them, no thread per running command. THREADING: thread-safe; callbacks run on the
// client's loop thread.
class AgentClient {
 public:
  explicit AgentClient(sdk::Logger log);

  // Starts `command` (what Docker exec would run: argv, env over the container's, cwd, user as
  // Docker's `USER[:GROUP]`, timeout) through the agent of sandbox `sandbox` (named in errors)
  // listening on `socket` and returns at once. Output goes to `out` as it arrives (byte-exact),
  // then `done` runs once:
  //   - the command ran: its exit code (128+N when killed by signal N);
  //   - its timeout passed: the agent killed its process group; 125/"timeout";
  //   - it could not start (no such program, user or directory): 125/"sandbox", the reason on
  //     `out`'s stderr;
  //   - the sandbox expired while it ran (the agent killed it and said so: "sandbox_expired" in
  //     its end), or had expired when it was asked for (410): NOT_FOUND, no result;
  //   - cancellation: the connection is closed, which makes the agent kill the command's process
  //     group; Error::cancelled;
  //   - the agent cannot be reached or went away: Error::unavailable.
  // Both callbacks run on the loop thread (`done` may run on the calling thread when the request
  // cannot even start).
  // Returns the command's output flow: hold(true) stops reading its stream (sbx.flow/1).
  AgentCommand start(const std::string& socket, const std::string& sandbox,
                     const ExecParams& command, sdk::OutputSink& out, AgentDoneFn done,
                     const sdk::CancelToken& cancel);

  // GET /ping: true for a 200 within `timeout`.
  bool ping(const std::string& socket, std::chrono::milliseconds timeout);

  // Files through the agent, blocking the calling thread (a pool thread) until done; `path` is
  // absolute and normalized (container_path), `sandbox` names it in errors. These and the
  // terminal calls below: a sandbox that has expired (the agent's 410 SANDBOX_EXPIRED) is
  // NOT_FOUND.

  // POST /files/upload: streams `source` as `path` with `mode`, missing parents made (0755). All
  // or nothing: the agent writes a temp file and renames it over the path only once all of it has
  // arrived. When the source fails or the upload is cancelled midway, the body is ended early
  // (it is sent chunked for this), and this returns only once the agent has answered, i.e. removed
  // its temp file. Errors: a directory at `path` or on the way INVALID_ARGUMENT, a read-only file
  // system FAILED_PRECONDITION, the source's error, Error::cancelled, Error::unavailable when the
  // agent cannot be reached.
  void upload(const std::string& socket, const std::string& sandbox, const std::string& path,
              uint32_t mode, sdk::ByteSource& source, const sdk::CancelToken& cancel);
  // GET /files/download: streams the regular file at `path` into `sink`, checked against its
  // Content-Length. Missing: NOT_FOUND; a directory, a link or another kind: INVALID_ARGUMENT.
  void download(const std::string& socket, const std::string& sandbox, const std::string& path,
                sdk::ByteSink& sink, const sdk::CancelToken& cancel);
  // Whether the agent runs as root (its socket's owner, by GET /files/info): the files it writes
  // are then root's, as the Engine API's archive writes them.
  bool runs_as_root(const std::string& socket, const sdk::CancelToken& cancel);

  // A terminal's HTTP half (agent/README.md, "PTY sessions"; its WebSocket is
  // sdk::ExecdTerminal's): POST /pty with the JSON `body`, returning the new terminal's id, and
  // DELETE /pty/{id}. A refused body is INVALID_ARGUMENT, an unknown id NOT_FOUND, the agent's
  // bound reached RESOURCE_EXHAUSTED, each with the agent's message.
  std::string open_pty(const std::string& socket, const std::string& body,
                       const sdk::CancelToken& cancel);
  void delete_pty(const std::string& socket, const std::string& id, const sdk::CancelToken& cancel);

 private:
  sdk::Logger log_;
  sdk::http::Client http_;  // last: destroyed first, ending every command while the rest lives
};

}  // namespace sbx::local_docker
