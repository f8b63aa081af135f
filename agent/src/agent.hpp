// The agent's server: one epoll loop that accepts HTTP connections, runs commands as child process
// groups and streams their output (agent/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sbx::agent {

/// How the agent runs; filled from the command line by main() and read-only afterwards. A value
/// type: copied into the server, which owns its copy.
struct Options {
  std::vector<std::string> listen;  ///< "unix:/path" or "tcp:HOST:PORT" (HOST IPv4 or [IPv6])
  std::string token;                ///< when non-empty, X-EXECD-ACCESS-TOKEN must equal it
  std::string state_dir;            ///< background logs; empty: a private temp dir made and removed
  std::string etc_dir = "/etc";     ///< where passwd and group are read
  std::string shell = "/bin/sh";    ///< the shell a command runs under (`shell -c COMMAND`)
  std::string workdir = "/";        ///< what relative paths of the file routes are relative to
  int64_t ping_ms = 3000;           ///< a ping event after this long without an event
  std::size_t max_head = 16 * 1024;  ///< request head limit (431 above)
  /// Request body limit (413 above; not for uploads): room for a command with the most
  /// arguments and environment the kernel takes (2 MiB with the default stack), JSON-escaped.
  std::size_t max_body = 8 * 1024 * 1024;
  std::size_t log_cap = 16 * 1024 * 1024;  ///< bytes kept of a background command's output
  std::size_t max_finished = 1024;         ///< finished commands remembered for status/logs

  // PID-1 duties (agent/README.md, "PID 1").
  int64_t expires_at = 0;          ///< Unix seconds; 0: none (unless the expiry file gives one)
  std::string expiry_file;         ///< when non-empty, a positive number in it overrides expires_at
  int64_t expiry_poll_ms = 20000;  ///< the expiry is re-checked at least this often
  int64_t stop_grace_ms = 10000;   ///< SIGTERM to the entrypoint at expiry, SIGKILL this later
  std::vector<std::string> entrypoint;  ///< argv of the program started as the agent's child
  std::string user;  ///< USER[:GROUP] the entrypoint runs as; empty: the agent's own
};

/// Serves until it stops, then kills the running commands' process groups, removes its unix
/// sockets and its state, and returns the exit code. When the expiry passes, the running commands
/// are killed at once (a streamed one's end says that the sandbox expired) and every later request
/// but GET /ping is answered 410. Without an entrypoint it stops on SIGTERM or SIGINT, or once the
/// expiry's ends are sent, and returns 0. With one, SIGTERM, SIGINT, SIGHUP, SIGQUIT,
/// SIGUSR1 and SIGUSR2 are forwarded to the entrypoint's process group, the expiry sends it SIGTERM
/// (SIGKILL `stop_grace_ms` later), and the agent stops when the entrypoint exits, returning its
/// exit code, or 128 + the signal that killed it. Other exit codes: 1 when it could not start, 2
/// for an unknown `user`, 127 when the entrypoint's program is not found, 126 when it cannot be
/// run otherwise (permission, the user switch); the reason is written to stderr. Call it once,
/// from the process's only thread: it blocks SIGCHLD and the signals it handles for the process,
/// ignores SIGPIPE, becomes a child subreaper and reaps every child. Owns every fd it opens and
/// closes them before returning.
int run(const Options& options);

}  // namespace sbx::agent
