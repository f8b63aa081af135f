// local_docker's terminals (sbx.pty/1) through the sandbox's agent (agent/README.md, "PTY
// sessions"): POST /pty makes one, then this plugin holds its WebSocket (GET /pty/{id}/ws) for the
// terminal's life. One reader thread per terminal feeds an sdk::TerminalOutput, which keeps the
// output, replays it and serves the host's attachments (one at a time, takeover); input and
// resizes go out on the same socket. A terminal another process opened is taken up with the
// agent's replay (takeover). A sandbox without the agent has no terminals.
#pragma once

#include "agent.hpp"

#include <sbx/sdk/terminal_output.hpp>
#include <sbx/sdk/websocket.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace sbx::local_docker {

class AgentTerminal {
 public:
  // Attaches to the agent's terminal `id` (made by AgentClient::open_pty), in `tty` or pipe
  // mode. Throws sdk::Error when the socket cannot be reached or the agent refuses.
  AgentTerminal(const std::string& socket, std::string id, bool tty, sdk::Logger log);
  // Takes up a terminal another process (or handle) opened: attaches with a replay of what the
  // agent kept (its offsets kept), taking it over from that process when `takeover`. NOT_FOUND
  // for an id the agent does not know, FAILED_PRECONDITION when it is held and not `takeover`.
  struct TakeUp {
    bool takeover = true;
  };
  AgentTerminal(const std::string& socket, std::string id, TakeUp take_up, sdk::Logger log);
  // Shuts the socket and joins the reader; an attachment still live ends with NOT_FOUND.
  ~AgentTerminal();
  AgentTerminal(const AgentTerminal&) = delete;
  AgentTerminal& operator=(const AgentTerminal&) = delete;

  const std::string& id() const noexcept { return id_; }
  sdk::TerminalOutput& output() noexcept { return output_; }
  // Sends input (in frames of at most 64 KiB) or a new size. FAILED_PRECONDITION once the process
  // has exited or the terminal was taken by another client of the agent; UNAVAILABLE or TIMEOUT
  // (10 s) when the agent does not take it.
  void write(std::string_view input);
  void resize(uint16_t rows, uint16_t cols);
  // Whether its connection ended without the process's exit (taken over elsewhere, the sandbox
  // gone): a later use takes it up again.
  bool gone() const;

 private:
  void read_loop();
  void check_open() const;

  std::string id_;
  sdk::Logger log_;
  sdk::TerminalOutput output_;
  sdk::WebSocket socket_;
  mutable std::mutex mutex_;
  std::string gone_;        // why input is refused (guarded by mutex_); empty while it runs
  bool replaying_ = false;  // taken up: 0x03 frames are the agent's replay (reader thread only)
  std::thread reader_;
};

// A sandbox's terminals, by id. THREADING: thread-safe.
class Terminals {
 public:
  // Adds `terminal` unless one of its id is there already (another thread took it up first):
  // returns the one kept.
  std::shared_ptr<AgentTerminal> add(std::shared_ptr<AgentTerminal> terminal);
  // Null for an id this handle does not hold.
  std::shared_ptr<AgentTerminal> find(const std::string& id) const;
  // The one removed, or null.
  std::shared_ptr<AgentTerminal> remove(const std::string& id);
  // The terminal `id` (unless gone()), or the one `take_up()` makes (then added); one take-up at
  // a time, so two threads never take the same terminal from each other.
  template <class TakeUp>
  std::shared_ptr<AgentTerminal> find_or(const std::string& id, TakeUp take_up) {
    std::lock_guard lock(take_up_mutex_);
    if (auto found = find(id); found && !found->gone()) return found;
    remove(id);  // one whose connection ended is taken up again
    return add(take_up());
  }
  // Every terminal, removed: the sandbox is closing.
  void clear();

 private:
  std::mutex take_up_mutex_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<AgentTerminal>> terminals_;
};

}  // namespace sbx::local_docker
