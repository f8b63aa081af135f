// The host's side of local_docker's sandboxes: one directory (`agent_dir`, mode 0700, so only its
// owner enters it) that holds what the host must keep where no sandbox can write (decision 251):
//
//   sbx-agent-HASH            the agent's binary, bind-mounted read-only at /.sbx/sbx-agent
//   sandboxes/NAME/           one per sandbox (0700), never mounted: nothing inside reaches it
//     run/                    (01777) bind-mounted read-write at /.sbx/run: the agent's socket
//     ttl/expires_at          (ttl/ 0755) ttl/ bind-mounted read-only at /.sbx/ttl: the expiry
//                             in force (reaper/expiry_file.hpp)
//
// A sandbox's root can change what is in its run/ (rename, delete, link, bind a socket of its
// own there); the host reaches the agent through sbx::sdk::connect_unix without following a link
// (agent.cpp), so whatever it puts there reaches that sandbox or nothing. It cannot write ttl/ (a
// read-only mount; remounting needs CAP_SYS_ADMIN, which Docker does not grant), so the expiry
// that the agent, the keep-alive and the reaper honour is the host's.
//
// THREADING: thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::local_docker {

// Inside the container.
inline constexpr std::string_view kAgentBinary = "/.sbx/sbx-agent";
inline constexpr std::string_view kAgentRunDir = "/.sbx/run";
inline constexpr std::string_view kAgentSocket = "/.sbx/run/agent.sock";
inline constexpr std::string_view kTtlDir = "/.sbx/ttl";

class HostDirs {
 public:
  // `dir` is made canonical (its existing part's links resolved), so that the paths below it have
  // no link that sdk::connect_unix would refuse.
  explicit HostDirs(const std::string& dir);

  // The agent's binary on the host, written on first use (atomically: a temp file renamed into
  // place; mode 0755) into the directory, which is made mode 0700 when missing. An existing
  // directory must be a directory owned by this process's user that no one else can write.
  // Throws Error::unavailable naming the path and the reason.
  std::string binary();

  // Makes sandbox `name`'s directory with run/ when `agent`, and ttl/ holding `expires_at` when
  // set. Throws Error::unavailable (naming the path) when it cannot, Error::invalid_argument for
  // a name that is not one path component of [A-Za-z0-9_.-] (not starting with '.').
  void make(const std::string& name, bool agent, std::optional<int64_t> expires_at);
  // Removes sandbox `name`'s directory and what the sandbox left in its run/ (never following a
  // symbolic link). Nothing when it does not exist.
  void remove(const std::string& name) noexcept;

  // The host paths of sandbox `name`'s run/, its agent's socket and its ttl/.
  std::string run_dir(const std::string& name) const;
  std::string socket(const std::string& name) const;
  std::string ttl_dir(const std::string& name) const;

  // The expiry in force (Unix seconds) in sandbox `name`'s ttl/expires_at; nothing when there is
  // none (a sandbox without a TTL, made by an older plugin, or whose directory is gone).
  std::optional<int64_t> read_expiry(const std::string& name) const;
  // Replaces it (a temp file renamed over it: a reader sees the old expiry or the new one).
  // Throws Error::failed_precondition when the sandbox has no ttl/ (its mount would not see a new
  // one), Error::unavailable when it cannot be written.
  void write_expiry(const std::string& name, int64_t expires_at);

  // Removes the directories of sandboxes that have ended without a close (their TTL, the reaper,
  // `docker rm`): older than a minute (a younger one may be a create in flight in another
  // process) and either with an agent's socket that is gone or refuses a connection (no agent
  // listens: the container has stopped; a paused agent's socket still accepts), or without one
  // and an expiry more than a minute past. Asks nothing of the daemon, so a hung daemon cannot
  // stall it, and follows no link a sandbox left. Returns how many it removed.
  size_t sweep();

 private:
  std::string sandbox_dir(const std::string& name) const;

  std::string dir_;
  std::mutex mutex_;
  std::string binary_;  // once written
};

}  // namespace sbx::local_docker
