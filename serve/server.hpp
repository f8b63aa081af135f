// sbx::serve::Server: an OpenSandbox-compatible HTTP server (Boost.Beast over Asio) in front of one
// sbx::Provider. It serves GET /health and the lifecycle routes (create, get, list, delete, pause,
// resume, renew-expiration, endpoints), each at the root and under /v1 (README.md, docs/serve.md),
// and, with Options::admin, POST /admin/reload and GET /admin/providers (docs/hot-swap.md).
//
// THREADING: one io_context run by Options::threads threads; every connection has its own strand.
// Provider calls are the asynchronous host API (Operation<T>::then): their continuations run on a
// plugin thread and only post the result back onto the connection's strand. No thread is made per
// request. port(), stop() and the constructor may be called from any thread; run() from one.
//
// OWNERSHIP: the server owns the sandboxes it created (a registry of sbx::Sandbox), and those it
// found again in Options::state_dir; a graceful stop closes them all, bounded by Options::grace
// (or, with Options::keep_on_stop, leaves them running for the next server).
#pragma once

#include <sbx/core/host.hpp>
#include <sbx/core/provider.hpp>

#include <boost/json/object.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sbx::serve {

class Faults;  // faults.hpp

struct Options {
  std::string host = "127.0.0.1";  // an IP address literal to listen on
  uint16_t port = 0;               // 0: any free port (see Server::port())
  // Listen on this unix socket instead of host:port. The file is made with `socket_mode` (set
  // before the socket listens, so no connection comes before), an existing socket file nobody
  // listens on is replaced, anything else there is refused; ~Server removes it. No API key is
  // needed: the file's permissions say who may connect.
  std::optional<std::filesystem::path> unix_socket;
  unsigned socket_mode = 0600;
  std::optional<std::string> api_key;  // when set, OPEN-SANDBOX-API-KEY is required
  int threads = 2;
  std::size_t header_limit = 16 * 1024;  // bytes of a request's start line and headers (431)
  std::size_t body_limit = 1024 * 1024;  // bytes of a request body (413)
  std::chrono::milliseconds read_timeout{30000};  // a slow client's request; then the socket closes
  std::chrono::milliseconds grace{10000};         // how long a stop waits for sandboxes to close
  bool handle_signals = false;                    // SIGINT/SIGTERM start a graceful stop
  std::size_t max_sandboxes = 0;  // sandboxes held or being created at once; 0: no cap (429)
  std::size_t max_streams = 0;    // event streams open at once (0: unlimited)
  // How often an event stream sends a ping while its command is silent.
  std::chrono::milliseconds keepalive_ping{3000};
  // The fault-injection plan (faults.hpp), from the config file's serve.faults; null: no faults.
  // Shared by every connection (thread-safe).
  std::shared_ptr<Faults> faults;
  // One descriptor file per sandbox (sbx.connect/1), so that a restarted server finds its
  // sandboxes again; the directory is locked by one server at a time. Unset: nothing is kept.
  std::optional<std::filesystem::path> state_dir;
  // A graceful stop leaves the sandboxes running (detached, their descriptors kept in state_dir)
  // instead of closing them. Needs state_dir.
  bool keep_on_stop = false;
  // A command event stream or download whose client accepts no bytes for this long is cut (and its
  // command cancelled).
  std::chrono::milliseconds stream_stall_timeout{120000};
  // Bytes queued for one stream's client. A command event stream over it is cut (the client is
  // too slow: the connection is reset and the command cancelled); a plugin thread never waits.
  std::size_t stream_buffer = 4 * 1024 * 1024;
  std::string temp_root;  // where the server's temp dir goes ("": the system's)
  // Per sandbox (docs/serve.md "Limits"): commands started at the provider at once, foreground and
  // background; commands waiting for one of those slots (no thread held); beyond both, 429
  // TOO_MANY_COMMANDS. Keep max_commands below the provider's own exec concurrency (local_docker's
  // exec.concurrency, 32) so that one sandbox cannot take every provider slot.
  std::size_t max_commands = 8;
  std::size_t max_queued_commands = 24;
  // Finished command records kept per sandbox (the oldest goes first, with its log).
  std::size_t kept_commands = 50;
  // Bytes of one background command's log; the rest of its output is dropped (a marker line says
  // so). 0: no cap.
  std::uint64_t command_log_limit = 8ull << 20;
  // Bytes of the server's temp dir used by transfers (downloads and uploads staged) at once; over
  // it, the transfer is refused with 507 INSUFFICIENT_STORAGE. 0: no cap.
  std::uint64_t temp_limit = 4ull << 30;

  // The limits a reload may change while the server runs (Server::set_limits): the fields of the
  // same names above are where they start.
  struct Limits {
    std::size_t max_sandboxes, max_streams, max_commands, max_queued_commands, kept_commands;
    std::uint64_t command_log_limit;
    std::size_t stream_buffer;
  };
  Limits limits() const {
    return {max_sandboxes, max_streams,       max_commands, max_queued_commands,
            kept_commands, command_log_limit, stream_buffer};
  }

  // Hot swap (docs/hot-swap.md), set by `sbx serve` from its host. Unset: the /admin routes
  // answer 404, SIGHUP is ignored, and every sandbox comes from the provider given.
  struct Admin {
    // The provider new sandboxes go to: the host's current generation of the served block.
    std::function<sbx::Provider()> provider;
    // Reloads (re-reading the config file). Throws sbx::Error (ReloadError for a refused reload).
    // Runs plugin code (loads, canaries): called on the server's admin thread, one at a time.
    std::function<sbx::ReloadReport()> reload;
    // Makes a reload in progress stop waiting for plugin code (Host::stop_reloads), so that a
    // stopping server never waits for a plugin that does not return. Called when the stop begins
    // and before the admin thread is joined (any thread). Optional.
    std::function<void()> stop_reloads;
    // The generations alive, current and draining (Host::generations).
    std::function<std::vector<sbx::GenerationInfo>()> generations;
    // Host::move_to_current: a handle on the current generation, or nullopt when `sandbox` is on
    // it already; throws when the sandbox cannot move. Called on the admin thread.
    std::function<std::optional<sbx::Sandbox>(sbx::Sandbox& sandbox)> move;
    // What a reload does with the sandboxes the server holds on a replaced generation when the
    // request does not say (SIGHUP, a watched change, POST /admin/reload without a body): false
    // lets them drain on it, true moves them through `move`.
    bool move_sandboxes = false;
    // Files and directories whose changes start a reload (watch.cpp): the config file, the plugin
    // directories, the plugin files the config names. Asked again after every reload. Unset: no
    // watching.
    std::function<std::vector<std::filesystem::path>()> watched;
  };
  std::optional<Admin> admin;
};

// Throws std::invalid_argument for an address that is not an IP literal, or a non-loopback one
// without an API key, std::runtime_error for a unix socket path holding something else than a
// stale socket (a file, a directory, a socket a server listens on), for keep_on_stop without
// state_dir, for a state_dir with a provider that cannot connect (sbx.connect/1);
// std::runtime_error when the state directory cannot be used or is locked by another server;
// boost::system::system_error when the address cannot be bound. With a state_dir, the constructor
// connects to every sandbox recorded there (blocking, before serving).
class Server {
 public:
  Server(sbx::Provider provider, Options options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port bound (the real one when Options::port was 0); 0 on a unix socket.
  uint16_t port() const;
  // [any thread] The limits in force, and new ones (a reload of the config's serve section): a
  // request admitted after the call sees them; what was admitted keeps what it was given (a
  // stream its buffer, a sandbox's finished records shrink at its next command's end).
  Options::Limits limits() const;
  void set_limits(const Options::Limits& limits);

  // Serves until a stop completes. Returns true when every sandbox the server created was closed
  // within the grace period, false when some were still closing (they keep their labels: sbx reap).
  bool run();

  // Starts a graceful stop: no new connection is accepted, creates in flight are cancelled, and
  // every sandbox the server holds is closed; run() returns once they are, or after the grace
  // period. Idempotent, thread-safe.
  void stop();

  struct State;  // shared with connections and continuations (server.cpp)

 private:
  std::shared_ptr<State> state_;
};

// True when `host` is a loopback IP literal (127.0.0.0/8, ::1) or "localhost".
bool is_loopback(const std::string& host);

}  // namespace sbx::serve
