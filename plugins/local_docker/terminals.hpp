// local_docker's terminals (sbx.pty/1) through the sandbox's agent (agent/README.md, "PTY
// sessions"): POST /pty makes one, then this plugin holds its WebSocket (GET /pty/{id}/ws) for the
// terminal's life. One reader thread per terminal feeds an sdk::TerminalOutput, which keeps the
// output, replays it and serves the host's attachments (one at a time, takeover); input and
// resizes go out on the same socket. A sandbox without the agent has no terminals.
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

 private:
  void read_loop();
  void check_open() const;

  std::string id_;
  sdk::Logger log_;
  sdk::TerminalOutput output_;
  sdk::WebSocket socket_;
  std::mutex mutex_;
  std::string gone_;  // why input is refused (guarded by mutex_); empty while it runs
  std::thread reader_;
};

// A sandbox's terminals, by id. THREADING: thread-safe.
class Terminals {
 public:
  void add(std::shared_ptr<AgentTerminal> terminal);
  // NOT_FOUND for an id this sandbox handle did not open (or closed).
  std::shared_ptr<AgentTerminal> find(const std::string& id) const;
  std::shared_ptr<AgentTerminal> remove(const std::string& id);
  // Every terminal, removed: the sandbox is closing.
  void clear();

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<AgentTerminal>> terminals_;
};

}  // namespace sbx::local_docker
