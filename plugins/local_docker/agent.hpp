// sbx-agent in local_docker's sandboxes (agent/README.md; decisions 203-208): how the agent gets
// into a container, where its socket is, and commands run through it.
//
// The agent's binary is embedded in this plugin and written once per agent version to
// `agent_dir` (mode 0700, so only root enters it), then bind-mounted read-only into every
// sandbox as the container's main process. Each sandbox gets a directory of its own under
// `agent_dir`/sandboxes, bind-mounted at /.sbx/run, where the agent makes its unix socket: only
// root on the host reaches it, and no sandbox sees another's.
#pragma once

#include "exec.hpp"

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

// Inside the container.
inline constexpr std::string_view kAgentBinary = "/.sbx/sbx-agent";
inline constexpr std::string_view kAgentRunDir = "/.sbx/run";
inline constexpr std::string_view kAgentSocket = "/.sbx/run/agent.sock";
// Label of a sandbox whose main process is the agent: the host directory of its socket.
inline constexpr std::string_view kAgentLabel = "sbx.agent";
// Label of such a sandbox whose image's USER is not root: that user (AgentLaunch::user).
inline constexpr std::string_view kAgentUserLabel = "sbx.agent.user";

// The host side: the agent's binary and the sandboxes' socket directories under one directory.
// THREADING: thread-safe.
class AgentFiles {
 public:
  explicit AgentFiles(std::string dir) : dir_(std::move(dir)) {}

  // The agent's binary on the host, written on first use (atomically: a temp file renamed into
  // place; mode 0755) into the directory, which is made mode 0700 when missing. An existing
  // directory must be a directory owned by this process's user that no one else can write.
  // Throws Error::unavailable naming the path and the reason.
  std::string binary();
  // Makes the host directory of a sandbox's /.sbx/run and returns it. Mode 01777: the agent
  // may run as the image's user, which must be able to make its socket there; sticky, so no
  // other user of the sandbox can remove or replace it.
  std::string make_run_dir(const std::string& sandbox);
  // Removes that directory and what the sandbox left in it (never following a symbolic link).
  // Nothing when it does not exist.
  void remove_run_dir(const std::string& sandbox) noexcept;
  std::string run_dir(const std::string& sandbox) const;
  // Removes the directories of sandboxes that have ended without a close (their TTL, the reaper,
  // `docker rm`): older than a minute (a younger one may be a create in flight in another
  // process) and whose socket is gone or refuses a connection (no agent listens: the container
  // has stopped; a paused agent's socket still accepts). Asks nothing of the daemon, so a hung
  // daemon cannot stall it. Returns how many it removed.
  size_t sweep();

 private:
  std::string dir_;
  std::mutex mutex_;
  std::string binary_;  // once written
};

// How a command through the agent ended: an exit status, or an error (exactly one is set).
using AgentDoneFn = std::function<void(const sdk::ExitStatus* status, const sdk::Error* error)>;

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
  void start(const std::string& socket, const std::string& sandbox, const ExecParams& command,
             sdk::OutputSink& out, AgentDoneFn done, const sdk::CancelToken& cancel);

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

// Incremental parser of the agent's frames (agent/README.md, "Frames"): a kind byte, the
// payload's length (4 bytes, big-endian), the payload. Not thread-safe.
class FrameParser {
 public:
  // Feeds bytes; calls `on_frame(kind, payload)` for every complete frame.
  void feed(std::string_view bytes, const std::function<void(char, std::string_view)>& on_frame);

 private:
  std::string pending_;
};

}  // namespace sbx::local_docker
