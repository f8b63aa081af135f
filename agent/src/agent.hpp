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
  std::size_t max_head = 16 * 1024;        ///< request head limit (431 above)
  std::size_t max_body = 1024 * 1024;      ///< request body limit (413 above; not for uploads)
  std::size_t log_cap = 16 * 1024 * 1024;  ///< bytes kept of a background command's output
  std::size_t max_finished = 1024;         ///< finished commands remembered for status/logs
};

/// Serves until SIGTERM or SIGINT, then kills the running commands' process groups, removes its
/// unix sockets and its state, and returns the exit code (0, or 1 when it could not start; the
/// reason is written to stderr). Call it once, from the process's only thread: it blocks SIGCHLD,
/// SIGTERM and SIGINT for the process, ignores SIGPIPE, becomes a child subreaper and reaps every
/// child. Owns every fd it opens and closes them before returning.
int run(const Options& options);

}  // namespace sbx::agent
