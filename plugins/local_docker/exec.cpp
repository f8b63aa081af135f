#include "exec.hpp"

#include <boost/json/serialize.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <thread>

namespace sbx::local_docker {
namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How often a waiting exec looks at its cancel token (completion wakes it at once).
constexpr auto kCancelPoll = 50ms;
// Output bytes waiting for the caller's sink before the stream pauses (and the daemon, then the
// command, wait for the caller).
constexpr size_t kPulledOutputLimit = 256 * 1024;
// Bound on one kill pass: creating and running the kill exec while the command's stream is drained,
// until both have ended. Two passes at most, so a stopped exec returns within 2 x this.
constexpr auto kKillPass = 3s;
// After the kill exec finished, how long the command's stream may take to end before a second pass.
constexpr auto kEndAfterKill = 500ms;
// While a kill runs, how often the drain loop looks at the kill's progress.
constexpr auto kKillPoll = 10ms;
// How long the exit code may lag behind the end of the stream.
constexpr auto kExitCodeWait = 2s;

// When the runtime cannot start the process (no such shell, unknown user...), the daemon writes its
// error as one stdout frame ending in "\r\n" and closes the stream; only the exit status (Pid 0)
// tells it apart from output. A first frame of that shape that starts like one of the runtime's
// messages is held until the next frame or the end (so it can go to stderr); any other first line,
// "ready\r\n" from a server say, streams at once.
constexpr size_t kMaxHeldFrame = 4096;
constexpr std::string_view kRuntimeErrorPrefixes[] = {
    "OCI runtime exec failed", "unable to find user", "exec failed", "Error response from daemon"};

bool looks_like_runtime_error(std::string_view frame) {
  if (!frame.ends_with("\r\n")) return false;
  for (std::string_view prefix : kRuntimeErrorPrefixes) {
    if (frame.starts_with(prefix)) return true;
  }
  return false;
}

// When the kernel refuses the execve of the exec's process because its arguments and environment
// are too large (E2BIG), the runtime's init has started already: the daemon reports exit code 1
// with a Pid, and the only output is runc's one stderr line "exec /bin/sh: argument list too
// long". A first stderr frame of exactly that shape is held until the next frame or the end; alone
// with exit code 1 it means the command never started.
bool looks_like_exec_e2big(std::string_view frame) {
  return frame.starts_with("exec ") && frame.ends_with(": argument list too long\n") &&
         frame.find('\n') == frame.size() - 1;
}

// Kills every process whose environment carries the tag ($1). Reading /proc/<pid>/environ needs
// only the same uid, so this runs as the user the command ran as; `cat` plus the shell's `case`
// work in busybox, dash and bash alike (grep in busybox stops at the first NUL of environ).
// Several passes catch children forked while the parent was being killed. "SBX_EXEC_ID" is
// kExecIdVar.
constexpr std::string_view kKillScript =
    "t=\"SBX_EXEC_ID=$1\"\n"
    "pass=0; found=1\n"
    "while [ $found = 1 ] && [ $pass -lt 5 ]; do\n"
    "  found=0; pass=$((pass+1))\n"
    "  for e in /proc/[0-9]*/environ; do\n"
    "    p=${e#/proc/}; p=${p%/environ}\n"
    "    [ \"$p\" = \"$$\" ] && continue\n"
    "    case \"$(cat \"$e\" 2>/dev/null)\" in\n"
    "      *\"$t\"*) kill -9 \"$p\" 2>/dev/null && found=1 ;;\n"
    "    esac\n"
    "  done\n"
    "done\n";

// Delivers frames to the caller's sink, holding back a first frame that may be the runtime's
// failure message (see kMaxHeldFrame and looks_like_exec_e2big).
class ExecOutput {
 public:
  explicit ExecOutput(sdk::OutputSink& sink) : sink_(sink) {}

  void begin_frame(uint8_t stream, uint64_t size) {
    release();
    holding_ = first_ && (stream == 1 || stream == 2) && size > 0 && size <= kMaxHeldFrame;
    held_stream_ = stream;
    first_ = false;
  }
  void write(uint8_t stream, std::string_view bytes) {
    if (holding_) {
      held_.append(bytes);
      return;
    }
    sink_.write(stream == 1 ? sdk::StdStream::out : sdk::StdStream::err, bytes);
  }
  void end_frame() {
    const bool keep =
        held_stream_ == 1 ? looks_like_runtime_error(held_) : looks_like_exec_e2big(held_);
    if (holding_ && !keep) release();
    holding_ = false;
  }

  // True when the whole output was one stderr line of the runtime saying the exec's process could
  // not be started because its arguments and environment are too large (still held).
  bool only_e2big() const { return held_stream_ == 2 && !held_.empty(); }

  // Ends the output. When the runtime failed, a held frame is its message and goes to stderr.
  void finish(bool runtime_failure) {
    if (held_.empty()) return;
    sink_.write(runtime_failure || held_stream_ == 2 ? sdk::StdStream::err : sdk::StdStream::out,
                held_);
    held_.clear();
  }

 private:
  void release() {
    if (held_.empty()) return;
    sink_.write(held_stream_ == 1 ? sdk::StdStream::out : sdk::StdStream::err, held_);
    held_.clear();
  }

  sdk::OutputSink& sink_;
  std::string held_;
  uint8_t held_stream_ = 1;
  bool first_ = true;
  bool holding_ = false;
};

// Ends a started call and waits until its callbacks can no longer run (they use the caller's
// stack). Idempotent; a finished call is left as it is.
void settle(const http::Call& call) noexcept {
  call.cancel();
  try {
    call.get();
  } catch (...) {  // the outcome no longer matters
  }
}

struct CallGuard {
  http::Call call;
  ~CallGuard() { settle(call); }
};

std::string describe(const std::string& container) {
  return "running a command in sandbox " + container;
}

// The body of POST /containers/{id}/exec.
std::string exec_body(const ExecParams& params, const std::optional<std::string>& tag) {
  json::object body{{"AttachStdin", params.open_stdin},
                    {"AttachStdout", true},
                    {"AttachStderr", true},
                    {"Tty", params.tty}};
  json::array argv;
  for (const auto& arg : params.argv)
    argv.emplace_back(arg);
  body["Cmd"] = std::move(argv);
  json::array env;
  for (const auto& [key, value] : params.env) {
    if (key.empty() || key.find('=') != std::string::npos) {
      throw sdk::Error::invalid_argument("exec env: invalid variable name '" + key + "'");
    }
    env.emplace_back(key + "=" + value);
  }
  if (tag) env.emplace_back(std::string(kExecIdVar) + "=" + *tag);
  body["Env"] = std::move(env);
  if (params.cwd) body["WorkingDir"] = *params.cwd;
  if (params.user) body["User"] = *params.user;
  return json::serialize(body);
}

// The exec's Id from the answer to POST /containers/{id}/exec.
std::string exec_id_of(std::string_view response_body, const std::string& container) {
  const json::object result = parse_body(response_body, describe(container));
  const auto* id = result.if_contains("Id");
  if (!id || !id->is_string()) throw sdk::Error::internal(describe(container) + ": no exec Id");
  return std::string(id->get_string());
}

// One pass of the kill script (as the command's user, with its shell), run without blocking: the
// kill exec is created and started as calls in flight, advanced by poll(), so that the caller keeps
// draining the command's stream meanwhile. The daemon does not end the kill exec while the output
// of the command it kills waits to be read (the killed command's exit is processed only once its
// output is drained, and the kill's exit after it): a kill that waited for its own answer without
// draining would wait behind the very output it is meant to stop. Best effort:
// failures are logged. Not cancellable (the kill must happen also when the exec was cancelled);
// bounded by `deadline`. One thread (the exec's) uses it; the destructor settles both calls.
class KillExec {
 public:
  KillExec(DockerApi& api, const std::string& container, const ExecParams& params,
           const std::string& tag, Clock::time_point deadline, const sdk::Logger& log)
      : api_(api), container_(container), deadline_(deadline), log_(log) {
    ExecParams kill;
    kill.argv = {params.argv.front(), "-c", std::string(kKillScript), "sbx-kill", tag};
    kill.user = params.user;
    try {
      http::Request request;
      request.method = "POST";
      request.target = "/containers/" + container + "/exec";
      request.headers.emplace_back("Content-Type", "application/json");
      request.body = exec_body(kill, std::nullopt);
      request.timeout = time_left();
      create_ = api_.start(std::move(request), sdk::CancelToken());
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
  ~KillExec() {
    settle(create_);
    settle(start_);
  }
  KillExec(const KillExec&) = delete;
  KillExec& operator=(const KillExec&) = delete;

  // Advances the kill without waiting; true once it has finished (or failed, or run out of time).
  bool poll() {
    if (finished_) return true;
    try {
      if (!started_) {
        if (!create_.done()) return out_of_time();
        const http::Response created = api_.finish(create_);
        if (created.status >= 400) throw api_error(created.status, created.body, what());
        http::Request request;
        request.method = "POST";
        request.target = "/exec/" + exec_id_of(created.body, container_) + "/start";
        request.headers.emplace_back("Content-Type", "application/json");
        request.body = R"({"Detach":false,"Tty":false})";
        request.timeout = time_left();
        start_ = api_.start(std::move(request), sdk::CancelToken());
        started_ = true;
      }
      if (!start_.done()) return out_of_time();
      const http::Response response = api_.finish(start_);
      if (response.status >= 400) throw api_error(response.status, response.body, what());
      finished_ = true;
    } catch (const std::exception& e) {
      fail(e.what());
    }
    return true;
  }

 private:
  std::string what() const { return "killing a stopped command in sandbox " + container_; }
  std::chrono::milliseconds time_left() const {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }
  bool out_of_time() {
    if (Clock::now() < deadline_) return false;
    fail("it did not finish in time");
    return true;
  }
  void fail(const char* why) {
    finished_ = true;
    log_.warn("could not kill the processes of a stopped command in sandbox ", container_, ": ",
              why);
  }

  DockerApi& api_;
  const std::string& container_;
  Clock::time_point deadline_;
  const sdk::Logger& log_;
  http::Call create_;
  http::Call start_;
  bool started_ = false;
  bool finished_ = false;
};

enum class Stop { finished, timed_out, cancelled };

// Feeds the stream to `take` (which returns true once it took the last bytes) until it ends, the
// deadline passes or the caller cancels.
template <class Take>
Stop pull_stream(Take& take, Clock::time_point deadline, const sdk::CancelToken& cancel) {
  for (;;) {
    if (cancel.stop_requested()) return Stop::cancelled;
    const auto now = Clock::now();
    if (now >= deadline) return Stop::timed_out;
    if (take(std::min(deadline, now + kCancelPoll))) return Stop::finished;
  }
}

}  // namespace

size_t max_arg_strlen() {
  static const size_t limit = [] {
    const long page = ::sysconf(_SC_PAGESIZE);
    return static_cast<size_t>(page > 0 ? page : 4096) * 32;
  }();
  return limit;
}

std::string random_hex(size_t bytes) {
  thread_local std::mt19937_64 engine = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (size_t i = 0; i < bytes; ++i) {
    const auto byte = static_cast<uint8_t>(engine());
    out += kDigits[byte >> 4];
    out += kDigits[byte & 0xF];
  }
  return out;
}

sdk::ExitStatus run_exec(DockerApi& api, const std::string& container, const ExecParams& params,
                         sdk::OutputSink& out, const sdk::Logger& log,
                         const sdk::CancelToken& cancel, bool* started) {
  const auto deadline = Clock::now() + std::min(params.timeout, kNoTimeout);  // no overflow
  // The daemon would start it and report exit 1 with runc's message: refused here, clearly.
  if (const auto message = oversized_argument(params)) {
    out.write(sdk::StdStream::err, *message);
    return sdk::ExitStatus::sandbox_failure();
  }
  const std::string tag = random_hex(16);
  const std::string exec_id = create_exec(api, container, params, tag, cancel);
  if (started) *started = true;

  // The stream is pulled and decoded here, on the caller's thread, never on the HTTP client's loop:
  // the caller's output sink may be slow (a full pipe, a busy interpreter), and that must slow
  // this exec alone, not every request of the provider.
  ExecOutput output(out);
  FrameDecoder decoder(output);
  BodyRouter body([&decoder](std::string_view bytes) { decoder.feed(bytes); });
  http::Request request;
  request.method = "POST";
  request.target = "/exec/" + exec_id + "/start";
  request.headers.emplace_back("Content-Type", "application/json");
  request.body = R"({"Detach":false,"Tty":false})";
  request.pull_body_limit = kPulledOutputLimit;
  body.attach(request);
  CallGuard guard{api.start(std::move(request), cancel)};
  std::string chunk;
  auto take = [&](Clock::time_point until) {
    const bool done = guard.call.read_body(chunk, until);
    body.route(chunk);
    return done;
  };

  const Stop stop = pull_stream(take, deadline, cancel);
  if (stop != Stop::finished) {
    const auto stopped_at = Clock::now();
    // Output after the stop is not delivered (the caller may be the slow reader that must not hold
    // the kill up): it is read and dropped while the kill runs, because the daemon finishes the
    // kill exec only once this stream has been drained. The stream ends when the command's
    // processes are gone; until it does, the kill is not known to have worked. A second pass
    // catches processes forked while the first ran.
    auto drain = [&](Clock::time_point until) { return guard.call.read_body(chunk, until); };
    bool ended = false;
    for (int pass = 0; pass < 2 && !ended; ++pass) {
      const auto pass_deadline = Clock::now() + kKillPass;
      KillExec kill(api, container, params, tag, pass_deadline, log);
      std::optional<Clock::time_point> killed_at;
      for (;;) {
        const auto now = Clock::now();
        if (!killed_at && kill.poll()) killed_at = now;
        if (ended && killed_at) break;
        if (now >= pass_deadline || (killed_at && now >= *killed_at + kEndAfterKill)) break;
        if (ended) {
          std::this_thread::sleep_for(kKillPoll);  // only the kill's answer is still to come
        } else {
          ended = drain(std::min(pass_deadline, now + kKillPoll));
        }
      }
    }
    if (!ended) {
      log.warn("processes of a stopped command in sandbox ", container,
               " may still be running: its output did not end after two kills");
    } else {
      log.debug(
          "stopped a ", stop == Stop::cancelled ? "cancelled" : "timed-out", " command in sandbox ",
          container, " in ",
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at).count(),
          " ms");
    }
    settle(guard.call);
    output.finish(false);
    if (stop == Stop::cancelled) {
      throw sdk::Error::cancelled("exec cancelled; its processes in sandbox " + container +
                                  " were killed");
    }
    return sdk::ExitStatus::timed_out();
  }

  const http::Response response = api.finish(guard.call);
  if (response.status != 200)
    throw api_error(response.status, body.error_body(), describe(container));
  const ExecState state = wait_exit_code(api, exec_id, container, cancel);
  // Pid 0 with 126/127: the runtime never started the process (its message was the held frame).
  const bool runtime_failure =
      state.pid == 0 && (*state.exit_code == 126 || *state.exit_code == 127);
  // E2BIG for all strings together (the one check above covers each alone): runc's one line,
  // exit 1.
  const bool too_large = output.only_e2big() && *state.exit_code == 1;
  output.finish(runtime_failure);
  if (too_large) {
    out.write(sdk::StdStream::err,
              "sbx: the command could not start: its arguments and environment together exceed "
              "the kernel's limit (E2BIG). Pass large input as a file (upload it) instead.\n");
  }
  if (runtime_failure || too_large) return sdk::ExitStatus::sandbox_failure();
  return sdk::ExitStatus::exited(*state.exit_code);
}

std::string create_exec(DockerApi& api, const std::string& container, const ExecParams& params,
                        const std::optional<std::string>& tag, const sdk::CancelToken& cancel) {
  const http::Response response = api.call("POST", "/containers/" + container + "/exec",
                                           exec_body(params, tag), describe(container), cancel);
  return exec_id_of(response.body, container);
}

namespace {

ExecState inspect_exec(DockerApi& api, const std::string& exec_id, const std::string& container,
                       const sdk::CancelToken& cancel) {
  const http::Response response =
      api.call("GET", "/exec/" + exec_id + "/json", "", describe(container), cancel);
  const json::object body = parse_body(response.body, describe(container));
  ExecState state;
  if (const auto* v = body.if_contains("Running"); v && v->is_bool()) state.running = v->get_bool();
  if (const auto* v = body.if_contains("ExitCode"); v && v->is_number()) {
    state.exit_code = v->to_number<int32_t>();
  }
  if (const auto* v = body.if_contains("Pid"); v && v->is_number())
    state.pid = v->to_number<int64_t>();
  return state;
}

}  // namespace

// The exit code is recorded just before the stream closes; allow the daemon a moment regardless.
ExecState wait_exit_code(DockerApi& api, const std::string& exec_id, const std::string& container,
                         const sdk::CancelToken& cancel) {
  const auto give_up = Clock::now() + kExitCodeWait;
  auto pause = 2ms;
  for (;;) {
    ExecState state = inspect_exec(api, exec_id, container, cancel);
    if (!state.running && state.exit_code) return state;
    if (Clock::now() >= give_up) {
      throw sdk::Error::internal(describe(container) +
                                 ": the output ended but Docker reports no exit code");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

void kill_tagged(DockerApi& api, const std::string& container, const std::string& shell,
                 const std::optional<std::string>& user, const std::string& tag,
                 const sdk::Logger& log) {
  ExecParams kill;
  kill.argv = {shell, "-c", std::string(kKillScript), "sbx-kill", tag};
  kill.user = user;
  kill.timeout = kKillPass;
  CollectingSink out;
  try {
    const sdk::ExitStatus status = run_exec(api, container, kill, out, log, sdk::CancelToken());
    if (status.return_code != 0) {
      log.warn("could not kill the processes of a terminal in sandbox ", container,
               ": the kill exited ", status.return_code, ": ", shorten(out.stderr_text));
    }
  } catch (const std::exception& e) {
    log.warn("could not kill the processes of a terminal in sandbox ", container, ": ", e.what());
  }
}

sdk::Error sandbox_expired(const std::string& sandbox, int64_t expires_at) {
  return sdk::Error::sandbox_gone("sandbox " + sandbox + " has expired (its TTL ended at " +
                                  std::to_string(expires_at) +
                                  ", Unix seconds) while the command ran; the command was killed "
                                  "with it");
}

std::optional<std::string> oversized_argument(const ExecParams& params) {
  const size_t limit = max_arg_strlen() - 1;  // without the NUL
  auto refuse = [&](const std::string& what, size_t size) {
    return "sbx: the command could not start: " + what + " is " + std::to_string(size) +
           " bytes; Linux refuses a single argument or environment string longer than " +
           std::to_string(limit) + " bytes (MAX_ARG_STRLEN, E2BIG). Pass large input as a file " +
           "(upload it) instead.\n";
  };
  for (size_t i = 0; i < params.argv.size(); ++i) {
    if (params.argv[i].size() > limit) {
      return refuse(i == 2 ? std::string("the command string") : "argument " + std::to_string(i),
                    params.argv[i].size());
    }
  }
  for (const auto& [key, value] : params.env) {
    if (key.size() + 1 + value.size() > limit) {
      return refuse("the environment variable " + key, key.size() + 1 + value.size());
    }
  }
  return std::nullopt;
}

}  // namespace sbx::local_docker
