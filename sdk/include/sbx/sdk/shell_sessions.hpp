// sbx::sdk::ShellSessions: sbx.session/1 (sbx/abi/ext/session.h) over the provider's own exec, for
// a provider whose exec runs `sh -c` in the sandbox with a writable $TMPDIR or /tmp. Derive from it
// alongside Provider and pass `*this`:
//
//   class MyProvider final : public sdk::Provider, public sdk::ShellSessions {
//    public:
//     MyProvider(...) : sdk::ShellSessions(static_cast<sdk::Provider&>(*this)) {}
//   };
//
// A session's state lives in the sandbox (sbx/base/shell_session.hpp), so its id works from any
// handle, in any process. Opening runs one exec that saves the session's first state (its cwd and
// env); each run is one exec of the session's script; closing runs one exec that kills the runs
// still going and removes the state. A session's user is part of its id ("<random>.<user>"), so a
// user name must be 1..64 bytes of [A-Za-z0-9_.-].
//
// Each run's exec carries SBX_SESSION_ID (the session's id) in its env: a provider whose exec
// kills what a command leaves behind when it ends must spare such a run's background jobs (they
// are the point of a session), and still kill them on timeout or cancellation.
//
// A run in a session this object closed, or with an id it could not have made, fails at once with
// NOT_FOUND; a run in a session another process closed ends with exit 125 and "sbx: session <id>
// not found" on stderr (only the sandbox knows).
//
// THREADING: thread-safe.
#pragma once

#include <sbx/sdk/provider.hpp>

#include <mutex>
#include <set>
#include <string>

namespace sbx::sdk {

class ShellSessions : public SessionExtension {
 public:
  explicit ShellSessions(Provider& provider) : provider_(provider) {}

  void open_session(Sandbox& sandbox, SessionRequest request,
                    Completion<std::string> done) override;
  void run_in_session(Sandbox& sandbox, std::string session_id, ExecRequest request,
                      ExecCompletion done) override;
  void close_session(Sandbox& sandbox, std::string session_id, Completion<void> done) override;

 protected:
  ~ShellSessions() = default;

 private:
  void require_known(const std::string& session_id);

  Provider& provider_;
  std::mutex mutex_;
  std::set<std::string> closed_;  // ids closed through this object
};

}  // namespace sbx::sdk
