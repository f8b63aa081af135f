// The execd API on the gateway (docs/serve.md), for /sandboxes/{id}/proxy/44772/... and the same
// under /v1: the sandbox of an execd path (execd_entry), GET /ping and the command routes:
//   POST   /command                 an event stream: init, ping (and every 3 s of silence), one
//                                   stdout/stderr event per line, then execution_complete or error
//   DELETE /command?id=             interrupt (cancels the command's Operation)
//   GET    /command/status/{id}     a command's status (foreground or background)
//   GET    /command/{id}/logs?cursor=N   a background command's combined output from byte N
//
// THREADING: route handlers run on the connection's strand. A command's output arrives on a
// plugin thread (ExecOptions::on_output): it is split into lines there and handed to the
// connection's ChunkSink, which posts to the strand; the plugin thread never waits: past 1 MiB
// waiting for a slow client the provider holds the command's output (sbx.flow/1), and the command
// waits on its pipe until the client reads; only a provider that cannot hold it has its stream
// cut past Options::stream_buffer (docs/flow-control.md). Pings come from a timer on a strand of
// its own. A command's record is guarded by its sandbox's ExecdState mutex. No thread is held per
// command: one waiting for a slot is a record and a closure, started from the continuation of the
// command that ended.
//
// OWNERSHIP: each sandbox's ExecdState owns its command records (running, waiting, and the last
// Options::kept_commands finished) and the background commands' log files (in the server's temp
// dir, capped at Options::command_log_limit); shutdown_execd (when the sandbox closes) cancels
// what runs or waits and frees both.

#include "faults.hpp"
#include "flow_gate.hpp"
#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>

namespace sbx::serve {

namespace json = boost::json;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxLine = 8 * 1024 * 1024;
// Bytes of a stream waiting for its client past which the command's output is held (sbx.flow/1).
constexpr std::size_t kHoldAbove = 1024 * 1024;       // a longer line is sent in pieces
constexpr std::size_t kMaxLogRead = 4 * 1024 * 1024;  // bytes of log per GET .../logs
constexpr auto kPingEvery = std::chrono::seconds(3);  // execd's keep-alive
constexpr double kNoTimeoutS = 30.0 * 24 * 3600;      // "no limit": 30 days

// The text of a command kept in its record (GET /command/status's `content`): longer commands are
// cut there (at a UTF-8 character's start), not in what runs.
constexpr std::size_t kMaxRecordedContent = 4096;

struct Command {
  std::string id;
  std::string content;  // at most kMaxRecordedContent bytes
  bool background = false;
  std::chrono::system_clock::time_point started_at;
  // Guarded by the ExecdState's mutex:
  bool running = true;   // started or waiting, not ended
  bool started = false;  // holds one of the sandbox's slots (Options::max_commands)
  std::optional<int> exit_code;
  std::optional<std::string> error;
  std::optional<std::chrono::system_clock::time_point> finished_at;
  sbx::Operation<sbx::ExecResult> op;
  // While it waits for a slot: run(true) starts it, run(false) ends it as killed. Taken (moved
  // out) under the mutex by whoever starts or cancels it, called without the mutex.
  std::function<void(bool run)> pending;
  // Set when the server cancels it (interrupt, client gone, sandbox closing): it ends as killed,
  // whatever the provider reports of a process it killed first.
  std::atomic<bool> killed{false};
  // A background command's combined output (guarded by log_mutex), at most `log_limit` bytes of
  // it (0: no cap) and then the marker line.
  std::mutex log_mutex;
  fs::path log_path;
  int log_fd = -1;
  uint64_t log_size = 0;
  uint64_t log_limit = 0;
  bool log_cut = false;
};

// `text` cut to at most `max` bytes, at the start of a UTF-8 character.
std::string cut_utf8(const std::string& text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80)
    --n;
  return text.substr(0, n);
}

}  // namespace

// Commands of one sandbox: at most Options::max_commands started at the provider, at most
// Options::max_queued_commands waiting (a record and a closure each, no thread), and the records
// of the last Options::kept_commands that ended.
struct ExecdState {
  std::mutex mutex;                                          // guards what follows
  std::map<std::string, std::shared_ptr<Command>> commands;  // running, waiting and kept ones
  std::deque<std::shared_ptr<Command>> waiting;              // in arrival order
  std::deque<std::string> finished;                          // ids of the kept ones, oldest first
  std::size_t started = 0;                                   // commands holding a slot
  fs::path log_dir;  // made with the first background command
  bool closed = false;

  ~ExecdState() {
    for (auto& c : waiting)  // breaks the command <-> closure cycle (shutdown_execd does too)
      c->pending = nullptr;
  }
};

std::shared_ptr<ExecdState> new_execd_state() {
  return std::make_shared<ExecdState>();
}

void shutdown_execd(ExecdState& execd) {
  std::vector<sbx::Operation<sbx::ExecResult>> to_cancel;
  std::vector<std::function<void(bool)>> to_end;
  fs::path dir;
  {
    std::lock_guard lock(execd.mutex);
    execd.closed = true;
    for (auto& [id, command] : execd.commands) {
      if (command->running && command->op.valid()) to_cancel.push_back(command->op);
      command->killed = true;
    }
    for (auto& command : execd.waiting) {
      if (command->pending) to_end.push_back(std::move(command->pending));
      command->pending = nullptr;
    }
    execd.waiting.clear();
    execd.commands.clear();
    execd.finished.clear();
    dir = std::move(execd.log_dir);
    execd.log_dir.clear();
  }
  for (auto& op : to_cancel)
    op.cancel();
  for (auto& end : to_end)
    end(false);
  // Open log files stay writable until their commands end (they are unlinked, not closed).
  if (!dir.empty()) {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
}

int running_commands(ExecdState& execd) {
  std::lock_guard lock(execd.mutex);
  int n = 0;
  for (const auto& [id, command] : execd.commands)
    n += command->running ? 1 : 0;
  return n;
}

namespace {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// RFC 3339 with nanoseconds, as execd (Go) prints.
std::string format_time_ns(std::chrono::system_clock::time_point t) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(ns % 1000000000));
  return buf;
}

// One event of the stream: the JSON object and a blank line.
std::string event(json::object body) {
  return json::serialize(body) + "\n\n";
}

std::string text_event(const char* type, std::string text) {
  return event(json::object{{"type", type}, {"text", std::move(text)}, {"timestamp", unix_ms()}});
}

std::string error_event(const std::string& evalue, const std::string& traceback) {
  return event(
      json::object{{"type", "error"},
                   {"timestamp", unix_ms()},
                   {"error", json::object{{"ename", "CommandExecError"},
                                          {"evalue", evalue},
                                          {"traceback", json::array{json::string(traceback)}}}}});
}

std::string complete_event(int64_t execution_ms) {
  return event(json::object{
      {"type", "execution_complete"}, {"execution_time", execution_ms}, {"timestamp", unix_ms()}});
}

// Output split into lines: '\n', '\r' and "\r\n" end one; an empty line is "\n" (as execd sends
// it); a line longer than kMaxLine is sent in pieces.
class LineSplitter {
 public:
  void feed(std::string_view data, std::vector<std::string>& lines) {
    while (!data.empty()) {
      if (after_cr_) {
        after_cr_ = false;
        if (data.front() == '\n') {  // the rest of a "\r\n"
          data.remove_prefix(1);
          continue;
        }
      }
      // A run of line bytes at once (a long line costs one append per read, not one per byte),
      // cut where the line would pass kMaxLine.
      const std::size_t end = std::min(data.find_first_of("\r\n"), data.size());
      std::string_view run = data.substr(0, end);
      while (!run.empty()) {
        if (partial_.size() == kMaxLine) {  // only when the line goes on past the cap
          lines.push_back(std::move(partial_));
          partial_.clear();
        }
        const std::size_t take = std::min(run.size(), kMaxLine - partial_.size());
        partial_.append(run.substr(0, take));
        run.remove_prefix(take);
      }
      if (end == data.size()) return;
      after_cr_ = data[end] == '\r';
      lines.push_back(partial_.empty() ? std::string("\n") : std::move(partial_));
      partial_.clear();
      data.remove_prefix(end + 1);
    }
  }
  void flush(std::vector<std::string>& lines) {
    if (!partial_.empty()) lines.push_back(std::move(partial_));
    partial_.clear();
  }

 private:
  std::string partial_;
  bool after_cr_ = false;
};

// Milliseconds on the steady clock: when the last event went out (the keep-alive's measure, which
// a change of the wall clock must not move).
int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A foreground command's stream: its sink, the line splitters, the output's flow and the
// keep-alive timer.
struct Foreground : std::enable_shared_from_this<Foreground> {
  std::shared_ptr<ChunkSink> sink;
  std::mutex mutex;  // guards the splitters (output arrives on plugin threads)
  LineSplitter out, err;
  // Guards `ended` and orders the sends: an event is handed to the sink under it, so nothing (a
  // ping from the timer, a late line) follows the final event.
  std::mutex send_mutex;
  bool ended = false;
  std::atomic<int64_t> last_event_ms{steady_ms()};
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer timer;
  bool timer_stopped = false;  // on `strand`

  int64_t ping_every_ms;  // Options::keepalive_ping
  std::size_t bound;      // Options::stream_buffer
  // The longest output event this stream has queued (at most a kMaxLine line and its framing).
  std::atomic<std::size_t> longest{0};

  // The output's flow (sbx.flow/1; docs/flow-control.md): past kHoldAbove bytes waiting for the
  // client the provider holds the command's output (the command then waits on its pipe), and it
  // flows again once the client has read down to a quarter of that. Nothing is dropped and
  // nothing is killed for a slow reader. Only when the provider cannot hold this command's output
  // is the stream cut past `bound`, as before flow control.
  FlowGate flow;

  Foreground(asio::io_context& ioc, std::chrono::milliseconds ping_every, std::size_t bound)
      : strand(asio::make_strand(ioc)),
        timer(strand),
        ping_every_ms(ping_every.count()),
        bound(bound),
        flow(std::min<std::size_t>(bound, kHoldAbove),
             std::min<std::size_t>(bound, kHoldAbove) / 4) {}

  // Sends `e` unless the stream has ended; `final`: `e` is the last event, and the stream ends.
  // `output`: once written, the flow is looked at again (an output event may be what it waits
  // for).
  bool send(std::string e, bool final = false, bool output = false) {
    std::lock_guard lock(send_mutex);
    if (ended) return false;
    last_event_ms = steady_ms();
    if (output) {
      sink->send(std::move(e), [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->flow.update(*self->sink);
      });
    } else {
      sink->send(std::move(e));
    }
    if (final) {
      ended = true;
      sink->end();
    }
    return true;
  }

  // The command's Operation, once started: a hold asked before is applied now.
  void set_flow(std::function<bool(bool)> fn) { flow.set_hold(std::move(fn), sink.get()); }

  // On a plugin thread: never waits for the client. Past hold_above the output is held at the
  // provider; a provider that cannot hold it gets its stream cut past `bound` (the connection
  // reset without the final event; on_gone cancels the command).
  void output(OutputStream stream, std::string_view data) {
    std::vector<std::string> lines;
    {
      std::lock_guard lock(mutex);
      (stream == OutputStream::err ? err : out).feed(data, lines);
    }
    const char* type = stream == OutputStream::err ? "stderr" : "stdout";
    for (auto& line : lines) {
      std::string e = text_event(type, std::move(line));
      for (auto seen = longest.load(); e.size() > seen;)
        if (longest.compare_exchange_weak(seen, e.size())) break;
      if (!send(std::move(e), false, true)) return;
    }
    if (lines.empty()) return;
    flow.update(*sink);
    // The bound is counted beyond the longest event the stream has had, so a line longer than the
    // bound (up to kMaxLine) goes out whole to a client that reads, and what follows it may wait
    // while the client is still reading it.
    if (!flow.can_hold() && sink->queued() > bound + longest) cut();
  }

  void cut() {
    {
      std::lock_guard lock(send_mutex);
      if (ended) return;
      ended = true;
    }
    spdlog::warn(
        "sbx serve: cutting a command's event stream: its client let more than {} bytes "
        "wait",
        bound);
    sink->abort();
  }

  void flush() {
    std::vector<std::string> outs, errs;
    {
      std::lock_guard lock(mutex);
      out.flush(outs);
      err.flush(errs);
    }
    for (auto& line : outs)
      send(text_event("stdout", std::move(line)));
    for (auto& line : errs)
      send(text_event("stderr", std::move(line)));
  }

  void start_pings() {
    asio::post(strand, [self = shared_from_this()] { self->arm(); });
  }
  void arm() {
    if (timer_stopped) return;
    timer.expires_after(std::chrono::milliseconds(std::clamp<int64_t>(ping_every_ms / 6, 10, 500)));
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->timer_stopped) return;
      // No ping while the client has not read what waits for it (the output is held): pings
      // would pile up behind it.
      if (steady_ms() - self->last_event_ms >= self->ping_every_ms && !self->flow.is_held()) {
        if (!self->send(text_event("ping", "pong"))) return;  // the final event went out
      }
      self->arm();
    });
  }
  void stop_pings() {
    asio::post(strand, [self = shared_from_this()] {
      self->timer_stopped = true;
      self->timer.cancel();
    });
  }
};

// The terminal event and the status fields for how an exec ended.
struct Outcome {
  std::string event;
  int exit_code = 0;
  std::optional<std::string> error;
};

Outcome outcome_of(sbx::Operation<sbx::ExecResult>& done, int64_t execution_ms, bool killed,
                   Entry& entry) {
  try {
    const sbx::ExecResult result = done.get();
    if (result.timed_out() || killed)
      return {error_event("-1", "signal: killed"), -1, "signal: killed"};
    if (result.error_type) {  // the sandbox could not start the command
      const std::string what = "the sandbox could not start the command";
      return {error_event(std::to_string(result.return_code), what), result.return_code, what};
    }
    if (result.return_code == 0) return {complete_event(execution_ms), 0, std::nullopt};
    const std::string status = "exit status " + std::to_string(result.return_code);
    return {error_event(std::to_string(result.return_code), status), result.return_code, status};
  } catch (const sbx::CancelledError&) {  // an interrupt, the client gone, the server stopping
    return {error_event("-1", "signal: killed"), -1, "signal: killed"};
  } catch (const sbx::Error& e) {
    if (killed) return {error_event("-1", "signal: killed"), -1, "signal: killed"};
    sandbox_gone(e, entry);
    return {error_event(e.what(), e.what()), -1, std::string(e.what())};
  } catch (const std::exception& e) {
    if (killed) return {error_event("-1", "signal: killed"), -1, "signal: killed"};
    // No exit status: the cause as evalue, execd's shape for a command that could not start (the
    // SDKs read no exit code; NeMo Gym reports 125/"sandbox"). A sandbox found to be gone is
    // remembered: the next call on it is answered 409 before any stream.
    return {error_event(e.what(), e.what()), -1, std::string(e.what())};
  }
}

// POST /command's body, read and checked (execd's 400 INVALID_REQUEST_BODY otherwise).
std::optional<CommandRequest> read_command(const Request& request, std::string& why) {
  boost::system::error_code ec;
  const json::value value = json::parse(request.body(), ec);
  if (ec) {
    why = "invalid request body: " + ec.message();
    return std::nullopt;
  }
  if (!value.is_object()) {
    why = "invalid request body: the body must be a JSON object";
    return std::nullopt;
  }
  const json::object& body = value.as_object();
  CommandRequest out;
  const auto* command = body.if_contains("command");
  const auto* argv = body.if_contains("argv");
  if (argv && !argv->is_null()) {
    // The agent's extension (agent/README.md): the program and its arguments, without a shell.
    // The provider's exec takes a shell command: each word is quoted, and `exec` runs the program
    // in the shell's place (the shell's PATH lookup is execvp's).
    if (!argv->is_array() || argv->as_array().empty()) {
      why = "invalid request body: argv must be a non-empty array of strings";
      return std::nullopt;
    }
    out.command = "exec";
    for (const auto& word : argv->as_array()) {
      // The program may not start with '-': the shell's exec would read it as an option.
      const bool first = out.command == "exec";
      if (!word.is_string() ||
          (first && (word.as_string().empty() || word.as_string().front() == '-'))) {
        why =
            "invalid request body: argv must be a non-empty array of strings, the first "
            "non-empty and not starting with '-'";
        return std::nullopt;
      }
      out.command += " " + shell_quote(std::string(word.as_string()));
    }
  } else if (!command || !command->is_string() || command->as_string().empty()) {
    why = "invalid request body: command is required (a non-empty string)";
    return std::nullopt;
  } else {
    out.command = std::string(command->as_string());
  }
  if (const auto* cwd = body.if_contains("cwd"); cwd && !cwd->is_null()) {
    if (!cwd->is_string()) {
      why = "invalid request body: cwd must be a string";
      return std::nullopt;
    }
    if (!cwd->as_string().empty()) out.cwd = std::string(cwd->as_string());
  }
  if (const auto* bg = body.if_contains("background"); bg && !bg->is_null()) {
    if (!bg->is_bool()) {
      why = "invalid request body: background must be a boolean";
      return std::nullopt;
    }
    out.background = bg->as_bool();
  }
  if (const auto* t = body.if_contains("timeout"); t && !t->is_null()) {
    const auto ms = integer_of(*t);
    if (!ms || *ms < 0) {
      why = "invalid request body: timeout must be a non-negative integer (milliseconds)";
      return std::nullopt;
    }
    if (*ms > 0) out.timeout_ms = ms;
  }
  if (const auto* envs = body.if_contains("envs"); envs && !envs->is_null()) {
    if (!envs->is_object()) {
      why = "invalid request body: envs must be an object of strings";
      return std::nullopt;
    }
    for (const auto& [k, v] : envs->as_object()) {
      if (!v.is_string()) {
        why = "invalid request body: envs." + std::string(k) + " must be a string";
        return std::nullopt;
      }
      out.envs[std::string(k)] = std::string(v.as_string());
    }
  }
  for (const char* name : {"uid", "gid"}) {
    const auto* v = body.if_contains(name);
    if (!v || v->is_null()) continue;
    const auto n = integer_of(*v);
    if (!n || *n < 0 || *n > UINT32_MAX) {
      why = std::string("invalid request body: ") + name + " must be a non-negative integer";
      return std::nullopt;
    }
    (std::string(name) == "uid" ? out.uid : out.gid) = static_cast<uint32_t>(*n);
  }
  if (out.gid && !out.uid) {
    why = "invalid request body: gid requires uid";
    return std::nullopt;
  }
  return out;
}

std::shared_ptr<Command> find_command(ExecdState& execd, const std::string& id) {
  std::lock_guard lock(execd.mutex);
  const auto it = execd.commands.find(id);
  return it == execd.commands.end() ? nullptr : it->second;
}

Response stream_head(const Request& request) {
  Response head{http::status::ok, request.version()};
  head.set(http::field::cache_control, "no-cache");
  head.set(http::field::content_type, "text/event-stream");
  head.set("X-Accel-Buffering", "no");
  return head;
}

// Cancels a command: one waiting for a slot ends at once (as killed), a started one through its
// Operation. False when it is not running. Any thread; never holds the mutex while calling out.
bool cancel_command(ExecdState& execd, const std::shared_ptr<Command>& command) {
  std::function<void(bool)> pending;
  sbx::Operation<sbx::ExecResult> op;
  {
    std::lock_guard lock(execd.mutex);
    if (!command->running) return false;
    command->killed = true;
    if (command->pending) {
      pending = std::move(command->pending);
      command->pending = nullptr;
      std::erase(execd.waiting, command);
    } else {
      op = command->op;
    }
  }
  if (pending) {
    pending(false);
  } else if (op.valid()) {
    op.cancel();
  }
  return true;
}

// Records the end of a command, keeps the last Options::kept_commands records (the older ones go,
// with their logs), lets its slot and the counters go, and starts the next waiting command.
void finish_command(const std::shared_ptr<Server::State>& state,
                    const std::shared_ptr<ExecdState>& execd,
                    const std::shared_ptr<Command>& command, const Outcome& outcome) {
  std::function<void(bool)> next;
  std::vector<fs::path> dropped_logs;
  {
    std::lock_guard lock(execd->mutex);
    command->running = false;
    command->exit_code = outcome.exit_code;
    command->error = outcome.error;
    command->finished_at = std::chrono::system_clock::now();
    command->op = {};
    if (command->started) {
      command->started = false;
      --execd->started;
    }
    if (!execd->closed) {
      execd->finished.push_back(command->id);
      while (execd->finished.size() > state->limits.kept_commands) {
        const auto it = execd->commands.find(execd->finished.front());
        if (it != execd->commands.end()) {
          if (!it->second->log_path.empty()) dropped_logs.push_back(it->second->log_path);
          execd->commands.erase(it);
        }
        execd->finished.pop_front();
      }
      if (!execd->waiting.empty() && execd->started < state->limits.max_commands) {
        auto first = std::move(execd->waiting.front());
        execd->waiting.pop_front();
        first->started = true;
        ++execd->started;
        next = std::move(first->pending);
        first->pending = nullptr;
      }
    }
  }
  for (const auto& path : dropped_logs)
    ::unlink(path.c_str());
  state->gate.command_ended();
  // Started from the io_context, not from here: this may be a plugin's thread (a continuation),
  // and a provider call is not made from inside the provider's own callback.
  if (next) asio::post(state->ioc, [next = std::move(next)] { next(true); });
}

void release_stream(const std::shared_ptr<Server::State>& state) {
  state->gate.close_stream();
}

// One admitted command, from its admission to its end: what exec_async needs, and its stream.
struct Launch : std::enable_shared_from_this<Launch> {
  std::shared_ptr<Server::State> state;
  std::shared_ptr<Entry> entry;
  std::shared_ptr<ExecdState> execd;
  std::shared_ptr<Command> command;
  std::string text;  // the command as given
  sbx::ExecOptions options;
  sbx::Session session;            // valid: a run of this provider session, not an exec
  std::shared_ptr<Foreground> fg;  // foreground only: its stream
  std::chrono::steady_clock::time_point admitted = std::chrono::steady_clock::now();

  int64_t elapsed_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 admitted)
        .count();
  }

  // Starts it at the provider (it holds a slot). Any thread.
  void start() {
    sbx::Operation<sbx::ExecResult> op;
    try {
      op = session.valid() ? session.run_async(text, std::move(options))
                           : entry->box()->exec_async(text, std::move(options));
    } catch (const std::exception& e) {
      spdlog::info("sbx serve: command in sandbox {} not started: {}", entry->id, e.what());
      end(Outcome{error_event(e.what(), e.what()), -1, std::string(e.what())});
      return;
    }
    bool cancel_now = false;
    {
      std::lock_guard lock(execd->mutex);
      if (command->running) command->op = op;
      cancel_now = execd->closed || command->killed;  // cancelled before the op was known
    }
    if (cancel_now) op.cancel();
    if (fg) fg->set_flow([op](bool hold) { return op.hold_output(hold); });
    op.then([self = shared_from_this()](sbx::Operation<sbx::ExecResult>& done) {
      self->end(outcome_of(done, self->elapsed_ms(), self->command->killed, *self->entry));
    });
  }

  // Its end: the log closed, the record and the counters (the next waiting command starts), then
  // a foreground stream's last lines and its final event.
  void end(const Outcome& outcome) {
    if (command->background) {
      std::lock_guard lock(command->log_mutex);
      if (command->log_fd >= 0) ::close(command->log_fd);
      command->log_fd = -1;
    } else {
      // The record and the counters first: a client that reads the final event and asks at once
      // (status, another stream) sees the command ended.
      release_stream(state);
    }
    finish_command(state, execd, command, outcome);
    if (fg) {
      fg->stop_pings();
      fg->flush();                    // stdout/stderr are drained before the final event
      fg->send(outcome.event, true);  // the last event: no ping after it
    }
  }
};

const Outcome& killed_outcome() {
  static const Outcome outcome{error_event("-1", "signal: killed"), -1, "signal: killed"};
  return outcome;
}

// Appends a background command's output to its log, up to its limit; then the marker line once,
// and the rest is dropped.
void append_log(Command& command, std::string_view data) {
  std::lock_guard lock(command.log_mutex);
  if (command.log_fd < 0 || command.log_cut) return;
  std::string marker;
  if (command.log_limit > 0 && command.log_size + data.size() > command.log_limit) {
    data = data.substr(0, static_cast<std::size_t>(command.log_limit - command.log_size));
    marker = "\n[sbx serve: this log reached its limit of " + std::to_string(command.log_limit) +
             " bytes; the rest of the command's output was dropped]\n";
    command.log_cut = true;
  }
  for (const std::string_view part : {data, std::string_view(marker)}) {
    std::size_t done = 0;
    while (done < part.size()) {
      const ssize_t n = ::write(command.log_fd, part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // a full disk: the log misses the rest
      done += static_cast<std::size_t>(n);
    }
    command.log_size += done;
  }
}

}  // namespace

bool admit_stream(Server::State& state, const Request& request, const Reply& reply, bool command) {
  const std::size_t max = state.limits.max_streams.load();
  switch (state.gate.try_open_stream(max, command)) {
    case StopGate::StreamAdmit::ok:
      return true;
    case StopGate::StreamAdmit::stopping:
      reply(execd_error(request, http::status::service_unavailable, "RUNTIME_ERROR",
                        "the server is stopping"));
      return false;
    case StopGate::StreamAdmit::full:
      break;
  }
  reply(execd_error(request, http::status::service_unavailable, "RUNTIME_ERROR",
                    std::string("too many open ") + (command ? "command streams" : "streams") +
                        " (at most " + std::to_string(max) + "); try again later"));
  return false;
}

std::optional<std::string> launch_command(const std::shared_ptr<Server::State>& state,
                                          const std::shared_ptr<Entry>& entry,
                                          const Request& request, const Reply& reply,
                                          const OpenStream& open_stream, CommandRequest cmd,
                                          const std::string& init_text) {
  if (!admit_stream(*state, request, reply, true)) return std::nullopt;
  const auto& o = state->options;
  auto command = std::make_shared<Command>();
  command->id = new_request_id();
  command->content = cut_utf8(cmd.command, kMaxRecordedContent);
  command->background = cmd.background;
  command->started_at = std::chrono::system_clock::now();
  command->log_limit = state->limits.command_log_limit;

  auto launch = std::make_shared<Launch>();
  launch->state = state;
  launch->entry = entry;
  launch->execd = entry->execd;
  launch->command = command;
  launch->text = std::move(cmd.command);
  launch->session = std::move(cmd.session);
  sbx::ExecOptions& options = launch->options;
  options.cwd = cmd.cwd;
  options.env = cmd.envs;
  options.timeout_s = cmd.timeout_ms ? static_cast<double>(*cmd.timeout_ms) / 1000.0 : kNoTimeoutS;
  if (cmd.uid) {
    options.user = std::to_string(*cmd.uid) + (cmd.gid ? ":" + std::to_string(*cmd.gid) : "");
  }
  if (cmd.background) {
    options.on_output = [command](OutputStream, std::string_view data) {
      append_log(*command, data);
    };
  } else {
    launch->fg =
        std::make_shared<Foreground>(state->ioc, o.keepalive_ping, state->limits.stream_buffer);
    options.on_output = [fg = launch->fg](OutputStream stream, std::string_view data) {
      fg->output(stream, data);
    };
  }

  // Admission, under the sandbox's mutex: a free slot starts it, else it waits (up to the queue's
  // bound), else 429. The stream is opened under the mutex, so that a command started by another
  // one's end finds it.
  const auto execd = entry->execd;
  enum class Admit { start, wait, full, gone, no_log } admit = Admit::gone;
  std::shared_ptr<ChunkSink> sink;
  {
    std::lock_guard lock(execd->mutex);
    if (!execd->closed) {
      if (execd->started < state->limits.max_commands) {
        admit = Admit::start;
      } else if (execd->waiting.size() < state->limits.max_queued_commands) {
        admit = Admit::wait;
      } else {
        admit = Admit::full;
      }
    }
    if ((admit == Admit::start || admit == Admit::wait) && cmd.background) {
      std::error_code ec;
      if (execd->log_dir.empty()) {
        execd->log_dir = state->temp_dir / ("logs-" + new_request_id());
        fs::create_directories(execd->log_dir, ec);
      }
      command->log_path = execd->log_dir / command->id;
      command->log_fd =
          ::open(command->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (command->log_fd < 0) admit = Admit::no_log;
    }
    if (admit == Admit::start || admit == Admit::wait) {
      execd->commands[command->id] = command;
      if (admit == Admit::start) {
        command->started = true;
        ++execd->started;
      } else {
        execd->waiting.push_back(command);
        command->pending = [launch](bool run) {
          if (run) {
            launch->start();
          } else {
            launch->end(killed_outcome());
          }
        };
      }
      sink = open_stream(stream_head(request), true);
      // A slow client holds the command's output (sbx.flow/1), not the server: no stall timeout.
      if (launch->fg) sink->never_stall();
      if (launch->fg) launch->fg->sink = sink;
    }
  }
  if (!sink) {
    state->gate.close_stream();
    state->gate.command_ended();
    switch (admit) {
      case Admit::full:
        reply(execd_error(request, http::status::too_many_requests, "TOO_MANY_COMMANDS",
                          "sandbox " + entry->id + " has its maximum of " +
                              std::to_string(state->limits.max_commands) +
                              " commands running and " +
                              std::to_string(state->limits.max_queued_commands) +
                              " waiting; wait for one to end"));
        break;
      case Admit::no_log:
        reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR",
                          "cannot open a log for the command"));
        break;
      default:
        reply(error_response(request, http::status::not_found, "DOCKER::SANDBOX_NOT_FOUND",
                             "Sandbox " + entry->id + " not found."));
    }
    return std::nullopt;
  }

  if (state->options.faults) {  // the fault plan's cut_after_events (faults.hpp)
    if (const auto n = state->options.faults->stream_cut("POST /command", entry->id)) {
      sink->cut_after(*n);
    }
  }
  if (launch->fg) {
    launch->fg->send(text_event("init", init_text.empty() ? command->id : init_text));
    launch->fg->send(text_event("ping", "pong"));
    // A client that goes away (or is cut for being slow) cancels the command, waiting or not.
    sink->on_gone([execd, command] { cancel_command(*execd, command); });
    launch->fg->start_pings();
  } else {
    // The stream ends at once, whether it runs or waits; the output goes to the log.
    release_stream(state);
    sink->send(text_event("init", init_text.empty() ? command->id : init_text));
    sink->send(text_event("ping", "pong"));
    sink->send(complete_event(launch->elapsed_ms()));
    sink->end();
  }
  if (admit == Admit::start) launch->start();
  return command->id;
}

bool cancel_command(ExecdState& execd, const std::string& id) {
  const auto command = find_command(execd, id);
  return command && cancel_command(execd, command);
}

namespace {

void run_command(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
                 const Request& request, const Reply& reply, const OpenStream& open_stream) {
  std::string why;
  auto parsed = read_command(request, why);
  if (!parsed) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY", why));
    return;
  }
  launch_command(state, entry, request, reply, open_stream, std::move(*parsed));
}

void interrupt(const std::shared_ptr<Entry>& entry, const Request& request, const Reply& reply) {
  const auto ids = query_values(request, "id");
  const std::string id = ids.empty() ? std::string() : ids.front();
  if (id.empty()) {
    reply(execd_error(request, http::status::bad_request, "MISSING_QUERY",
                      "missing query parameter 'id'"));
    return;
  }
  const auto command = find_command(*entry->execd, id);
  if (!command || !cancel_command(*entry->execd, command)) {
    reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR",
                      "command not found or not running: " + id));
    return;
  }
  reply(empty_response(request, http::status::ok));
}

void status(const std::shared_ptr<Entry>& entry, const Request& request, const Reply& reply,
            const std::string& id) {
  json::object body;
  {
    std::lock_guard lock(entry->execd->mutex);
    const auto it = entry->execd->commands.find(id);
    if (it == entry->execd->commands.end()) {
      reply(execd_error(request, http::status::not_found, "INVALID_REQUEST_BODY",
                        "command not found: " + id));
      return;
    }
    const Command& c = *it->second;
    body["id"] = c.id;
    body["content"] = c.content;
    body["running"] = c.running;
    // Left out while it runs (as execd's omitempty does), not null: the spec's schema has no null.
    if (c.exit_code) body["exit_code"] = *c.exit_code;
    if (c.error) body["error"] = *c.error;
    body["started_at"] = format_time_ns(c.started_at);
    if (c.finished_at) body["finished_at"] = format_time_ns(*c.finished_at);
  }
  Response r = json_response(request, http::status::ok, body);
  r.set(http::field::content_type, "application/json; charset=utf-8");
  reply(std::move(r));
}

void logs(const std::shared_ptr<Entry>& entry, const Request& request, const Reply& reply,
          const std::string& id) {
  auto command = find_command(*entry->execd, id);
  if (!command) {
    reply(execd_error(request, http::status::not_found, "INVALID_REQUEST_BODY",
                      "command not found: " + id));
    return;
  }
  if (!command->background) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY",
                      "command " + id + " is not a background command"));
    return;
  }
  uint64_t cursor = 0;
  const auto cursors = query_values(request, "cursor");
  if (!cursors.empty() && !cursors.front().empty()) {
    const std::string& text = cursors.front();
    if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18) {
      reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY",
                        "invalid cursor: " + text));
      return;
    }
    cursor = std::stoull(text);
  }
  uint64_t size = 0;
  {
    std::lock_guard lock(command->log_mutex);
    size = command->log_size;
  }
  std::string body;
  if (cursor < size) {
    const uint64_t want = std::min<uint64_t>(size - cursor, kMaxLogRead);
    const int fd = ::open(command->log_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {  // the sandbox closed meanwhile
      reply(execd_error(request, http::status::not_found, "INVALID_REQUEST_BODY",
                        "command not found: " + id));
      return;
    }
    body.resize(want);
    std::size_t got = 0;
    while (got < want) {
      const ssize_t n =
          ::pread(fd, body.data() + got, want - got, static_cast<off_t>(cursor + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    ::close(fd);
    body.resize(got);
  }
  Response r{http::status::ok, request.version()};
  r.set(http::field::content_type, "text/plain; charset=utf-8");
  r.set("Execd-Commands-Tail-Cursor", std::to_string(cursor + body.size()));
  r.body() = std::move(body);
  r.prepare_payload();
  reply(std::move(r));
}

}  // namespace

void get_ping(const Call& call) {
  call.reply(empty_response(call.request, http::status::ok));
}

void post_command(const Call& call) {
  run_command(call.state, call.entry, call.request, call.reply, call.open_stream);
}

void delete_command(const Call& call) {
  interrupt(call.entry, call.request, call.reply);
}

void get_command_status(const Call& call) {
  status(call.entry, call.request, call.reply, call.params.at(0));
}

void get_command_logs(const Call& call) {
  logs(call.entry, call.request, call.reply, call.params.at(0));
}

std::shared_ptr<Entry> execd_entry(const std::shared_ptr<Server::State>& state,
                                   const ExecdTarget& target, const Request& request,
                                   const Reply& reply) {
  const auto entry = find_live(state, target.sandbox_id);  // an expired one is unknown
  if (!entry) {
    reply(error_response(request, http::status::not_found, "DOCKER::SANDBOX_NOT_FOUND",
                         "Sandbox " + target.sandbox_id + " not found."));
    return nullptr;
  }
  if (entry->not_running) {
    reply(error_response(
        request, http::status::conflict, "DOCKER::SANDBOX_NOT_RUNNING",
        "Sandbox " + target.sandbox_id + " is not running: its provider said it has ended"));
    return nullptr;
  }
  if (target.port != "44772") {
    reply(
        execd_error(request, http::status::bad_gateway, "NOT_SUPPORTED",
                    "sbx serve serves execd (port 44772) on its gateway, not port " + target.port));
    return nullptr;
  }
  return entry;
}

}  // namespace sbx::serve
