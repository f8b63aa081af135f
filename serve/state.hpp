// What the server's parts share (internal to serve): the server state, the registry of the
// sandboxes the server created, and the types the route files answer with.
//
// THREADING: State is shared (shared_ptr) by the connections and by the continuations of provider
// operations; its registry (Registry) and its stop's counts (StopGate) guard themselves. A route
// handler runs on its connection's strand and answers through `Reply`, which may be called once,
// from any thread (it posts to the strand).
#pragma once

#include "metrics.hpp"
#include "registry.hpp"
#include "server.hpp"
#include "stop_gate.hpp"

#include <sbx/core/sandbox.hpp>

#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace sbx::serve {

namespace http = boost::beast::http;

// The longest TTL a create may ask for and the furthest a renew may push an expiry, in seconds
// from now: sbx::base::kForever (about 31 years), so that no expiry overflows the time types.
inline constexpr int64_t kMaxTimeoutS = 1'000'000'000;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// Answers a request; callable once, from any thread.
using Reply = std::function<void(Response)>;

// The execd state of one sandbox: its commands (running and finished) and their logs
// (routes_execd_command.cpp). Thread-safe.
struct ExecdState;
std::shared_ptr<ExecdState> new_execd_state();
// Cancels the sandbox's running commands and frees their records and logs; later commands are
// refused. Idempotent, any thread, never blocks on the provider.
void shutdown_execd(ExecdState& execd);
// How many of the sandbox's commands still run.
int running_commands(ExecdState& execd);

// The bash sessions of one sandbox (routes_execd_session.cpp): POST /session's ids, each with
// its working directory and its latest runs. Thread-safe.
struct SessionTable;
std::shared_ptr<SessionTable> new_session_table();

// A response sent in pieces once its head is out: an event stream (chunked) or a download (with a
// Content-Length). Made by the connection (OpenStream) for one request.
//
// THREADING: every member may be called from any thread; they post to the connection's strand
// and never block. Memory is bounded by the caller: queued() says how many bytes wait to be
// written (a download sends its next piece from the last one's `done`; an event stream is cut
// with abort() when a slow client lets too much wait). The `done` callbacks and the on_gone
// callback run on the strand.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Queues `data` (a chunk of an event stream, raw bytes of a sized body); `done` runs once it is
  // written (or dropped because the client is gone).
  virtual void send(std::string data, std::function<void()> done = {}) = 0;
  // Ends the response (the last chunk of a chunked one). Idempotent.
  virtual void end() = 0;
  // Bytes sent and not yet written to the socket.
  virtual std::size_t queued() const = 0;
  // Cuts the response: what waits is dropped and the connection is reset, without the chunked
  // body's end (the client sees the stream break off); the stream is then gone (on_gone runs).
  virtual void abort() = 0;
  // True once the client went away (reset, EOF, a write that failed or stalled).
  virtual bool gone() const = 0;
  // `fn` runs once on the strand when the client goes away before end() (at once if it already
  // has). Set it once, before relying on it.
  virtual void on_gone(std::function<void()> fn) = 0;
  // For a stream whose producer is held while its client reads slowly (a command's events,
  // sbx.flow/1): a client that accepts nothing for any time keeps the stream (no stall timeout;
  // TCP keepalive still finds a peer that vanished). Call before sending.
  virtual void never_stall() = 0;
  // Fault injection (a plan's cut_after_events): after `pieces` more pieces are written, the
  // connection is reset without the rest and without the chunked body's end, as a network cut
  // looks to a client; the stream is then gone (on_gone runs). Call before sending.
  virtual void cut_after(int pieces) = 0;
};

// A request whose answer is not out yet (a download being staged): `fn` runs once, on the
// connection's strand, if the client closes or resets the connection before it is answered.
// Watching stops at the answer, or when the client sends more bytes (a pipelined request).
// Call at most once per request, from any thread.
using WatchHangup = std::function<void(std::function<void()> fn)>;

// A connection taken over from the HTTP loop (a WebSocket upgrade, GET /pty/{id}/ws).
using Connection = boost::beast::basic_stream<boost::asio::generic::stream_protocol>;
// Takes the request's connection over: `fn` gets it on the connection's strand (its executor),
// with the request read whole; the request counts as answered (101, for GET /metrics) and the
// server's HTTP loop is done with the connection. Call once, instead of reply(), from any thread.
using TakeConnection = std::function<void(std::function<void(Connection)> fn)>;

// The terminals of one sandbox (routes_execd_pty.cpp): POST /pty's ids, each with its sbx.pty/1
// terminal once started and the WebSocket attached to it. Thread-safe.
struct PtyTable;
std::shared_ptr<PtyTable> new_pty_table();

// One sandbox's metrics reads, shared by its GET /metrics/watch streams (routes_execd_fs.cpp).
class MetricsSampler;

// The server's temporary space for transfers (Options::temp_limit): bytes taken while a file is
// staged in the temp dir, given back when it goes. Thread-safe.
class TempSpace {
 public:
  explicit TempSpace(std::uint64_t limit) : limit_(limit) {}
  // Takes `n` bytes; false (nothing taken) when that would pass the limit.
  bool take(std::uint64_t n) {
    std::uint64_t used = used_.load();
    do {
      if (limit_ > 0 && (used + n < used || used + n > limit_)) return false;
    } while (!used_.compare_exchange_weak(used, used + n));
    return true;
  }
  void give(std::uint64_t n) { used_ -= n; }
  std::uint64_t used() const { return used_.load(); }
  std::uint64_t limit() const { return limit_; }

 private:
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
};

// Sends `head` (its body ignored) and returns the sink for the rest. `chunked`: Transfer-Encoding
// chunked, and the client going away is watched for (the socket peeked at); otherwise `head`
// carries the Content-Length. Either way the connection is kept alive after the stream when the
// request allows it.
// Call once per request, from any thread (the head goes out on the connection's strand, before
// anything sent through the sink), and then never reply().
using OpenStream = std::function<std::shared_ptr<ChunkSink>(Response head, bool chunked)>;

// A request body consumed as it arrives (POST /files/upload): write() gets the bytes in order, on
// the connection's strand; finish() once the body is complete. Either may answer early through
// the Reply they were made with; after an answer the connection reads nothing more and closes.
class BodySink {
 public:
  virtual ~BodySink() = default;
  // False: stop reading (an answer was given).
  virtual bool write(std::string_view bytes) = 0;
  virtual void finish() = 0;
  // The client went away or the read failed: drop what was received (temp files).
  virtual void abort() = 0;
};

// A sandbox the server created (or found again in its state directory), with what the lifecycle
// API reports of it. Filled in before it enters the registry; after that only `expires_at`
// changes (renew), under the Registry's mutex, and the Sandbox handle (a reload that moves
// sandboxes to the new generation, docs/hot-swap.md), under its own mutex. The Sandbox itself is
// thread-safe. Owned jointly (shared_ptr) by the registry and the requests using it.
struct Entry {
  // The handle requests use; one taken before a move keeps working on the old generation.
  std::shared_ptr<sbx::Sandbox> box() const {
    std::lock_guard lock(box_mutex_);
    return box_;
  }
  void set_box(std::shared_ptr<sbx::Sandbox> box) {
    std::lock_guard lock(box_mutex_);
    box_ = std::move(box);
  }
  std::string id;  // box()->id(), kept: a detached Sandbox has none
  std::string image;
  std::vector<std::string> entrypoint;
  // Its metadata (the create's, then as PATCH /sandboxes/{id}/metadata changed it). Any thread.
  std::optional<boost::json::object> metadata() const {
    std::lock_guard lock(metadata_mutex_);
    return metadata_;
  }
  void set_metadata(std::optional<boost::json::object> metadata) {
    std::lock_guard lock(metadata_mutex_);
    metadata_ = std::move(metadata);
  }
  // JSON Merge Patch (RFC 7396) of string values: a string sets its key, null removes it. The
  // caller has checked `patch`.
  void patch_metadata(const boost::json::object& patch) {
    std::lock_guard lock(metadata_mutex_);
    boost::json::object& m = metadata_ ? *metadata_ : metadata_.emplace();
    for (const auto& [k, v] : patch) {
      if (v.is_null()) {
        m.erase(k);
      } else {
        m[k] = v;
      }
    }
  }
  std::chrono::system_clock::time_point created_at;
  // Set by the entry's maker before it enters the registry; from then on guarded by the Registry's
  // mutex: read with Registry::expires_at, changed with Registry::renew.
  std::optional<std::chrono::system_clock::time_point> expires_at;
  std::string descriptor;  // sbx.connect/1 descriptor, when the server keeps a state directory
  // The state directory's writes of this sandbox (store.cpp), one at a time; once its record was
  // removed (store_remove) it is never written again.
  std::mutex store_mutex;
  bool store_removed = false;  // guarded by store_mutex
  // Its commands (execd API); shut down by begin_close.
  std::shared_ptr<ExecdState> execd = new_execd_state();
  // Its bash sessions (execd API); their runs are commands of `execd`.
  std::shared_ptr<SessionTable> sessions = new_session_table();
  // Its terminals (execd API, over sbx.pty/1).
  std::shared_ptr<PtyTable> ptys = new_pty_table();
  // The sampler its GET /metrics/watch streams share (routes_execd_fs.cpp), while one watches.
  std::mutex metrics_mutex;
  std::weak_ptr<MetricsSampler> metrics_sampler;  // guarded by metrics_mutex
  // Known to no longer run: the provider said so (a status of stopped, an error with the reason
  // sandbox_gone). From then on every execd route answers 409 DOCKER::SANDBOX_NOT_RUNNING at once,
  // before any stream (docs/serve.md, "A sandbox that no longer runs"). Any thread.
  std::atomic<bool> not_running{false};

 private:
  mutable std::mutex box_mutex_;
  std::shared_ptr<sbx::Sandbox> box_;
  mutable std::mutex metadata_mutex_;
  std::optional<boost::json::object> metadata_;
};

// The server's io_context, with execution_context::shutdown made callable.
class ServeContext : public boost::asio::io_context {
 public:
  using boost::asio::io_context::shutdown;
};

struct Server::State {
  sbx::Provider provider;  // the provider given; see current_provider()
  Options options;
  // The provider new sandboxes go to: the host's current generation with Options::admin (a
  // reload may have replaced it), else `provider`.
  sbx::Provider current_provider() const {
    return options.admin && options.admin->provider ? options.admin->provider() : provider;
  }
  // Declared before what uses it, so destroyed after. ~Server shuts it down first: that destroys
  // the handlers a stop leaves queued (a cancelled timer's, an idle connection's read), each
  // holding the state, and so ends the cycle that kept the state, its sandboxes and the provider
  // alive at exit.
  ServeContext ioc;
  // Where the acceptor, the grace timer and the stop's steps run, one at a time.
  boost::asio::strand<boost::asio::io_context::executor_type> control;
  // TCP or a unix socket (Options::unix_socket): connections are generic stream sockets.
  boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol> acceptor;
  boost::asio::steady_timer grace_timer;
  boost::asio::steady_timer sweep_timer;  // closes sandboxes whose TTL passed (on `control`)
  uint16_t port = 0;                      // 0 on a unix socket
  // The socket file of Options::unix_socket, made by the constructor: removed (if it is still the
  // one made, same device and inode) by ~Server, or by this object's destructor when the
  // constructor fails after making it.
  struct SocketFile {
    std::filesystem::path path;
    unsigned long long device = 0, inode = 0;
    SocketFile(std::filesystem::path p, unsigned long long d, unsigned long long i)
        : path(std::move(p)), device(d), inode(i) {}
    SocketFile(const SocketFile&) = delete;
    SocketFile& operator=(const SocketFile&) = delete;
    ~SocketFile();
  };
  std::optional<SocketFile> socket_file;
  int state_dir_lock = -1;  // flock'ed file descriptor of Options::state_dir/.lock, or -1
  int temp_dir_lock = -1;   // flock'ed file descriptor of temp_dir/.lock: this server lives
  // A private directory for command logs and file transfers, made by the constructor and removed
  // with everything in it by the destructor.
  std::filesystem::path temp_dir;
  // Bytes of transfers staged in temp_dir (Options::temp_limit).
  TempSpace temp_space{options.temp_limit};
  // Options::Limits in force (Server::set_limits): read them here, not in `options`.
  struct LiveLimits {
    std::atomic<std::size_t> max_sandboxes, max_streams, max_commands, max_queued_commands,
        kept_commands, stream_buffer;
    std::atomic<std::uint64_t> command_log_limit;
    explicit LiveLimits(const Options::Limits& l) { set(l); }
    void set(const Options::Limits& l) {
      max_sandboxes = l.max_sandboxes;
      max_streams = l.max_streams;
      max_commands = l.max_commands;
      max_queued_commands = l.max_queued_commands;
      kept_commands = l.kept_commands;
      stream_buffer = l.stream_buffer;
      command_log_limit = l.command_log_limit;
    }
    Options::Limits get() const {
      return {max_sandboxes, max_streams,       max_commands, max_queued_commands,
              kept_commands, command_log_limit, stream_buffer};
    }
  } limits{options.limits()};

  // The sandboxes held, kept by a stop, and being created (thread-safe, registry.hpp).
  Registry registry;
  // What a stop waits for: requests, closes, creates, commands (thread-safe, stop_gate.hpp). Its
  // finish stops the io_context (on `control`, after cancelling the grace timer).
  //
  // The registry and the gate have a mutex each, never held together (neither calls the other),
  // so there is no lock order between them (the registry's may be taken under an Entry's
  // store_mutex and takes an Entry's box mutex; the gate's is a leaf). They are kept consistent by
  // the order of the steps, so that a sandbox not in the registry (not entered yet, or taken out)
  // and not closed yet is always counted in the gate (as a create or a close): the gate cannot
  // finish without it:
  //  - a close outside the stop (DELETE, the TTL's retire) counts itself (gate.begin_close) before
  //    it takes the entry out of the registry, and uncounts itself (end_close) if another took it;
  //  - a create counts itself (gate.begin_create, refused once stopping) before the registry gives
  //    it a ticket, and ends in the registry (end_create: the entry enters, or is refused when the
  //    registry is closed) before the gate's end_create, which, for a refused one, turns the
  //    create into a close in one step;
  //  - the stop closes the registry first (registry.close: once, deciding which stop() call is
  //    the stop; the held sandboxes leave it, and no sandbox enters after), then counts the
  //    sandboxes it took with gate.stop(n), in the step that sets `stopping`: until then the gate
  //    cannot finish. A create's operation is cancelled by the stop (when close() finds it) or by
  //    the create itself (set_create_op says the registry was closed first), both decided under
  //    the registry's mutex, so exactly one of them does.
  StopGate gate;
  RequestMetrics metrics;  // GET /metrics (thread-safe)
  // Hot swap (Options::admin, routes_admin.cpp): reloads run one at a time on the admin thread,
  // started with the first one and joined by ~Server.
  struct AdminQueue {
    struct Job {
      std::optional<bool> move;
      std::function<void(bool ok, boost::json::object body)> done;  // null: SIGHUP's, watch's
    };
    std::mutex mutex;  // guards what follows
    std::condition_variable wake;
    std::deque<Job> jobs;
    bool stopping = false;
    std::thread thread;
    int64_t reloads = 0;       // put in service
    int64_t refused = 0;       // rolled back as a whole
    boost::json::object last;  // the last reload's outcome (empty before the first)
    // Called after every reload that was put in service (the watcher sets its watches again).
    std::function<void()> on_reloaded;
  } admin_queue;
  // inotify, made by the constructor with Admin::watched; run() hands it to watch.cpp. Touched only
  // by the thread that constructs, runs and destroys the Server (never concurrently).
  int watch_fd = -1;
  // SIGINT/SIGTERM and SIGHUP (Options::handle_signals), caught from the constructor on: a signal
  // that comes before run() (just after "listening" was printed) waits there for run()'s handler
  // instead of killing the process.
  std::optional<boost::asio::signal_set> signals, hangups;

  State(sbx::Provider p, Options o);
};

// Starts closing `entry`'s sandbox. The caller has counted it as a close in the gate
// (StopGate::begin_close, StopGate::end_create(true) or StopGate::stop) and holds no lock: the
// operation may complete at once, on this thread. When it ends, the close is uncounted
// (StopGate::end_close) and `done` runs (on a plugin thread, or this one) with the error, if any.
void begin_close(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
                 std::function<void(std::exception_ptr)> done);

// The registry entry for `id`, or nullptr. One whose expiry has passed is retired first (answered
// as unknown, as the real server answers once its TTL timer removed the container).
std::shared_ptr<Entry> find_live(const std::shared_ptr<Server::State>& state,
                                 const std::string& id);
// Takes `entry` out of the registry (if it is still there) and closes its sandbox in the
// background, counted as a close in the gate; its state file goes too. Holds no lock.
void retire(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
            const char* why);
// Retires every entry whose expiry is at or before `now` (the TTL sweep).
void retire_expired(const std::shared_ptr<Server::State>& state);

// The state directory (store.cpp): one JSON file per sandbox, written atomically (a unique
// temporary file, fsync, rename, fsync of the directory); a no-op without Options::state_dir.
// Errors are logged, not thrown. The writes of one entry are serialised; after store_remove,
// store_save does nothing for that entry.
void store_save(Server::State& state, Entry& entry);
void store_remove(const Server::State& state, Entry& entry);
// The metadata key (hence, on local_docker, the container label) that marks the sandbox of one
// create with its token, so that a restarted server finds it when the create was interrupted.
inline constexpr const char* kCreateLabel = "sbx.serve.create";
// Records a create about to be asked of the provider (its token, the provider block, the label),
// durably, before the provider is called; "" on success (or without a state directory), else
// the error. store_end_create removes the record once the create ended either way.
std::string store_begin_create(const Server::State& state, const std::string& token,
                               const std::string& image,
                               std::chrono::system_clock::time_point created_at);
void store_end_create(const Server::State& state, const std::string& token);
// Locks the directory (creating it), connects to every sandbox recorded there (files of
// sandboxes that are gone are removed), then reconciles the creates a crash interrupted: their
// sandbox is closed (sbx.list-reap/1, by kCreateLabel) unless a record names it. Blocking:
// called by the constructor.
void store_load(Server::State& state);

// The Sandbox object of the lifecycle API (GET, list) for `entry` in `status`. Reads expires_at:
// the caller holds no lock.
boost::json::object sandbox_json(const std::shared_ptr<Server::State>& state, const Entry& entry,
                                 sbx::SandboxStatus status);
Response not_found(const Request& request, const std::string& id);
// A request's JSON body as the real server reads it; when it is empty or not JSON, answers
// FastAPI's 422 (`missing` at ["body"], `json_invalid` with the offset) and returns nullopt.
std::optional<boost::json::value> parse_json_body(const Request& request, const Reply& reply);
Response method_not_allowed(const Request& request);
// For GET /metrics: the type of an answer of 400 or more (RequestMetrics::record), else "".
std::string error_type(const Response& response);

// A request given to its route's handler (routes.hpp). The handler answers once, through
// `reply` (from any thread), or, for a route of the event stream or a download, through
// `open_stream`.
struct Call {
  std::shared_ptr<Server::State> state;
  const Request& request;  // for a body handler, the head alone
  Reply reply;
  std::string sandbox_id;           // the sandbox the path names, or empty
  std::vector<std::string> params;  // the template's other {...} segments, in order
  std::shared_ptr<Entry> entry;     // execd routes: the sandbox, live (execd_entry)
  OpenStream open_stream;           // execd routes
  WatchHangup watch_hangup;         // execd routes
  TakeConnection take_connection;   // execd routes
};

// The handlers of the route table (routes.cpp), by file; each is named for its method and path.
// routes_health.cpp
void get_health(const Call& call);
// routes_lifecycle.cpp
void get_sandboxes(const Call& call);
void post_sandboxes(const Call& call);
void get_sandbox(const Call& call);
void delete_sandbox(const Call& call);
void patch_sandbox_metadata(const Call& call);
// routes_sandbox_ops.cpp
void post_pause(const Call& call);
void post_resume(const Call& call);
void post_renew_expiration(const Call& call);
void get_endpoint(const Call& call);
// routes_execd_command.cpp
void get_ping(const Call& call);
void post_command(const Call& call);
void delete_command(const Call& call);
void get_command_status(const Call& call);
void get_command_logs(const Call& call);
// routes_execd_session.cpp
void post_session(const Call& call);
void post_session_run(const Call& call);
void delete_session(const Call& call);
// routes_execd_pty.cpp
void post_pty(const Call& call);
void get_pty(const Call& call);
void get_pty_ws(const Call& call);  // a WebSocket (take_connection)
void delete_pty(const Call& call);
// routes_execd_files.cpp
void get_files_info(const Call& call);
void get_files_download(const Call& call);
std::shared_ptr<BodySink> post_files_upload(const Call& call);  // the body read as it arrives
// routes_execd_fs.cpp
void post_directories(const Call& call);
void delete_directories(const Call& call);
void get_directories_list(const Call& call);
void delete_files(const Call& call);
void post_files_mv(const Call& call);
void post_files_permissions(const Call& call);
void get_files_search(const Call& call);
void post_files_replace(const Call& call);
void get_execd_metrics(const Call& call);  // execd's GET /metrics, not the server's own
void get_execd_metrics_watch(const Call& call);
// routes_metrics.cpp
void get_metrics(const Call& call);
void post_metrics_events(const Call& call);  // the SDKs' create-latency telemetry: 204
// routes_admin.cpp
void post_admin_reload(const Call& call);
void get_admin_providers(const Call& call);

// Queues a reload on the admin thread (Options::admin); `done` gets the answer (on that thread).
// `move`: whether sandboxes on a replaced generation move to the new one (unset: the default,
// Admin::move_sandboxes). Without `done` (SIGHUP, the watcher) a reload already waiting to start
// covers this one. Once the server stops, `done` gets a refusal at once.
void start_reload(const std::shared_ptr<Server::State>& state, std::optional<bool> move,
                  std::function<void(bool ok, boost::json::object body)> done);
// Lets the running reload finish, refuses those not started, joins the admin thread (~Server).
void stop_admin(Server::State& state);
// Starts watching Admin::watched (watch.cpp) with State::watch_fd: a change starts a reload.
void start_watch(const std::shared_ptr<Server::State>& state);

// A command as POST /command's body gives it (routes_execd_command.cpp).
// execd's env file: the variable that names it in every sandbox this server creates, and where.
inline constexpr std::string_view kExecdEnvsVar = "EXECD_ENVS";
inline constexpr std::string_view kExecdEnvsFile = "/opt/opensandbox/.env";

struct CommandRequest {
  std::string command;
  std::optional<std::string> cwd;
  bool background = false;
  std::optional<int64_t> timeout_ms;  // none: no limit
  sbx::StringMap envs;
  std::optional<uint32_t> uid, gid;
  // A run of the provider's own session (sbx.session/1, routes_execd_session.cpp) rather than an
  // exec: the command is given to Session::run as it is.
  sbx::Session session;
};
// Counts an event stream in --max-streams (and, `command`, a running command a stop waits for);
// otherwise answers 503 RUNTIME_ERROR saying why (the server stops, or too many are open) and
// returns false. Any thread.
bool admit_stream(Server::State& state, const Request& request, const Reply& reply, bool command);

// Runs `cmd` in the sandbox as POST /command does: admitted (or refused with 429/503), then an
// event stream through `open_stream` (foreground) or the background log. `init_text`: the text of
// the stream's init event (empty: the command's id, as POST /command sends). Returns the
// command's id once admitted; otherwise it has answered through `reply`.
std::optional<std::string> launch_command(const std::shared_ptr<Server::State>& state,
                                          const std::shared_ptr<Entry>& entry,
                                          const Request& request, const Reply& reply,
                                          const OpenStream& open_stream, CommandRequest cmd,
                                          const std::string& init_text = {});
// Cancels the sandbox's command `id` if it runs or waits for a slot; false otherwise. Any thread.
bool cancel_command(ExecdState& execd, const std::string& id);

// An execd path on the gateway: /sandboxes/{id}/proxy/{port}/{rest} (direct) or the same under /v1
// (server proxy). `rest` starts with '/'.
struct ExecdTarget {
  std::string sandbox_id;
  std::string port;
  std::string rest;
  bool server_proxy = false;
};
std::optional<ExecdTarget> execd_target(const Request& request);
// {"code","message"} as execd answers (Content-Type with charset, as the transcript).
Response execd_error(const Request& request, http::status status, const std::string& code,
                     const std::string& message);
// The sandbox of an execd target, or null after answering 404 DOCKER::SANDBOX_NOT_FOUND (or the
// port refusal).
std::shared_ptr<Entry> execd_entry(const std::shared_ptr<Server::State>& state,
                                   const ExecdTarget& target, const Request& request,
                                   const Reply& reply);

// Helpers of the execd file routes (routes_execd_files.cpp).
// `s` in single quotes for sh (a ' inside as '\''): one word, nothing expanded.
std::string shell_quote(const std::string& s);
// Unix seconds as RFC 3339 UTC with Go's nanosecond digits (all zero).
std::string format_time_ns(int64_t unix_s);
// `stat -c` (busybox's and GNU's) of a FileInfo: type|size|mtime|ctime|uid|gid|octal mode.
inline constexpr const char* kStatFormat = "%F|%s|%Y|%Z|%u|%g|%a";
// execd's FileInfo {path, type, size, modified_at, created_at, owner, group, mode} of `path` from
// its kStatFormat line; nullopt when the line is not one.
std::optional<boost::json::object> file_info_json(const std::string& path, std::string_view fields);

// Helpers of the route files (http_util.cpp).
// A JSON number that is a whole number within int64 (JSON integers parse as int64 or uint64).
std::optional<int64_t> integer_of(const boost::json::value& v);
Response json_response(const Request& request, http::status status, const boost::json::value& body);
Response empty_response(const Request& request, http::status status);
// {"code": code, "message": message}, the lifecycle API's error envelope.
Response error_response(const Request& request, http::status status, const std::string& code,
                        const std::string& message);
// The response for a failed provider call, by the error's status.
Response provider_error_response(const Request& request, std::exception_ptr error,
                                 const std::string& sandbox_id);
// Whether a provider's error says its sandbox no longer runs (the reason sandbox_gone, ABI 1.3).
bool sandbox_gone(const sbx::Error& error);
// The same, remembered on `entry` (Entry::not_running) when it does.
bool sandbox_gone(const sbx::Error& error, Entry& entry);
// The one answer every route gives for such a sandbox (docs/serve.md, "A sandbox that no longer
// runs"): 409 DOCKER::SANDBOX_NOT_RUNNING, the provider's message saying why.
Response sandbox_gone_response(const Request& request, const sbx::Error& error,
                               const std::string& sandbox_id);
// RFC 3339 UTC with microseconds and 'Z', as the real server prints.
std::string format_time(std::chrono::system_clock::time_point t);
// A 32-hex-digit request id.
std::string new_request_id();
// Equal without an early exit on the first difference.
bool constant_time_equal(const std::string& a, const std::string& b);
// The token a client sends as X-EXECD-ACCESS-TOKEN on the sandbox's direct execd paths when the
// server has an API key: hex HMAC-SHA256(api key, sandbox id). Stateless, so it survives a restart,
// and it unlocks one sandbox only (the key itself is never handed to a sandbox endpoint). Empty
// when the server has no key (execd paths are then open, as the real execd is).
std::string execd_access_token(const Options& options, const std::string& sandbox_id);
// The values of query parameter `name` in the request target, percent-decoded ('+' is a space),
// in order.
std::vector<std::string> query_values(const Request& request, const std::string& name);
// The path of a request target without its query; "/v1" prefix removed (the routes are the same).
std::string route_path(const Request& request);
// The query of a request target as (name, value) pairs in order, form-decoded ('+' and %XX).
std::vector<std::pair<std::string, std::string>> query_params(const Request& request);
// Percent-decoding ('+' as a space when `form`); nullopt for a malformed escape.
std::optional<std::string> percent_decode(std::string_view text, bool form);
// RFC 3339 as pydantic reads a datetime (fraction, 'Z' or an offset, naive = UTC, a date alone
// = midnight UTC); on failure, pydantic's error text (e.g. "input is too short").
// A valid date past what system_clock holds (years before 1678 or after 2261) has no `time`, an
// empty `error` and `out_of_range` -1 (before) or 1 (after).
struct ParsedTime {
  std::optional<std::chrono::system_clock::time_point> time;
  std::string error;
  int out_of_range = 0;
};
ParsedTime parse_time(std::string_view text);

}  // namespace sbx::serve
