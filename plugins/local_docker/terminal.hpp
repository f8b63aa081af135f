// Terminals without the agent (sbx.pty/1 when "agent" is false): a Docker exec with a TTY (or, in
// pipe mode, stdin and the multiplexed stdout/stderr), started on a connection the daemon hijacks
// (POST /exec/{id}/start with `Upgrade: tcp`, sdk::UpgradedStream). One reader thread per
// terminal feeds an sdk::TerminalOutput (kept output, replay, one attachment, takeover); input goes
// out on the same connection; a resize is POST /exec/{id}/resize.
//
// Held by the handle that opened it: Docker attaches no second stream to a running exec, so
// another handle or process cannot take a terminal up (NOT_FOUND there; with the agent it can,
// decision 235). Its processes carry the exec tag (kExecIdVar): close() kills them all.
//
// THREADING: every member is thread-safe.
#pragma once

#include "docker_api.hpp"

#include <sbx/sdk/log.hpp>
#include <sbx/sdk/terminal_output.hpp>
#include <sbx/sdk/types.hpp>
#include <sbx/sdk/upgraded_stream.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace sbx::local_docker {

class ExecTerminal {
 public:
  // Creates and starts the exec for `request` in `container` with `shell` (the command, or bash
  // when the image has it, else `shell`, interactive), as `user` (none: the container's). Throws
  // when the daemon refuses or does not answer in 10 s.
  ExecTerminal(DockerApi& api, std::string container, std::string shell,
               const sdk::PtyRequest& request, std::optional<std::string> user, sdk::Logger log,
               const sdk::CancelToken& cancel);
  // Shuts the stream and joins the reader; an attachment still live ends with NOT_FOUND. Does not
  // kill the processes (kill() does).
  ~ExecTerminal();
  ExecTerminal(const ExecTerminal&) = delete;
  ExecTerminal& operator=(const ExecTerminal&) = delete;

  const std::string& id() const noexcept { return id_; }
  sdk::TerminalOutput& output() noexcept { return output_; }
  // FAILED_PRECONDITION once the process has exited; TIMEOUT (10 s) or UNAVAILABLE when the
  // daemon does not take the input. resize() waits for the daemon's answer (at most 10 s).
  void write(std::string_view input);
  void resize(uint16_t rows, uint16_t cols);
  // Kills its processes in the container (a few seconds at most; failures are logged).
  void kill();

 private:
  void read_loop();
  void check_running() const;

  DockerApi& api_;
  std::string container_;
  std::string shell_;
  std::optional<std::string> user_;
  std::string tag_;      // kExecIdVar of its processes
  std::string exec_id_;  // Docker's
  std::string id_;       // the terminal's, as the host sees it
  bool tty_ = true;
  sdk::Logger log_;
  sdk::TerminalOutput output_;
  std::mutex send_mutex_;             // one write at a time on the stream
  std::atomic<bool> closing_{false};  // the destructor runs: no exit code to wait for
  std::optional<sdk::UpgradedStream> stream_;
  std::thread reader_;
};

// A sandbox handle's terminals without the agent, by id. THREADING: thread-safe.
class ExecTerminals {
 public:
  void add(std::shared_ptr<ExecTerminal> terminal);
  // NOT_FOUND for an id this handle does not hold.
  std::shared_ptr<ExecTerminal> get(const std::string& id) const;
  // The one removed (NOT_FOUND when there is none).
  std::shared_ptr<ExecTerminal> take(const std::string& id);
  // Every terminal, removed and destroyed (its reader joined): the sandbox is closing.
  void clear();

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<ExecTerminal>> terminals_;
};

}  // namespace sbx::local_docker
