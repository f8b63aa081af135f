#include "agent.hpp"

#include <sbx/sdk/unix_socket.hpp>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <utility>

__attribute__((visibility("hidden"))) extern const char sbx_local_docker_agent_begin[];
__attribute__((visibility("hidden"))) extern const char sbx_local_docker_agent_end[];
__attribute__((visibility("hidden"))) extern const char sbx_local_docker_agent_hash[];

namespace sbx::local_docker {
namespace {

namespace json = boost::json;

// The agent pings a silent stream every 3 s: this long without a byte means it is frozen (a
// paused container, a stopped one whose socket still accepts) or gone.
constexpr std::chrono::milliseconds kIdleTimeout{20'000};
// Beyond a command's own timeout, which the agent enforces: the bound on a frozen agent.
constexpr std::chrono::milliseconds kDeadlineSlack{30'000};
// The most of an answer kept whole (a JSON object: an error, a terminal's id, a file's info): a
// longer one is not the agent's. Streamed bodies (a command's frames, a download) are not kept.
constexpr size_t kMaxAnswerBytes = 64 * 1024;

std::string json_field(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

// The agent's error answer's message (its body's first bytes when it is not one).
std::string json_message(const std::string& body) {
  try {
    return json_field(json::parse(body).as_object(), "message");
  } catch (const std::exception&) {
    return body.substr(0, 512);
  }
}

}  // namespace

std::string_view agent_program() noexcept {
  return {sbx_local_docker_agent_begin,
          static_cast<size_t>(sbx_local_docker_agent_end - sbx_local_docker_agent_begin)};
}

std::string_view agent_hash() noexcept {
  return sbx_local_docker_agent_hash;
}

bool route_refused(const sdk::Error& error) {
  return error.details().reason == sdk::kUnixSocketRefused;
}

sdk::Error unreachable(const std::string& name, const sdk::Error& error) {
  return sdk::Error::unavailable("sandbox " + name +
                                     " is unreachable: its agent's socket was changed from inside "
                                     "the sandbox, and the host follows no link and no "
                                     "replacement there (" +
                                     error.what() + ")",
                                 false);
}

// ---- AgentClient --------------------------------------------------------------------------------

namespace {

// One command through an agent, from its request to `done`. Kept alive by the request's callbacks
// and by the cancellation hook (weakly).
class AgentRun final : public std::enable_shared_from_this<AgentRun> {
 public:
  AgentRun(std::string sandbox, sdk::OutputSink& out, AgentDoneFn done)
      : sandbox_(std::move(sandbox)), out_(out), done_(std::move(done)) {}

  void start(sdk::http::Client& http, sdk::http::Request request, const sdk::CancelToken& cancel) {
    auto self = shared_from_this();
    request.on_headers = [self](long status, const sdk::http::Headers&) {
      self->http_status_ = status;
    };
    request.on_body = [self](std::string_view bytes) { self->on_body(bytes); };
    {
      std::lock_guard lock(hold_mutex_);
      call_ = http.start(std::move(request),
                         [self](sdk::http::Response* response, const sdk::Error* error) {
                           self->on_complete(response, error);
                         });
      if (held_) call_.hold_receive(true);
    }
    on_cancel_.emplace(cancel, Canceller{weak_from_this()});
  }

  // The host holds the output (sbx.flow/1): the stream stops being read, the agent's writes to
  // it wait, and past its own buffer (4 MiB) the agent stops reading the command's pipes, so the
  // command waits on its output as on a terminal nobody reads.
  void hold(bool hold) {
    std::lock_guard lock(hold_mutex_);
    held_ = hold;
    call_.hold_receive(hold);  // nothing before the call exists: start applies held_
  }

 private:
  struct Canceller {
    std::weak_ptr<AgentRun> run;
    void operator()() const {
      if (auto self = run.lock()) {
        self->cancelled_ = true;
        self->call_.cancel();
      }
    }
  };

  void on_body(std::string_view bytes) {
    // What arrives after a cancellation is dropped: the loop may hand over many more reads before
    // the call's cancellation reaches it (the host may cancel from its own output callback).
    if (cancelled_) return;
    if (http_status_ != 200) {
      // An error answer is a short JSON object: one longer than this is not the agent's, and
      // nothing more of it is read.
      if (error_body_.size() >= 64 * 1024) {
        throw sdk::Error::internal(
            "it answered HTTP " + std::to_string(http_status_) +
            " with a body of more than 64 KiB: " + error_body_.substr(0, 256));
      }
      error_body_.append(bytes);
      return;
    }
    parser_.feed(bytes, [&](char kind, std::string_view payload) {
      if (cancelled_) return;
      switch (kind) {
        case 'o':
          out_.write(sdk::StdStream::out, payload);
          break;
        case 'e':
          out_.write(sdk::StdStream::err, payload);
          break;
        case 'x':
          end_ = std::string(payload);
          break;
        default:  // 'i' (the command's id), 'p' (a ping)
          break;
      }
    });
  }

  void on_complete(sdk::http::Response* response, const sdk::Error* error) {
    if (error) {
      if (cancelled_ || error->status() == SBX_STATUS_CANCELLED) {
        return fail(sdk::Error::cancelled());
      }
      // What the agent sent cannot be what an agent sends (a frame or a head beyond its bounds):
      // said as such, not as a sandbox that went away.
      if (error->status() == SBX_STATUS_INTERNAL ||
          error->status() == SBX_STATUS_RESOURCE_EXHAUSTED) {
        return fail(
            sdk::Error(error->status(),
                       "sandbox " + sandbox_ + ": its agent answered badly: " + error->what()));
      }
      // Details kept: whether anything was sent (may_have_run) tells "gone" from "went away".
      return fail(sdk::Error(SBX_STATUS_UNAVAILABLE,
                             std::string("the sandbox's agent: ") + error->what(),
                             error->details()));
    }
    if (response->status == 410) {  // expired before it could start: the sandbox is gone
      return fail(sdk::Error::sandbox_gone("sandbox " + sandbox_ + " has expired (" +
                                           json_message(error_body_) + ")"));
    }
    if (response->status == 400) {
      // Refused before it started (a cwd, a user that does not exist): the command could not
      // run, as Docker's exec reports it.
      std::string message = error_body_;
      try {
        message = json_field(json::parse(error_body_).as_object(), "message");
      } catch (const std::exception&) {
      }
      out_.write(sdk::StdStream::err, "sbx: the command could not start: " + message + "\n");
      return succeed(sdk::ExitStatus::sandbox_failure());
    }
    if (response->status != 200) {
      return fail(sdk::Error::unavailable("the sandbox's agent answered HTTP " +
                                          std::to_string(response->status) + ": " +
                                          error_body_.substr(0, 512)));
    }
    if (!end_) {
      return fail(
          sdk::Error::unavailable("the sandbox's agent ended the command's stream without its "
                                  "end (the agent was killed or the sandbox stopped)"));
    }
    try {
      const CommandEnd end = parse_command_end(*end_);
      if (end.sandbox_expired) return fail(sandbox_expired(sandbox_, *end.sandbox_expired));
      if (end.status) return succeed(*end.status);
      out_.write(sdk::StdStream::err,
                 "sbx: the command could not start: " + *end.not_started + "\n");
      return succeed(sdk::ExitStatus::sandbox_failure());
    } catch (const sdk::Error& e) {
      return fail(sdk::Error(e.status(), "sandbox " + sandbox_ + ": " + e.what()));
    }
  }

  // `done` once, with a status or an error.
  void succeed(const sdk::ExitStatus& status) {
    if (!finished_.exchange(true)) std::exchange(done_, {})(&status, nullptr);
  }
  void fail(const sdk::Error& error) {
    if (!finished_.exchange(true)) std::exchange(done_, {})(nullptr, &error);
  }

  const std::string sandbox_;
  sdk::OutputSink& out_;
  AgentDoneFn done_;
  FrameParser parser_;
  long http_status_ = 0;
  std::string error_body_;
  std::optional<std::string> end_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
  std::mutex hold_mutex_;  // orders hold() with the call's start
  bool held_ = false;
  sdk::http::Call call_;
  std::optional<std::stop_callback<Canceller>> on_cancel_;
};

sdk::http::ClientOptions client_options() {
  sdk::http::ClientOptions options;
  options.base_url = "http://sbx-agent";
  options.connect_timeout = std::chrono::milliseconds(5'000);
  options.max_connections = 4096;
  options.max_idle_connections = 256;
  options.keepalive_expiry = std::chrono::milliseconds(60'000);
  // A sandbox's root can rename, delete and link in its run/ (host_dirs.hpp): no link followed.
  options.unix_socket_follow_links = false;
  return options;
}

}  // namespace

AgentClient::AgentClient(sdk::Logger log) : log_(std::move(log)), http_(client_options()) {}

AgentCommand AgentClient::start(const std::string& socket, const std::string& sandbox,
                                const ExecParams& command, sdk::OutputSink& out, AgentDoneFn done,
                                const sdk::CancelToken& cancel) {
  json::object body;
  json::array argv;
  for (const auto& arg : command.argv)
    argv.emplace_back(arg);
  body["argv"] = std::move(argv);
  if (!command.env.empty()) {
    json::object envs;
    for (const auto& [key, value] : command.env)
      envs[key] = value;
    body["envs"] = std::move(envs);
  }
  if (command.cwd) body["cwd"] = *command.cwd;
  if (command.user) body["user"] = *command.user;
  if (command.timeout.count() > 0) body["timeout"] = command.timeout.count();

  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.method = "POST";
  request.target = "/command";
  request.unix_socket = socket;
  request.headers = {{"Accept", "application/vnd.sbx.frames"},
                     {"Content-Type", "application/json"}};
  request.body = json::serialize(body);
  request.idle_timeout = kIdleTimeout;
  if (command.timeout.count() > 0) request.timeout = command.timeout + kDeadlineSlack;
  request.idempotent = false;
  const auto run = std::make_shared<AgentRun>(sandbox, out, std::move(done));
  run->start(http_, std::move(request), cancel);
  return AgentCommand([weak = std::weak_ptr<AgentRun>(run)](bool hold) {
    if (auto run = weak.lock()) run->hold(hold);
  });
}

bool AgentClient::ping(const std::string& socket, std::chrono::milliseconds timeout) {
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.target = "/ping";
  request.unix_socket = socket;
  request.timeout = timeout;
  try {
    return http_.send(std::move(request)).status == 200;
  } catch (const sdk::Error&) {
    return false;
  }
}

namespace {

// The agent's error answer ({"code", "message"}) as an sdk::Error about `what`.
sdk::Error file_error(long status, const std::string& body, const std::string& what) {
  std::string code, message = body.substr(0, 512);
  try {
    const json::object answer = json::parse(body).as_object();
    code = json_field(answer, "code");
    message = json_field(answer, "message");
  } catch (const std::exception&) {
  }
  const std::string text = what + ": " + message;
  if (status == 404) return sdk::Error::not_found(text);
  // 410 SANDBOX_EXPIRED: the sandbox is gone, its agent about to stop.
  if (status == 410)
    return sdk::Error::sandbox_gone(what + ": the sandbox has expired (" + message + ")");
  if (message.find("ead-only file system") != std::string::npos) {
    return sdk::Error::failed_precondition(what + ": the file system there is read-only (" +
                                           message + ")");
  }
  if (status == 400 || status == 416) return sdk::Error::invalid_argument(text);
  return sdk::Error::internal(what + ": the sandbox's agent answered HTTP " +
                              std::to_string(status) + (code.empty() ? "" : " " + code) + ": " +
                              message);
}

// Waits for `call` to end and gives its response; a transport error is `what`'s.
sdk::http::Response finish(const sdk::http::Call& call, const std::string& what) {
  try {
    return call.get();
  } catch (const sdk::Error& e) {
    throw sdk::Error(e.status(), what + ": " + e.what(), e.details());
  }
}

}  // namespace

void AgentClient::upload(const std::string& socket, const std::string& sandbox,
                         const std::string& path, uint32_t mode, sdk::ByteSource& source,
                         const sdk::CancelToken& cancel) {
  const std::string what = "cannot upload " + path + " into sandbox " + sandbox;
  if (source.size() < 0) throw sdk::Error::invalid_argument("the upload's size is negative");
  sdk::http::Multipart multipart;
  char digits[8];  // the mode as octal digits, sent as a decimal number (0644 is 644)
  const auto end = std::to_chars(digits, digits + sizeof digits, mode & 07777, 8).ptr;
  multipart.add({.name = "metadata",
                 .filename = "metadata",
                 .content_type = "application/json",
                 .bytes = json::serialize(json::object{
                     {"path", path}, {"mode", std::stoll(std::string(digits, end))}})});
  multipart.add(
      {.name = "file",
       .filename = "file",
       .content_type = "application/octet-stream",
       // Never read past the declared size (a host's stream may fail there rather than end).
       .source =
           [&source, left = static_cast<uint64_t>(source.size())](char* buffer,
                                                                  size_t capacity) mutable {
             const size_t n =
                 left == 0 ? 0 : source.read(buffer, std::min<uint64_t>(capacity, left));
             left -= n;
             return n;
           },
       .size = source.size()});
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.method = "POST";
  request.target = "/files/upload";
  request.unix_socket = socket;
  request.push_body = true;
  request.idle_timeout = kIdleTimeout;
  request.idempotent = false;
  multipart.prepare_push(request);
  // Chunked, not Content-Length: an upload that cannot finish ends its body early, and the agent
  // answers once it has removed its temp file, where a dropped connection would leave the removal
  // racing this call's return.
  request.body_size = -1;
  const sdk::http::Call call = http_.start(std::move(request));
  std::optional<sdk::Error> abandoned;  // why the body was ended early: the source failed
  {
    // A cancellation ends the body where it is (a write waiting for room returns).
    std::stop_callback on_cancel(cancel, [&call] { call.finish_body(); });
    std::string buffer(256 * 1024, '\0');
    try {
      for (;;) {
        const size_t n = multipart.read(buffer.data(), buffer.size());
        if (n == 0 || call.write_body({buffer.data(), n}) < n) break;
      }
    } catch (const sdk::Error& e) {
      abandoned = e;
    } catch (const std::exception& e) {
      abandoned = sdk::Error::internal(std::string("the upload's source failed: ") + e.what());
    }
    call.finish_body();
  }
  sdk::http::Response response;
  try {
    response = finish(call, what);
  } catch (const sdk::Error&) {
    if (abandoned) throw *abandoned;
    sdk::throw_if_cancelled(cancel);
    throw;
  }
  if (response.status == 200) return;  // in place, even if a cancellation came after the end
  if (abandoned) throw *abandoned;
  sdk::throw_if_cancelled(cancel);
  throw file_error(response.status, response.body, what);
}

void AgentClient::download(const std::string& socket, const std::string& sandbox,
                           const std::string& path, sdk::ByteSink& sink,
                           const sdk::CancelToken& cancel) {
  const std::string what = "cannot download " + path + " from sandbox " + sandbox;
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.target = "/files/download?path=" + sdk::http::url_encode(path);
  request.unix_socket = socket;
  request.idle_timeout = kIdleTimeout;
  // Pulled on this thread: a slow sink slows this download only, never the loop.
  request.pull_body_limit = 1024 * 1024;
  // The status and the declared length, known before the body: its bytes are the file's or an
  // error answer, and a file's are never more than declared (nothing endless reaches the sink).
  struct Head {
    std::atomic<long> status{0};
    std::atomic<int64_t> length{-1};
  };
  auto head = std::make_shared<Head>();
  request.on_headers = [head](long code, const sdk::http::Headers& headers) {
    for (const auto& [name, value] : headers) {
      if (name.size() != 14 || strcasecmp(name.c_str(), "content-length") != 0) continue;
      int64_t length = -1;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), length);
      if (ec == std::errc() && end == value.data() + value.size()) head->length.store(length);
    }
    head->status.store(code);
  };
  const sdk::http::Call call = http_.start(std::move(request));
  std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
  std::string chunk, error_body;
  uint64_t delivered = 0;
  for (bool done = false; !done;) {
    done = call.read_body(chunk, std::chrono::steady_clock::time_point::max());
    if (chunk.empty()) continue;
    if (head->status.load() == 200) {
      const int64_t length = head->length.load();
      if (length < 0 || delivered + chunk.size() > static_cast<uint64_t>(length)) {
        call.cancel();
        throw sdk::Error::internal(
            what + ": its agent answered " +
            (length < 0 ? std::string("without a Content-Length")
                        : "more than the " + std::to_string(length) + " bytes it declared"));
      }
      try {
        if (delivered == 0) sink.expect_size(static_cast<uint64_t>(length));
        sink.write(chunk);
      } catch (...) {
        call.cancel();  // the host refused the bytes: nobody reads the rest
        throw;
      }
      delivered += chunk.size();
    } else if (error_body.size() < 64 * 1024) {
      error_body += chunk;
    }
  }
  sdk::http::Response response;
  try {
    response = finish(call, what);
  } catch (const sdk::Error&) {
    sdk::throw_if_cancelled(cancel);
    throw;
  }
  if (response.status != 200) throw file_error(response.status, error_body, what);
  const std::string declared = response.header("content-length");
  int64_t length = -1;
  std::from_chars(declared.data(), declared.data() + declared.size(), length);
  if (length < 0 || delivered != static_cast<uint64_t>(length)) {
    throw sdk::Error::internal(what + ": " + std::to_string(delivered) + " of " +
                               std::to_string(length) + " bytes arrived");
  }
  if (length == 0) sink.expect_size(0);  // an empty file: said, with no write to come before
}

bool AgentClient::runs_as_root(const std::string& socket, const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.target = "/files/info?path=" + sdk::http::url_encode(std::string(kAgentSocket));
  request.unix_socket = socket;
  request.timeout = std::chrono::milliseconds(10'000);
  const sdk::http::Call call = http_.start(std::move(request));
  std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
  const sdk::http::Response response = finish(call, "asking the sandbox's agent its user");
  if (response.status != 200) {
    throw file_error(response.status, response.body, "asking the sandbox's agent its user");
  }
  try {
    const json::value answer = json::parse(response.body);
    return json_field(answer.as_object().at(kAgentSocket).as_object(), "owner") == "0";
  } catch (const std::exception& e) {
    throw sdk::Error::internal(std::string("the sandbox's agent described its socket badly: ") +
                               e.what());
  }
}

std::string AgentClient::open_pty(const std::string& socket, const std::string& body,
                                  const sdk::CancelToken& cancel) {
  const std::string what = "cannot open a terminal";
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.method = "POST";
  request.target = "/pty";
  request.unix_socket = socket;
  request.body = body;
  request.headers = {{"Content-Type", "application/json"}};
  request.timeout = std::chrono::milliseconds(10'000);
  const sdk::http::Response response = http_.send(std::move(request), cancel);
  if (response.status == 503) {
    throw sdk::Error(SBX_STATUS_RESOURCE_EXHAUSTED, what + ": " + json_message(response.body));
  }
  if (response.status != 200) throw file_error(response.status, response.body, what);
  try {
    return json_field(json::parse(response.body).as_object(), "session_id");
  } catch (const std::exception& e) {
    throw sdk::Error::internal(what + ": the sandbox's agent answered badly: " + e.what());
  }
}

void AgentClient::delete_pty(const std::string& socket, const std::string& id,
                             const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.max_body_bytes = kMaxAnswerBytes;
  request.method = "DELETE";
  request.target = "/pty/" + sdk::http::url_encode(id);
  request.unix_socket = socket;
  request.timeout = std::chrono::milliseconds(10'000);
  const sdk::http::Response response = http_.send(std::move(request), cancel);
  if (response.status != 200) {
    throw file_error(response.status, response.body, "cannot close terminal " + id);
  }
}

}  // namespace sbx::local_docker
