// sbx::ExecdTerminal: one terminal of an execd-style server (execd's `/pty` routes, as
// OpenSandbox's execd and sbx-agent serve them), held through its WebSocket (`GET /pty/{id}/ws`)
// for the terminal's life, for a provider offering sbx.pty/1 (target sbx::sdk_http). One reader
// thread per terminal feeds an TerminalOutput, which keeps the output, replays it and serves
// the host's attachments (one at a time, takeover); input and resizes go out on the same socket.
// A terminal another process opened is taken up with the server's replay (takeover).
// ExecdTerminals is a sandbox handle's table of them. The terminal itself is made with the
// server's `POST /pty` (the provider's own HTTP client), and closed with its `DELETE /pty/{id}`.
//
// THREADING: every member is thread-safe.
#pragma once

#include <sbx/sdk/log.hpp>
#include <sbx/sdk/terminal_output.hpp>
#include <sbx/sdk/websocket.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace sbx::sdk {

// Where an execd server is: its socket (a Unix socket, or host and port), the path its routes
// are under ("" at the root; "/sandboxes/ID/proxy/44772" through a gateway) and the headers every
// request carries (an access token: never logged).
struct ExecdPlace {
  WebSocket::Endpoint endpoint;
  std::string prefix;
  std::vector<std::pair<std::string, std::string>> headers;
};

class ExecdTerminal {
 public:
  // The first attach to the server's terminal `id` (made by its POST /pty), in `tty` or pipe
  // mode: on execd the process starts now. Throws Error when the server cannot be reached or
  // refuses.
  ExecdTerminal(const ExecdPlace& place, std::string id, bool tty, Logger log);
  // Takes up a terminal another process (or handle) opened: attaches with a replay of what the
  // server kept (its offsets kept), taking it over from that process when `takeover`. NOT_FOUND
  // for an id the server does not know, FAILED_PRECONDITION when it is held and not `takeover`.
  struct TakeUp {
    bool takeover = true;
  };
  ExecdTerminal(const ExecdPlace& place, std::string id, TakeUp take_up, Logger log);
  // Shuts the socket and joins the reader; an attachment still live ends with NOT_FOUND.
  ~ExecdTerminal();
  ExecdTerminal(const ExecdTerminal&) = delete;
  ExecdTerminal& operator=(const ExecdTerminal&) = delete;

  const std::string& id() const noexcept { return id_; }
  TerminalOutput& output() noexcept { return output_; }
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
  Logger log_;
  TerminalOutput output_;
  WebSocket socket_;
  mutable std::mutex mutex_;
  std::string gone_;        // why input is refused (guarded by mutex_); empty while it runs
  bool replaying_ = false;  // taken up: 0x03 frames are the agent's replay (reader thread only)
  std::thread reader_;
};

// A sandbox's terminals, by id. THREADING: thread-safe.
class ExecdTerminals {
 public:
  // Adds `terminal` unless one of its id is there already (another thread took it up first):
  // returns the one kept.
  std::shared_ptr<ExecdTerminal> add(std::shared_ptr<ExecdTerminal> terminal);
  // Null for an id this handle does not hold.
  std::shared_ptr<ExecdTerminal> find(const std::string& id) const;
  // The one removed, or null.
  std::shared_ptr<ExecdTerminal> remove(const std::string& id);
  // The terminal `id` (unless gone()), or the one `take_up()` makes (then added); one take-up at
  // a time, so two threads never take the same terminal from each other.
  template <class TakeUp>
  std::shared_ptr<ExecdTerminal> find_or(const std::string& id, TakeUp take_up) {
    std::lock_guard lock(take_up_mutex_);
    if (auto found = find(id); found && !found->gone()) return found;
    remove(id);  // one whose connection ended is taken up again
    return add(take_up());
  }
  // Closes terminal `id`: forgets it here and calls `delete_remote` (the server's
  // DELETE /pty/{id}, which throws NOT_FOUND for an id the server does not know). NOT_FOUND then
  // stands unless the terminal was ours and had exited (the server may forget an exited one):
  // closed all the same.
  template <class DeleteRemote>
  void close(const std::string& id, DeleteRemote delete_remote) {
    const std::shared_ptr<ExecdTerminal> mine = remove(id);  // null: another process's
    // Its attachment ends NOT_FOUND now, as sbx.pty/1 says, not with the exit frame the server
    // sends for the process the delete kills (execd: -1).
    if (mine) mine->output().close();
    try {
      delete_remote();
    } catch (const Error& e) {
      if (e.status() != SBX_STATUS_NOT_FOUND || !mine || !mine->output().exit_code()) throw;
    }
  }
  // Every terminal, removed: the sandbox is closing.
  void clear();

 private:
  std::mutex take_up_mutex_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<ExecdTerminal>> terminals_;
};

}  // namespace sbx::sdk
