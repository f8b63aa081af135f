#include "execd.hpp"

#include <sbx/sdk/retry.hpp>

#include <boost/json.hpp>

#include <strings.h>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <stop_token>

namespace sbx::opensandbox {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

// The finished call's response; a transport error after `cancel` fired is the cancellation.
sdk::http::Response finish(sdk::http::Call& call, const sdk::CancelToken& cancel) {
  try {
    return call.get();
  } catch (const sdk::Error&) {
    if (cancel.stop_requested()) throw sdk::Error::cancelled();
    throw;
  }
}

// How long a command cancelled before its id came keeps its submission open for the id.
constexpr std::chrono::milliseconds kInterruptWait = 5s;
// The bound on one interrupt (DELETE /command?id=).
constexpr std::chrono::milliseconds kInterruptTimeout = 5s;

std::string what_of(const std::string& operation, const std::string& sandbox_id) {
  return "OpenSandbox " + operation + " (sandbox " + sandbox_id + ")";
}

// An answer from the execd routes that is not a success.
sdk::Error execd_error(const sdk::http::Response& response, const std::string& what) {
  return to_error(parse_api_error(response), what,
                  response.status == 502 || response.status == 503);
}

sdk::http::Request to(const ExecdEndpoint& endpoint, std::string method, std::string path) {
  sdk::http::Request request;
  request.method = std::move(method);
  request.target = endpoint.base_url + path;
  request.headers = endpoint.headers;
  return request;
}

// The pause before submission `attempt` + 1 after one that reached nothing: 0.25 s doubling, at
// most 2 s (502 resubmissions and operations.command_retries alike).
std::chrono::milliseconds resubmit_delay(int attempt) {
  return std::min<std::chrono::milliseconds>(250ms * (1 << std::clamp(attempt - 1, 0, 3)), 2s);
}

}  // namespace

bool reached_no_answer(const sdk::Error& error) {
  return error.status() == SBX_STATUS_UNAVAILABLE && error.http_status() == 0;
}

ExecdClient::ExecdClient(const ConnectionConfig& connection, const OperationConfig& operations,
                         sdk::Logger log)
    : connection_(connection),
      operations_(operations),
      log_(std::move(log)),
      http_(client_options(connection, "")) {}

ExecdClient::~ExecdClient() {
  // An id may come up to kInterruptWait after a cancel; its interrupt then has kInterruptTimeout.
  constexpr auto limit = kInterruptWait + kInterruptTimeout;
  std::unique_lock lock(interrupts_mutex_);
  if (!interrupts_done_.wait_for(lock, limit, [&] { return interrupts_pending_ == 0; })) {
    log_.warn("opensandbox: ", interrupts_pending_, " command interrupt(s) unanswered after ",
              limit.count() / 1000, " s; those commands may still run");
  }
}

bool ExecdClient::ping(const ExecdEndpoint& endpoint, std::chrono::milliseconds timeout,
                       const sdk::CancelToken& cancel) {
  auto request = to(endpoint, "GET", "/ping");
  request.timeout = timeout;
  return http_.send(std::move(request), cancel).status == 200;
}

std::string ExecdClient::open_pty(const ExecdEndpoint& endpoint, const std::string& body,
                                  const sdk::CancelToken& cancel) {
  auto request = to(endpoint, "POST", "/pty");
  request.body = body;
  request.headers.emplace_back("Content-Type", "application/json");
  request.timeout = std::chrono::milliseconds(30'000);
  const auto response = http_.send(std::move(request), cancel);
  if (response.status != 200 && response.status != 201) {
    throw sdk::Error::unavailable("execd's POST /pty answered HTTP " +
                                      std::to_string(response.status) + ": " +
                                      response.body.substr(0, 300),
                                  false);
  }
  try {
    return std::string(json::parse(response.body).as_object().at("session_id").as_string());
  } catch (const std::exception& e) {
    throw sdk::Error::internal(std::string("execd's POST /pty answered badly: ") + e.what());
  }
}

void ExecdClient::delete_pty(const ExecdEndpoint& endpoint, const std::string& id,
                             const sdk::CancelToken& cancel) {
  auto request = to(endpoint, "DELETE", "/pty/" + sdk::http::url_encode(id));
  request.timeout = std::chrono::milliseconds(30'000);
  // The real server's proxy answers a DELETE without a length 411 (Length Required).
  request.headers.emplace_back("Content-Length", "0");
  const auto response = http_.send(std::move(request), cancel);
  if (response.status == 404) throw sdk::Error::not_found("terminal " + id + " not found");
  if (response.status != 200 && response.status != 204) {
    throw sdk::Error::unavailable(
        "execd's DELETE /pty/" + id + " answered HTTP " + std::to_string(response.status), false);
  }
}

// One command over execd's event stream, from its first submission to its end: a small state
// machine driven by the HTTP client's callbacks (loop thread), its timers (the wait between two
// submissions after a 502) and cancel() (any thread). Kept alive by those callbacks and by the
// cancellation hook; ends exactly once through finish().
class ExecdClient::Run final : public std::enable_shared_from_this<Run> {
 public:
  Run(ExecdClient& client, const ExecdEndpoint& endpoint, std::string sandbox_id,
      const CommandRequest& command, OutputFn output, CommandDoneFn done, SandboxCheckFn check)
      : client_(client),
        endpoint_(endpoint),
        sandbox_id_(std::move(sandbox_id)),
        timeout_(command.timeout),
        // The seed's per-request budget: timeout + 60 s, and a hard cap of twice that plus 30 s
        // on the whole stream; without a timeout only the idle timeout (execd pings every 3 s)
        // bounds it.
        hard_cap_(command.timeout ? 2 * (*command.timeout + 60s) + 30s : 0ms),
        background_(client.operations_.background_exec),
        body_(request_body(command, background_)),
        submissions_(static_cast<int>(client.operations_.retries) + 1),
        output_(std::move(output)),
        check_(std::move(check)),
        done_(std::move(done)) {}

  // Hooks cancellation up (it may fire at once), after the first submission.
  void watch(const sdk::CancelToken& cancel) {
    on_cancel_.emplace(cancel, Canceller{weak_from_this()});
  }

  // Starts one POST /command. First from start(), then from the timer after a 502.
  void submit() {
    auto self = shared_from_this();
    status_ = 0;
    error_body_.clear();
    terminal_ = false;
    parser_ = {};
    started_ = std::chrono::steady_clock::now();
    last_byte_ = started_;
    auto request = to(endpoint_, "POST", "/command");
    request.headers.emplace_back("Content-Type", "application/json");
    request.headers.emplace_back("Accept", "text/event-stream");
    request.body = body_;
    request.timeout = hard_cap_;
    request.idle_timeout = seconds_ms(client_.operations_.stream_idle_timeout_s);
    request.on_headers = [self](long status, const sdk::http::Headers&) { self->status_ = status; };
    request.on_body = [self](std::string_view bytes) { self->on_body(bytes); };
    {
      std::lock_guard lock(mutex_);
      ++attempt_;
    }
    begin_request();
    track(client_.http_.start(
        std::move(request),
        [self](sdk::http::Response*, const sdk::Error* e) { self->on_finished(e); }));
    if (check_ && !watching_) {
      watching_ = true;
      watch_silence(1s);
    }
  }

  // Aborts the stream and interrupts the command on the server (the run ends without waiting for
  // the interrupt, which ~ExecdClient waits for). Any thread, idempotent.
  //
  // Cancelled while the submission waits for its init event, the command may already run on the
  // server, and only its id can stop it (execd does not end a command whose client went away): the
  // run ends now, but the submission is kept open until the id comes (then interrupted, see
  // on_body) or for kInterruptWait at most.
  void cancel() {
    sdk::http::Call call;
    std::string id;
    bool idle;
    bool await_id;
    {
      std::lock_guard lock(mutex_);
      if (finished_ || cancelled_) return;
      cancelled_ = true;
      call = call_;
      id = command_id_;
      idle = waiting_ || (checking_ && !in_flight_);
      await_id = id.empty() && in_flight_ && !waiting_;
      if (await_id) {
        // ~ExecdClient waits for this as for an interrupt; counted before on_finished can see
        // awaiting_id_ and uncount it.
        std::lock_guard count(client_.interrupts_mutex_);
        ++client_.interrupts_pending_;
        awaiting_id_ = true;
      }
    }
    if (await_id) {
      client_.http_.after(kInterruptWait, [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->abort_request();
      });
      return finish(nullptr, sdk::Error::cancelled());
    }
    call.cancel();
    if (!id.empty()) interrupt(id);
    // Between two submissions, or asking the check after a failure, no callback is coming to end
    // the run: end it here.
    if (idle) finish(nullptr, sdk::Error::cancelled());
  }

 private:
  struct Canceller {
    std::weak_ptr<Run> run;
    void operator()() const {
      if (auto self = run.lock()) self->cancel();
    }
  };

  static std::string request_body(const CommandRequest& command, bool background) {
    json::object body{{"command", command.command}};
    if (background) body["background"] = true;
    if (command.cwd) body["cwd"] = *command.cwd;
    if (command.timeout) body["timeout"] = std::max<int64_t>(1, command.timeout->count());
    if (!command.envs.empty()) {
      json::object envs;
      for (const auto& [k, v] : command.envs)
        envs[k] = v;
      body["envs"] = std::move(envs);
    }
    if (command.uid) body["uid"] = *command.uid;
    return json::serialize(body);
  }

  // ---- Silence: a frozen or vanished sandbox says nothing itself (SandboxCheckFn).

  // Loop thread: looks again after `delay` (the run's timer; it holds the run only weakly).
  void watch_silence(std::chrono::milliseconds delay) {
    client_.http_.after(delay, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->on_silence_timer();
    });
  }

  void on_silence_timer() {
    {
      std::lock_guard lock(mutex_);
      if (finished_ || cancelled_ || verdict_) return;
      if (waiting_ || checking_) return watch_silence(1s);  // between submissions, or asking
    }
    const auto now = std::chrono::steady_clock::now();
    // No answer head yet: 1 s (execd answers at once, with its `init` event). Then silence_limit_.
    const auto limit = status_ == 0 ? std::chrono::milliseconds(1s) : silence_limit_;
    const auto due = last_byte_ + limit;
    if (now < due) {
      return watch_silence(std::chrono::duration_cast<std::chrono::milliseconds>(due - now) + 1ms);
    }
    ask([](Run& run, std::optional<sdk::Error> verdict) {
      if (verdict) return run.end_by_verdict(std::move(*verdict));
      // Going on: ask again only after a longer silence.
      run.last_byte_ = std::chrono::steady_clock::now();
      run.silence_limit_ = std::min<std::chrono::milliseconds>(run.silence_limit_ * 2, 60s);
      run.watch_silence(run.silence_limit_);
    });
  }

  // Asks check_; `then(run, verdict)` runs on the loop thread.
  template <class Then>
  void ask(Then then) {
    {
      std::lock_guard lock(mutex_);
      checking_ = true;
    }
    // The run is held until the verdict is in (the lifecycle read is bounded): it may be the
    // run's only owner, after its request ended.
    check_([self = shared_from_this(), then](std::optional<sdk::Error> verdict) {
      // Back onto the loop: the run's loop-thread state is touched only there.
      self->client_.http_.after(0ms, [self, then, verdict = std::move(verdict)]() mutable {
        {
          std::lock_guard lock(self->mutex_);
          self->checking_ = false;
          if (self->finished_) return;
        }
        then(*self, std::move(verdict));
      });
    });
  }

  // The check says the command cannot go on: the stream is ended, and on_finished reports this.
  void end_by_verdict(sdk::Error error) {
    sdk::http::Call call;
    bool in_flight;
    {
      std::lock_guard lock(mutex_);
      if (finished_ || cancelled_) return;
      verdict_ = error;
      call = call_;
      in_flight = in_flight_;
    }
    if (in_flight) return call.cancel();  // on_finished reports the verdict
    finish(nullptr, error);
  }

  // Loop thread.
  void on_body(std::string_view bytes) {
    last_byte_ = std::chrono::steady_clock::now();
    if (status_ != 200) {
      if (error_body_.size() < 64 * 1024) error_body_.append(bytes);
      return;
    }
    if (terminal_) return;
    std::vector<std::pair<sdk::StdStream, std::string>> lines;
    parser_.feed(bytes, [&](const EventStreamParser::Event& event) {
      if (terminal_) return;
      if (event.type == "init") {
        bool cancelled;
        sdk::http::Call call;
        {
          std::lock_guard lock(mutex_);
          command_id_ = event.text;
          cancelled = cancelled_;
          call = call_;
        }
        if (cancelled) {
          // cancel() came before the id: stop the command now that it can be named.
          terminal_ = true;
          interrupt(event.text);
          call.cancel();
        }
      } else if (event.type == "stdout" || event.type == "stderr") {
        const auto stream = event.type == "stdout" ? sdk::StdStream::out : sdk::StdStream::err;
        lines.emplace_back(stream, event.text == "\n" ? event.text : event.text + "\n");
      } else if (event.type == "execution_complete" || event.type == "error") {
        terminal_ = true;
        last_ = event;
      }
    });
    for (const auto& [stream, text] : lines)
      output_(stream, text);
    if (terminal_) {
      // The rest of the stream (execd holds it open about a second more) is not waited for: the
      // transfer is ended, and on_finished() reads the terminal event. (Not by throwing from here,
      // which costs an unwind per command.)
      sdk::http::Call call;
      {
        std::lock_guard lock(mutex_);
        call = call_;
      }
      call.cancel();
    }
  }

  // Loop thread: one submission ended, with `error` or a response.
  void on_finished(const sdk::Error* error) {
    bool cancelled;
    bool awaited_id;
    {
      std::lock_guard lock(mutex_);
      call_ = {};
      in_flight_ = false;
      cancelled = cancelled_;
      awaited_id = std::exchange(awaiting_id_, false);
    }
    if (awaited_id) {
      {
        std::lock_guard lock(client_.interrupts_mutex_);
        --client_.interrupts_pending_;
      }
      client_.interrupts_done_.notify_all();
    }
    if (terminal_ && background_ && last_.type == "execution_complete" && !cancelled) {
      return start_polling();
    }
    if (terminal_) {
      const bool timed_out = timeout_ && std::chrono::steady_clock::now() - started_ >= *timeout_;
      const CommandOutcome outcome{exit_status_of(last_, timed_out), command_id()};
      if (last_.type == "error" && outcome.status.error_type == SBX_EXEC_ERROR_SANDBOX) {
        // The command did not run (or was killed): the server's reason goes to stderr.
        const std::string reason = last_.traceback.value_or(last_.error_value.value_or(""));
        if (!reason.empty()) output_(sdk::StdStream::err, reason + "\n");
      }
      return finish(&outcome, {});
    }
    if (cancelled) return finish(nullptr, sdk::Error::cancelled());
    std::optional<sdk::Error> verdict;
    {
      std::lock_guard lock(mutex_);
      verdict = verdict_;
    }
    if (verdict) return finish(nullptr, *verdict);
    if (error && reached_no_answer(*error) && status_ == 0 &&
        transport_retries_ < client_.operations_.command_retries) {
      // operations.command_retries: the submission is sent again, though a command whose answer
      // was lost may have started and would then run twice (the user's choice; default 0).
      ++transport_retries_;
      client_.log_.warn("OpenSandbox command run (sandbox_id=", sandbox_id_,
                        ") failed before any answer (", error->what(), "); submitting again (",
                        transport_retries_, "/", client_.operations_.command_retries, ")");
      return after(resubmit_delay(transport_retries_), [](Run& run) { run.submit(); });
    }
    if (error && check_) {
      // Could not connect, lost the connection (before the answer or in its stream): a sandbox
      // deleted under the handle (its port is closed) or paused says so only through the
      // lifecycle API.
      return ask([original = *error](Run& run, std::optional<sdk::Error> verdict) {
        if (verdict) return run.finish(nullptr, *verdict);
        run.report_transport_error(original);
      });
    }
    if (error) return report_transport_error(*error);
    if (status_ == 200) {
      // Cut short: a sandbox deleted under the command (its execd gone with it) ends the stream
      // this way too, and says so only through the lifecycle API.
      return explain(sdk::Error::unavailable(what_of("command run", sandbox_id_) +
                                                 ": the event stream ended without "
                                                 "execution_complete or error",
                                             false));
    }
    if (status_ == 502) {
      if (!check_ || std::exchange(asked_after_502_, true)) return after_502();
      // The proxy reached no execd: a sandbox deleted or paused meanwhile is told at the first
      // 502, not after every resubmission.
      return ask([](Run& run, std::optional<sdk::Error> verdict) {
        if (verdict) return run.finish(nullptr, *verdict);
        run.after_502();
      });
    }
    sdk::http::Response response;
    response.status = status_;
    response.body = error_body_;
    const ApiError api_error = parse_api_error(response);
    if (status_ == 400 && api_error.code == "INVALID_REQUEST_BODY") {
      // execd refuses the command before starting it, e.g. a cwd that does not exist.
      output_(sdk::StdStream::err, api_error.message + "\n");
      const CommandOutcome outcome{sdk::ExitStatus::sandbox_failure(), {}};
      return finish(&outcome, {});
    }
    finish(nullptr, to_error(api_error, what_of("command run", sandbox_id_), false));
  }

  // Ends with `error`, unless the sandbox's status explains it better (gone: NOT_FOUND; paused:
  // FAILED_PRECONDITION).
  void explain(sdk::Error error) {
    if (!check_) return finish(nullptr, error);
    ask([error = std::move(error)](Run& run, std::optional<sdk::Error> verdict) {
      run.finish(nullptr, verdict ? *verdict : error);
    });
  }

  void report_transport_error(const sdk::Error& error) {
    if (error.status() == SBX_STATUS_TIMEOUT && timeout_) {
      return finish(nullptr,
                    sdk::Error::timeout("OpenSandbox exec exceeded hard cap of " +
                                        std::to_string(hard_cap_.count() / 1000) +
                                        "s; the command wedged (sandbox_id=" + sandbox_id_ + ")"));
    }
    // The transport's words, with what was running where.
    finish(nullptr,
           sdk::Error(error.status(), what_of("command run", sandbox_id_) + ": " + error.what(),
                      error.details()));
  }

  // The proxy reached no execd: submit again after a pause, or give up.
  void after_502() {
    int attempt;
    {
      std::lock_guard lock(mutex_);
      attempt = attempt_;
    }
    if (attempt >= submissions_) {
      return finish(
          nullptr,
          sdk::Error(SBX_STATUS_UNAVAILABLE,
                     "Sandbox backend unreachable through " + std::to_string(submissions_) +
                         " submissions of 'command run' (proxy 502: no TCP connection "
                         "to execd); the sandbox is likely dead; sandbox_id=" +
                         sandbox_id_,
                     sdk::ErrorDetails{.retryable = false, .http_status = 502}));
    }
    const auto delay = resubmit_delay(attempt);
    client_.log_.warn("Backend-connect 502 on command run (sandbox_id=", sandbox_id_,
                      "); submission ", attempt, "/", submissions_, ", again in ", delay.count(),
                      " ms");
    after(delay, [](Run& run) { run.submit(); });
  }

  // Before a request starts: in flight until its end (on_finished, ended_by_cancel), which may
  // come before track() when the request fails at once.
  void begin_request() {
    std::lock_guard lock(mutex_);
    in_flight_ = true;
  }

  // Remembers the request started after begin_request(), for cancel(), unless it already ended;
  // cancels it at once when cancel() ran while it was being started (and waits for no id).
  void track(sdk::http::Call call) {
    bool cancel_now;
    {
      std::lock_guard lock(mutex_);
      if (in_flight_) call_ = call;
      cancel_now = cancelled_ && !awaiting_id_;
    }
    if (cancel_now) call.cancel();
  }

  // The request in flight is ended (kInterruptWait passed without the id).
  void abort_request() {
    sdk::http::Call call;
    {
      std::lock_guard lock(mutex_);
      call = call_;
    }
    call.cancel();
  }

  // Runs `step` on the loop after `delay`, unless the run ended meanwhile (cancel() ends it).
  template <class Step>
  void after(std::chrono::milliseconds delay, Step step) {
    {
      std::lock_guard lock(mutex_);
      waiting_ = true;
    }
    client_.http_.after(delay, [self = shared_from_this(), step = std::move(step)] {
      {
        std::lock_guard lock(self->mutex_);
        if (self->finished_) return;
        self->waiting_ = false;
      }
      step(*self);
    });
  }

  // ---- Background mode: the submission's stream ended at once; poll the status, then fetch
  // the log.

  void start_polling() {
    if (command_id().empty()) {
      return finish(nullptr,
                    sdk::Error::internal(what_of("command run (background submit)", sandbox_id_) +
                                         ": the answer carried no command id"));
    }
    const auto& o = client_.operations_;
    poll_delay_ = seconds_ms(std::min(o.background_poll_initial_s, o.background_poll_interval_s));
    if (timeout_) poll_deadline_ = std::chrono::steady_clock::now() + *timeout_ + 60s;
    after(poll_delay_, [](Run& run) { run.poll_status(); });
  }

  void poll_status() {
    auto self = shared_from_this();
    auto request = to(endpoint_, "GET", "/command/status/" + sdk::http::url_encode(command_id()));
    const auto& o = client_.operations_;
    if (o.status_poll_timeout_s) {
      request.timeout = seconds_ms(*o.status_poll_timeout_s);
    } else if (client_.connection_.request_timeout_s) {
      request.timeout = seconds_ms(*client_.connection_.request_timeout_s);
    }
    begin_request();
    track(client_.http_.start(std::move(request),
                              [self](sdk::http::Response* response, const sdk::Error* error) {
                                self->on_status(response, error);
                              }));
  }

  void on_status(const sdk::http::Response* response, const sdk::Error* error) {
    if (ended_by_cancel()) return;
    const std::string what = what_of("command status poll", sandbox_id_);
    if (error || response->status >= 500) {
      // A lost poll, a timed-out one or a server error: poll again, up to operations.retries
      // times in a row.
      if (++poll_failures_ <= client_.operations_.retries) {
        client_.log_.warn(
            what, " failed (", poll_failures_, "/", client_.operations_.retries,
            "): ", error ? error->what() : "HTTP " + std::to_string(response->status));
        return after(poll_delay_, [](Run& run) { run.poll_status(); });
      }
      return finish(nullptr, error ? *error : execd_error(*response, what));
    }
    poll_failures_ = 0;
    if (response->status != 200) return finish(nullptr, execd_error(*response, what));
    boost::system::error_code ec;
    const json::value parsed = json::parse(response->body, ec);
    const json::object* status = parsed.if_object();
    const json::value* running = status ? status->if_contains("running") : nullptr;
    if (!running || !running->is_bool()) {
      return finish(nullptr, sdk::Error::internal("OpenSandbox status has no 'running' field (" +
                                                  what + ")"));
    }
    // While running, execd may leave exit_code out; once finished it must be there (null when the
    // command did not exit by itself).
    const json::value* exit_code = status->if_contains("exit_code");
    if (!exit_code && !running->get_bool()) {
      return finish(nullptr, sdk::Error::internal("OpenSandbox status has no 'exit_code' field (" +
                                                  what + ")"));
    }
    if (running->get_bool()) {
      if (poll_deadline_ && std::chrono::steady_clock::now() >= *poll_deadline_) {
        return finish(nullptr, sdk::Error::timeout(
                                   "Timed out polling OpenSandbox background command; command " +
                                   command_id() + " still running " +
                                   std::to_string(timeout_->count() / 1000 + 60) +
                                   " s after its submission (sandbox_id=" + sandbox_id_ + ")"));
      }
      poll_delay_ =
          std::min(std::chrono::duration_cast<std::chrono::milliseconds>(poll_delay_ * 1.5),
                   seconds_ms(client_.operations_.background_poll_interval_s));
      return after(poll_delay_, [](Run& run) { run.poll_status(); });
    }
    if (exit_code->is_int64()) exit_code_ = exit_code->get_int64();
    if (const auto* e = status->if_contains("error"); e && e->is_string()) {
      status_error_ = std::string(e->get_string());
    }
    fetch_log();
  }

  // The command's combined stdout and stderr, as execd keeps it, to stdout.
  void fetch_log() {
    auto self = shared_from_this();
    auto request =
        to(endpoint_, "GET", "/command/" + sdk::http::url_encode(command_id()) + "/logs?cursor=0");
    request.idle_timeout = seconds_ms(client_.operations_.stream_idle_timeout_s);
    status_ = 0;
    error_body_.clear();
    request.on_headers = [self](long status, const sdk::http::Headers&) { self->status_ = status; };
    request.on_body = [self](std::string_view bytes) {
      if (self->status_ == 200) {
        self->output_(sdk::StdStream::out, bytes);
      } else if (self->error_body_.size() < 64 * 1024) {
        self->error_body_.append(bytes);
      }
    };
    begin_request();
    track(client_.http_.start(
        std::move(request),
        [self](sdk::http::Response*, const sdk::Error* error) { self->on_log(error); }));
  }

  void on_log(const sdk::Error* error) {
    if (ended_by_cancel()) return;
    if (error) return finish(nullptr, *error);
    if (status_ != 200) {
      sdk::http::Response response;
      response.status = status_;
      response.body = error_body_;
      return finish(nullptr, execd_error(response, what_of("command log", sandbox_id_)));
    }
    if (!status_error_.empty()) output_(sdk::StdStream::err, status_error_ + "\n");
    const bool timed_out = timeout_ && std::chrono::steady_clock::now() - started_ >= *timeout_;
    sdk::ExitStatus status = sdk::ExitStatus::exited(0);
    if (exit_code_ && *exit_code_ >= 0 && *exit_code_ <= 255) {
      status = sdk::ExitStatus::exited(static_cast<int32_t>(*exit_code_));
    } else if (exit_code_ || !status_error_.empty()) {
      // Killed (-1), or no exit code but an error: the timeout when it had passed.
      status = timed_out ? sdk::ExitStatus::timed_out() : sdk::ExitStatus::sandbox_failure();
    }
    const CommandOutcome outcome{status, command_id()};
    finish(&outcome, {});
  }

  // After a request of the background steps ended: true (and the run ended) if cancel() ran.
  bool ended_by_cancel() {
    bool cancelled;
    {
      std::lock_guard lock(mutex_);
      call_ = {};
      in_flight_ = false;
      cancelled = cancelled_;
    }
    if (cancelled) finish(nullptr, sdk::Error::cancelled());
    return cancelled;
  }

  void interrupt(const std::string& id) {
    auto request = to(endpoint_, "DELETE", "/command?id=" + sdk::http::url_encode(id));
    request.timeout = kInterruptTimeout;
    request.headers.emplace_back("Content-Length", "0");  // the real server's proxy needs one
    {
      std::lock_guard lock(client_.interrupts_mutex_);
      ++client_.interrupts_pending_;
    }
    client_.http_.start(std::move(request), [&client = client_, log = client_.log_, id,
                                             sandbox = sandbox_id_](sdk::http::Response* response,
                                                                    const sdk::Error* error) {
      {
        std::lock_guard lock(client.interrupts_mutex_);
        --client.interrupts_pending_;
      }
      client.interrupts_done_.notify_all();
      if (error) {
        log.debug("interrupting command ", id, " of sandbox ", sandbox, ": ", error->what());
      } else {
        log.debug("interrupted command ", id, " of sandbox ", sandbox, ": HTTP ", response->status);
      }
    });
  }

  std::string command_id() {
    std::lock_guard lock(mutex_);
    return command_id_;
  }

  void finish(const CommandOutcome* outcome, const std::optional<sdk::Error>& error) {
    CommandDoneFn done;
    {
      std::lock_guard lock(mutex_);
      if (finished_) return;
      finished_ = true;
      done = std::move(done_);
    }
    done(outcome, error ? &*error : nullptr);
  }

  ExecdClient& client_;
  const ExecdEndpoint endpoint_;
  const std::string sandbox_id_;
  const std::optional<std::chrono::milliseconds> timeout_;
  const std::chrono::milliseconds hard_cap_;
  const bool background_;
  const std::string body_;
  const int submissions_;
  const OutputFn output_;
  const SandboxCheckFn check_;    // empty: no silence watch
  bool asked_after_502_ = false;  // the first 502 asked check_ (loop thread)
  CommandDoneFn done_;            // moved out by finish()

  std::mutex mutex_;  // guards the members below it up to the blank line
  int attempt_ = 0;
  sdk::http::Call call_;      // the submission in flight; none while waiting between submissions
  bool in_flight_ = false;    // call_ holds a request not yet finished
  bool waiting_ = false;      // between two submissions
  bool awaiting_id_ = false;  // cancelled before the init event: the submission waits for the id
  bool cancelled_ = false;
  bool finished_ = false;
  bool checking_ = false;              // check_ asked, its verdict not yet in
  std::optional<sdk::Error> verdict_;  // check_'s error: the run ends with it
  std::string command_id_;

  // The current submission's state: loop thread only (set up by submit() before its request
  // starts).
  long status_ = 0;
  std::string error_body_;
  bool terminal_ = false;
  EventStreamParser::Event last_;
  EventStreamParser parser_;
  std::chrono::steady_clock::time_point started_;
  // The silence watch: loop thread only (watching_ is set before the first request starts).
  std::chrono::steady_clock::time_point last_byte_;
  std::chrono::milliseconds silence_limit_{5s};
  bool watching_ = false;
  int transport_retries_ = 0;  // submissions sent again for operations.command_retries

  // Background mode's polling state: loop thread only.
  std::chrono::milliseconds poll_delay_{0};
  std::optional<std::chrono::steady_clock::time_point> poll_deadline_;
  int64_t poll_failures_ = 0;
  std::optional<int64_t> exit_code_;
  std::string status_error_;

  std::optional<std::stop_callback<Canceller>> on_cancel_;  // last: deregistered first
};

void ExecdClient::start(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                        const CommandRequest& request, OutputFn output, CommandDoneFn done,
                        const sdk::CancelToken& cancel, SandboxCheckFn check) {
  if (cancel.stop_requested()) {
    const sdk::Error cancelled = sdk::Error::cancelled();
    return done(nullptr, &cancelled);
  }
  auto run = std::make_shared<Run>(*this, endpoint, sandbox_id, request, std::move(output),
                                   std::move(done), std::move(check));
  run->submit();
  run->watch(cancel);
}

CommandOutcome ExecdClient::run(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                                const CommandRequest& request, OutputFn output,
                                const sdk::CancelToken& cancel, SandboxCheckFn check) {
  struct Result {
    std::mutex mutex;
    std::condition_variable ended;
    std::optional<CommandOutcome> outcome;
    std::optional<sdk::Error> error;
  };
  auto result = std::make_shared<Result>();
  start(
      endpoint, sandbox_id, request, std::move(output),
      [result](const CommandOutcome* outcome, const sdk::Error* error) {
        std::lock_guard lock(result->mutex);
        if (outcome) {
          result->outcome = *outcome;
        } else {
          result->error = *error;
        }
        result->ended.notify_all();
      },
      cancel, std::move(check));
  std::unique_lock lock(result->mutex);
  result->ended.wait(lock, [&] { return result->outcome || result->error; });
  if (result->error) throw *result->error;
  return *result->outcome;
}

// Watches one upload or download for a sandbox that went away behind the handle: paused (its
// execd takes the connection and never answers) or deleted. The transferring thread calls
// progress() on every byte moved; the loop's timer asks `check` after 1 s without progress, then
// after 5, 10, 20, ... up to 60 s, and ends the call with the check's error, which verdict()
// then gives. Kept alive by its timer and by the check in flight; stop() ends the watch.
class ExecdClient::TransferWatch final : public std::enable_shared_from_this<TransferWatch> {
 public:
  TransferWatch(sdk::http::Client& http, SandboxCheckFn check)
      : http_(http), check_(std::move(check)) {}

  // Calling thread, once the call is started.
  void watch(sdk::http::Call call) {
    {
      std::lock_guard lock(mutex_);
      call_ = std::move(call);
    }
    progress();
    arm(1s);
  }
  // Any thread.
  void progress() { last_progress_.store(now_ms()); }
  // Calling thread: the transfer ended; no check is asked after this.
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    call_ = {};
  }
  std::optional<sdk::Error> verdict() {
    std::lock_guard lock(mutex_);
    return verdict_;
  }

 private:
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void arm(std::chrono::milliseconds delay) {
    http_.after(delay, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->on_timer();
    });
  }

  // Loop thread.
  void on_timer() {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return;
    }
    const int64_t due = last_progress_.load() + limit_.count();
    const int64_t now = now_ms();
    if (now < due) return arm(std::chrono::milliseconds(due - now + 1));
    check_([self = shared_from_this()](std::optional<sdk::Error> verdict) {
      sdk::http::Call call;
      {
        // Under the lock: once stop() has returned, the client (and http_) may be gone.
        std::lock_guard lock(self->mutex_);
        if (self->stopped_) return;
        if (!verdict) {
          // Going on: ask again only after a longer stall (on the loop, the timer's thread).
          self->http_.after(0ms, [self] {
            {
              std::lock_guard relock(self->mutex_);
              if (self->stopped_) return;
            }
            self->progress();
            self->limit_ = std::min<std::chrono::milliseconds>(
                self->limit_ == 1s ? std::chrono::milliseconds(5s) : self->limit_ * 2, 60s);
            self->arm(self->limit_);
          });
          return;
        }
        self->verdict_ = verdict;
        call = self->call_;
      }
      call.cancel();
    });
  }

  sdk::http::Client& http_;
  const SandboxCheckFn check_;
  std::atomic<int64_t> last_progress_{0};  // steady clock, ms
  std::chrono::milliseconds limit_{1s};    // loop thread
  std::mutex mutex_;
  sdk::http::Call call_;               // guarded by mutex_
  bool stopped_ = false;               // guarded by mutex_
  std::optional<sdk::Error> verdict_;  // guarded by mutex_
};

namespace {
// Stops a transfer's watch however the transfer ends (a source or sink may throw).
template <class Watch>
struct StopWatch {
  const std::shared_ptr<Watch>& watch;
  ~StopWatch() {
    if (watch) watch->stop();
  }
};
}  // namespace

void ExecdClient::upload(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                         const sdk::UploadRequest& request, sdk::ByteSource& source,
                         const sdk::CancelToken& cancel, SandboxCheckFn check) {
  sdk::http::Multipart multipart;
  // execd takes the octal mode written as a decimal number (0644 is 644).
  char mode[16];
  const auto end = std::to_chars(mode, mode + sizeof mode, request.mode & 07777, 8).ptr;
  json::object metadata{{"path", request.remote_path},
                        {"mode", std::stoll(std::string(mode, end))}};
  multipart.add({.name = "metadata",
                 .filename = "metadata",
                 .content_type = "application/json",
                 .bytes = json::serialize(metadata)});
  const auto watch = check ? std::make_shared<TransferWatch>(http_, std::move(check)) : nullptr;
  multipart.add({.name = "file",
                 .filename = request.remote_path,
                 .content_type = "application/octet-stream",
                 .source =
                     [&source, &watch](char* buffer, size_t capacity) {
                       if (watch) watch->progress();
                       return source.read(buffer, capacity);
                     },
                 .size = source.size()});
  auto http_request = to(endpoint, "POST", "/files/upload");
  http_request.push_body = true;
  http_request.idle_timeout = seconds_ms(operations_.stream_idle_timeout_s);
  if (watch) {
    http_request.on_headers = [watch](long, const sdk::http::Headers&) { watch->progress(); };
  }
  multipart.prepare_push(http_request);
  sdk::http::Call call = http_.start(std::move(http_request));
  if (watch) watch->watch(call);
  const StopWatch<TransferWatch> stop_watch{watch};
  std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
  multipart.pump(call);
  sdk::http::Response response;
  try {
    response = finish(call, cancel);
  } catch (const sdk::Error&) {
    if (watch && !cancel.stop_requested()) {  // the caller's cancellation wins
      watch->stop();
      if (auto verdict = watch->verdict()) throw *verdict;
    }
    throw;
  }
  if (watch) watch->stop();
  if (response.status != 200) {
    throw execd_error(response, what_of("upload to " + request.remote_path, sandbox_id));
  }
}

void ExecdClient::download(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                           const std::string& path, sdk::ByteSink& sink,
                           const sdk::CancelToken& cancel, SandboxCheckFn check) {
  const std::string what = what_of("download of " + path, sandbox_id);
  uint64_t delivered = 0;         // bytes handed to the sink
  std::optional<uint64_t> total;  // the file's size, from the first answer's Content-Length
  for (int64_t resumes = 0;; ++resumes) {
    auto request = to(endpoint, "GET", "/files/download?path=" + sdk::http::url_encode(path));
    request.idle_timeout = seconds_ms(operations_.stream_idle_timeout_s);
    request.pull_body_limit = 256 * 1024;
    // A resume asks for the rest; the client checks the 206's Content-Range against it.
    if (delivered > 0) request.range = sdk::http::ByteRange{delivered, std::nullopt, total};
    struct Head {
      std::atomic<long> status{0};
      std::atomic<int64_t> length{-1};
    };
    auto head = std::make_shared<Head>();
    const auto watch = check ? std::make_shared<TransferWatch>(http_, check) : nullptr;
    request.on_headers = [head, watch](long code, const sdk::http::Headers& headers) {
      if (watch) watch->progress();
      for (const auto& [name, value] : headers) {
        if (name.size() == 14 && strncasecmp(name.c_str(), "content-length", 14) == 0) {
          int64_t n = -1;
          std::from_chars(value.data(), value.data() + value.size(), n);
          head->length.store(n);
        }
      }
      head->status.store(code);
    };
    sdk::http::Call call = http_.start(std::move(request));
    if (watch) watch->watch(call);
    const StopWatch<TransferWatch> stop_watch{watch};
    std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
    std::string chunk, error_body;
    for (bool done = false; !done;) {
      done = call.read_body(chunk, std::chrono::steady_clock::time_point::max());
      if (chunk.empty()) continue;
      if (watch) watch->progress();
      const long status = head->status.load();
      if (status == 200 || status == 206) {
        if (!total && status == 200 && head->length.load() >= 0) {
          total = static_cast<uint64_t>(head->length.load());
          if (delivered == 0) sink.expect_size(*total);  // the host may stream it on
        }
        sink.write(chunk);
        delivered += chunk.size();
      } else if (error_body.size() < 64 * 1024) {
        error_body += chunk;
      }
    }
    sdk::http::Response response;
    if (watch) watch->stop();
    try {
      response = finish(call, cancel);
    } catch (const sdk::Error& e) {
      if (watch && !cancel.stop_requested()) {  // the caller's cancellation wins
        if (auto verdict = watch->verdict()) throw *verdict;
      }
      // Cut mid-way (the connection lost, or silent past the idle timeout) after some of the
      // file arrived: ask for the rest, up to operations.retries times. Never a cancellation.
      const long status = head->status.load();
      if (status >= 400 && e.status() != SBX_STATUS_CANCELLED) {
        // An error answer whose body broke off: the real execd answers a directory with a 500
        // whose Content-Length is not its body's. The answer is the error, not the transport.
        response.status = status;
        response.body = std::move(error_body);
        throw execd_error(response, what);
      }
      const bool cut = (status == 200 || status == 206) && delivered > 0 &&
                       (e.status() == SBX_STATUS_UNAVAILABLE || e.status() == SBX_STATUS_TIMEOUT);
      if (!cut || resumes >= operations_.retries) {
        throw sdk::Error(e.status(), what + ": " + e.what(), e.details());
      }
      log_.warn(what, " was cut after ", delivered, " bytes (", e.what(), "); resuming there (",
                resumes + 1, "/", operations_.retries, ")");
      continue;
    }
    if (response.status != 200 && response.status != 206) {
      response.body = std::move(error_body);
      throw execd_error(response, what);
    }
    if (total && delivered != *total) {
      throw sdk::Error::unavailable(what + ": " + std::to_string(delivered) + " of " +
                                        std::to_string(*total) + " bytes arrived",
                                    false);
    }
    if (delivered == 0 && response.status == 200) sink.expect_size(0);  // an empty file
    return;
  }
}

}  // namespace sbx::opensandbox
