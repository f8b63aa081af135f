// The server: listening, connections (one strand each), authentication, request ids, limits and
// the graceful stop (server.hpp). The routes are in routes_*.cpp.

#include "faults.hpp"
#include "routes.hpp"
#include "state.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <boost/asio/local/stream_protocol.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <sys/inotify.h>
#include <unistd.h>

namespace sbx::serve {

namespace {
// The most of an upload's body read at once (and handed to the provider in one write).
constexpr std::size_t kUploadChunk = 256 * 1024;
// The most of a stream's waiting pieces written at once.
constexpr std::size_t kBatchBytes = 256 * 1024;
}  // namespace

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A server's temp dir holds `.lock`, flock'ed for as long as the server lives (the kernel lets
// go of it when the process dies, kill -9 included). It is made under another name and renamed
// once locked, so that a sweep never sees it unlocked. The descriptor, kept open.
int lock_temp_dir(const std::filesystem::path& dir) {
  const std::string making = (dir / ".lock.new").string();
  const int fd = ::open(making.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0 ||
      ::rename(making.c_str(), (dir / ".lock").c_str()) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot lock the temp dir " + dir.string() + ": " +
                             std::strerror(err));
  }
  return fd;
}

// Removes the temp dirs under `root` that a server made (sbx-serve-XXXXXX, this user's, a real
// directory holding a `.lock` made as above) and that no living server holds: their server died
// without removing them. Anything else is left alone.
void sweep_temp_dirs(const std::filesystem::path& root) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 16 || name.rfind("sbx-serve-", 0) != 0) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const int fd = ::open((it->path() / ".lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // not one of ours (or of a server too old to lock it)
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its server is gone
      std::error_code ignored;
      const auto removed = std::filesystem::remove_all(it->path(), ignored);
      spdlog::info("sbx serve: removed {} ({} entries) left by a server that did not stop",
                   it->path().string(), removed);
    }
    ::close(fd);
  }
}

}  // namespace

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using stream_protocol = asio::generic::stream_protocol;

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

Server::State::State(sbx::Provider p, Options o)
    : provider(std::move(p)),
      options(std::move(o)),
      control(asio::make_strand(ioc)),
      acceptor(control),
      grace_timer(control),
      sweep_timer(control),
      gate([this] {
        asio::post(control, [this] {
          grace_timer.cancel();
          ioc.stop();
        });
      }) {}

namespace {

// How much of an upload answered before its body was read is still read (and dropped) so that
// the client gets the answer: at most this many bytes, for at most this long.
constexpr std::uint64_t kUploadLingerBytes = 256ull * 1024 * 1024;
constexpr std::chrono::milliseconds kUploadLingerTime{10000};

// One connection: reads requests one after the other (keep-alive), answers each in order. A
// request's head is read first: an upload's body is then consumed as it arrives (BodySink), any
// other body is read whole within Options::body_limit. An answer is one Response (write()) or a
// stream (open_stream(): a head, then pieces as the route produces them).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Server::State> state, stream_protocol::socket socket)
      : state_(std::move(state)), stream_(std::move(socket)) {}

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

  // The stream's side used by StreamSink (any thread).
  void post_send(std::string data, std::function<void()> done) {
    {
      std::lock_guard lock(room_mutex_);
      queued_ += data.size();
    }
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), d = std::move(data), done = std::move(done)]() mutable {
                 self->enqueue(std::move(d), std::move(done));
               });
  }
  void post_end() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->end_requested_ = true;
      self->pump();
    });
  }
  std::size_t queued_bytes() {
    std::lock_guard lock(room_mutex_);
    return queued_;
  }
  // Resets the connection, dropping what waits (ChunkSink::abort).
  void post_abort() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->gone_ || self->finished_) return;
      beast::error_code ignored;
      self->stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
      self->mark_gone();
    });
  }
  // What a socket that became readable (`ec`: how the wait ended) says of the client, peeked at,
  // never read: bytes are a request for read().
  enum class Peer { quiet, sending, gone };
  Peer peek(beast::error_code ec) {
    if (ec) return Peer::gone;
    char c = 0;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return Peer::sending;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Peer::quiet;
    return Peer::gone;  // EOF or a reset
  }

  // WatchHangup: `fn` runs (on the strand) if the peer closes or resets the connection before the
  // request is answered. A readable socket is peeked at, never read: bytes of a pipelined request
  // stay for read() and end the watch.
  void post_watch_hangup(std::function<void()> fn) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (self->answered_) return;
      self->hangup_ = std::move(fn);
      self->watch_hangup();
    });
  }
  void watch_hangup() {
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        asio::bind_executor(
            stream_.get_executor(), [self = shared_from_this()](beast::error_code ec) {
              if (!self->hangup_) return;  // answered meanwhile
              const Peer peer = self->peek(ec);
              if (peer == Peer::quiet) {
                self->watch_hangup();  // not readable after all
                return;
              }
              auto fn = std::move(self->hangup_);
              self->hangup_ = nullptr;
              if (peer == Peer::sending) return;  // the client sends more: it is there
              spdlog::debug("sbx serve: the client of request {} went away before its answer",
                            self->request_id_);
              fn();
            }));
  }
  // TakeConnection: the connection leaves this Session (which then ends with its last handler).
  void post_take_connection(std::function<void(Connection)> fn) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable {
      self->answered_ = true;
      self->hangup_ = nullptr;
      self->state_->metrics.record(self->metrics_route_, 101, seconds_since(self->metrics_start_),
                                   "");
      self->state_->gate.leave_request();
      self->stream_.expires_never();
      if (self->buffer_.size() > 0) {  // a client sends frames only after the 101
        spdlog::debug("sbx serve: {} bytes after an upgrade request are dropped (request {})",
                      self->buffer_.size(), self->request_id_);
      }
      fn(std::move(self->stream_));
    });
  }
  bool gone_flag() {
    std::lock_guard lock(room_mutex_);
    return gone_flag_;
  }
  void post_on_gone(std::function<void()> fn) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (self->gone_) {
        fn();
        return;
      }
      self->on_gone_ = std::move(fn);
    });
  }

 private:
  void read() {
    header_parser_.emplace();
    header_parser_->header_limit(static_cast<std::uint32_t>(state_->options.header_limit));
    header_parser_->body_limit(boost::none);  // judged from the head (on_header)
    stream_.expires_after(state_->options.read_timeout);
    http::async_read_header(
        stream_, buffer_, *header_parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void count_answering() { state_->gate.enter_request(); }

  // A request over a limit: the rest of it is not read; answer and close.
  void refuse_limit(bool header) {
    Request request;
    request.version(11);
    request_id_ = new_request_id();
    Response r =
        header
            ? error_response(request, http::status::request_header_fields_too_large,
                             "GENERAL::REQUEST_HEADER_TOO_LARGE",
                             "Request headers exceed " +
                                 std::to_string(state_->options.header_limit) + " bytes.")
            : error_response(
                  request, http::status::payload_too_large, "GENERAL::REQUEST_TOO_LARGE",
                  "Request body exceeds " + std::to_string(state_->options.body_limit) + " bytes.");
    r.keep_alive(false);
    unread_body_ = !header;
    write(std::move(r));
  }

  void drop(beast::error_code ec) {
    // End of stream, a reset, a slow client's timeout, a malformed request line.
    if (ec != http::error::end_of_stream && ec != beast::error::timeout &&
        ec != asio::error::connection_reset && ec != asio::error::operation_aborted) {
      spdlog::debug("sbx serve: dropping a connection: {}", ec.message());
    }
    close();
  }

  // A head the parser refuses (both Content-Length and Transfer-Encoding, a bad length, a bad
  // field or line): 400 with the reason, then the connection closes (its framing cannot be
  // trusted, so nothing after the head is read).
  void refuse_malformed(beast::error_code ec) {
    Request request;
    request.version(11);
    request_id_ = new_request_id();
    Response r = error_response(request, http::status::bad_request, "GENERAL::BAD_REQUEST",
                                "The request is malformed: " + ec.message() + ".");
    r.keep_alive(false);
    unread_body_ = true;
    write(std::move(r));
  }

  void on_header(beast::error_code ec) {
    if (ec == http::error::header_limit) {  // a request to answer: a stop waits for the answer
      count_answering();
      refuse_limit(true);
      return;
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      count_answering();
      refuse_malformed(ec);
      return;
    }
    if (ec) {
      drop(ec);
      return;
    }
    Request head(header_parser_->get().base());
    begin_request(head);
    // Authentication on the head: a client without a valid key is answered before any of its
    // body is read, and the connection closes (the body is never read, so never held).
    if (auto refusal = auth_refusal(head)) {
      count_answering();
      keep_alive_ = false;
      header_parser_.reset();
      state_->metrics.record(metrics_route_, refusal->result_int(), 0.0, error_type(*refusal));
      unread_body_ = true;
      write(std::move(*refusal));
      return;
    }
    if (match_ && !match_->wrong_method && match_->route->body_handler) {
      count_answering();
      start_upload(std::move(head));
      return;
    }
    const auto length = header_parser_->content_length();
    if (length && *length > state_->options.body_limit) {
      count_answering();
      refuse_limit(false);
      return;
    }
    parser_.emplace(std::move(*header_parser_));
    header_parser_.reset();
    parser_->body_limit(state_->options.body_limit);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {  // a chunked body over the limit
      count_answering();
      refuse_limit(false);
      return;
    }
    if (ec) {
      drop(ec);
      return;
    }
    count_answering();
    stream_.expires_never();  // a provider call may take long; the read timeout is for clients
    handle(parser_->release());
  }

  // A new request, from its head: its id, its route (routes.hpp) and its metrics label.
  void begin_request(const Request& request) {
    match_ = match_route(std::string(request.method_string()), route_path(request));
    metrics_route_ = match_ && !match_->wrong_method ? match_->route->metrics_label() : "other";
    metrics_start_ = std::chrono::steady_clock::now();
    const auto id = request.find("X-Request-ID");
    request_id_ = id != request.end() && !id->value().empty() && id->value().size() <= 256
                      ? std::string(id->value())
                      : new_request_id();
    keep_alive_ = request.keep_alive();
    streaming_ = false;
    answered_ = false;
    hangup_ = nullptr;
  }

  Reply make_reply() {
    // The strand is copied here, on it: the reply may come from a plugin thread.
    return [self = shared_from_this(), strand = stream_.get_executor()](Response response) {
      asio::post(strand, [self, r = std::move(response)]() mutable { self->write(std::move(r)); });
    };
  }

  // The reply to the request begun last: GET /metrics counts its answer, by its route and
  // status, with its latency.
  Reply metered_reply() {
    return [inner = make_reply(), state = state_, route = metrics_route_,
            start = metrics_start_](Response response) {
      state->metrics.record(route, response.result_int(), seconds_since(start),
                            error_type(response));
      inner(std::move(response));
    };
  }

  // A request read whole (begun by on_header).
  void handle(Request request) {
    auto request_ptr = std::make_shared<const Request>(std::move(request));
    const Request& req = *request_ptr;
    spdlog::debug("sbx serve: {} {} (request {})", std::string(req.method_string()),
                  std::string(req.target()), request_id_);
    route(request_ptr, metered_reply(), true);
  }

  // Authentication, then (with `faults`) the fault plan, then the route's handler; an exception
  // becomes 500 GENERAL::UNKNOWN_ERROR. A delayed request comes back here without `faults`.
  void route(const std::shared_ptr<const Request>& request_ptr, const Reply& reply, bool faults) {
    const Request& req = *request_ptr;
    try {
      if (!authorized(req, reply)) return;
      if (faults && fault_taken(req, reply, [self = shared_from_this(), request_ptr, reply] {
            self->route(request_ptr, reply, false);
          })) {
        return;
      }
      dispatch(req, reply);
    } catch (const std::exception& e) {
      spdlog::error("sbx serve: {} {}: {}", std::string(req.method_string()),
                    std::string(req.target()), e.what());
      reply(error_response(req, http::status::internal_server_error, "GENERAL::UNKNOWN_ERROR",
                           e.what()));
    }
  }

  // The request as its handler gets it: an execd path's sandbox (answered 404 when it is unknown,
  // 502 for another port) and the connection's streams. Null after an answer.
  std::optional<Call> call_of(const Request& req, const Reply& reply) {
    Call call{state_, req, reply};
    if (match_) {
      call.sandbox_id = match_->sandbox_id;
      call.params = match_->params;
    }
    if (const auto target = execd_target(req)) {
      call.entry = execd_entry(state_, *target, req, reply);
      if (!call.entry) return std::nullopt;
      call.open_stream = [self = shared_from_this()](Response head, bool chunked) {
        return self->open_stream(std::move(head), chunked);
      };
      call.watch_hangup = [self = shared_from_this()](std::function<void()> fn) {
        self->post_watch_hangup(std::move(fn));
      };
      call.take_connection = [self = shared_from_this()](std::function<void(Connection)> fn) {
        self->post_take_connection(std::move(fn));
      };
    }
    return call;
  }

  // The route's handler, or the answer for a path or method no handler serves: execd's
  // NOT_SUPPORTED on an execd path, else FastAPI's 405 or 404.
  void dispatch(const Request& req, const Reply& reply) {
    const auto call = call_of(req, reply);
    if (!call) return;
    const Route* route = match_ && !match_->wrong_method ? match_->route : nullptr;
    if (route && route->handler) {
      route->handler(*call);
    } else if (call->entry) {
      reply(execd_error(req, http::status::not_found, "NOT_SUPPORTED",
                        "sbx serve does not serve execd's " + std::string(req.method_string()) +
                            " " + execd_target(req)->rest));
    } else if (match_ && match_->wrong_method) {
      reply(method_not_allowed(req));
    } else {
      reply(json_response(req, http::status::not_found,
                          boost::json::object{{"detail", "Not Found"}}));
    }
  }

  // The fault plan's action for the request begun last (faults.hpp), when the config file has a
  // plan: answers it (status), aborts the connection (reset) or calls `again` after the wait
  // (delay), and returns true; false to serve it now.
  bool fault_taken(const Request& request, const Reply& reply, std::function<void()> again) {
    if (!state_->options.faults) return false;
    const auto key = route_key(match_);
    if (!key) return false;
    std::optional<std::chrono::system_clock::time_point> created_at;
    if (!key->sandbox_id.empty()) {
      if (const auto entry = state_->registry.find(key->sandbox_id)) created_at = entry->created_at;
    }
    const auto action = state_->options.faults->take(*key, created_at);
    if (!action) return false;
    switch (action->kind) {
      case FaultAction::Kind::status:
        if (action->short_body) {
          short_answer(action->status,
                       error_response(request, static_cast<http::status>(action->status),
                                      action->code, action->message)
                           .body());
          return true;
        }
        reply(error_response(request, static_cast<http::status>(action->status), action->code,
                             action->message));
        return true;
      case FaultAction::Kind::reset:
        reset();
        return true;
      case FaultAction::Kind::delay: {
        auto timer = std::make_shared<asio::steady_timer>(stream_.get_executor());
        timer->expires_after(action->delay);
        timer->async_wait([timer, again = std::move(again)](beast::error_code) { again(); });
        return true;
      }
      case FaultAction::Kind::cut_after_events:  // taken by the stream code (stream_cut)
      case FaultAction::Kind::pass:
        return false;
    }
    return false;
  }

  // Answers `status` with `body` under a Content-Length 100 bytes longer, then closes the
  // connection: the client sees an error answer whose body breaks off.
  void short_answer(int status, std::string body) {
    auto bytes = std::make_shared<std::string>(
        "HTTP/1.1 " + std::to_string(status) + " Error\r\nContent-Type: application/json\r\n" +
        "Content-Length: " + std::to_string(body.size() + 100) + "\r\nConnection: close\r\n\r\n" +
        body);
    asio::async_write(stream_.socket(), asio::buffer(*bytes),
                      [self = shared_from_this(), bytes](beast::error_code, std::size_t) {
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(asio::socket_base::shutdown_both, ignored);
                        self->stream_.socket().close(ignored);
                        self->state_->gate.leave_request();
                      });
  }

  // Aborts the connection without an answer: SO_LINGER 0 makes the close send an RST.
  void reset() {
    beast::error_code ignored;
    stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
    stream_.socket().close(ignored);
    state_->gate.leave_request();  // counted when the request was read; it gets no answer
  }

  // OPEN-SANDBOX-API-KEY when a key is configured; /health is exempt, as on the real server. A
  // sandbox's execd paths take the X-EXECD-ACCESS-TOKEN its endpoint handed out: the direct ones
  // only that (the key never goes to a sandbox endpoint), the server-proxy ones that or the key
  // (the Python SDK sends an endpoint's headers and never the key to execd; the JS SDK sends the
  // key).
  // The answer to a request without valid credentials (checked on its head alone), or nullopt
  // when it may go on: /health is open; execd paths take their sandbox's X-EXECD-ACCESS-TOKEN
  // (the server-proxy paths also the API key); every other path the API key.
  std::optional<Response> auth_refusal(const Request& request) const {
    if (!state_->options.api_key || route_path(request) == "/health") return std::nullopt;
    if (const auto target = execd_target(request)) {
      const auto token = request.find("X-EXECD-ACCESS-TOKEN");
      if (token != request.end() &&
          constant_time_equal(std::string(token->value()),
                              execd_access_token(state_->options, target->sandbox_id))) {
        return std::nullopt;
      }
      if (!target->server_proxy) {
        return json_response(
            request, http::status::unauthorized,
            boost::json::object{
                {"error", "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}});
      }
    }
    const auto key = request.find("OPEN-SANDBOX-API-KEY");
    if (key == request.end() || key->value().empty()) {
      return error_response(request, http::status::unauthorized, "MISSING_API_KEY",
                            "Authentication credentials are missing. Provide API key via "
                            "OPEN-SANDBOX-API-KEY header.");
    }
    if (!constant_time_equal(std::string(key->value()), *state_->options.api_key)) {
      return error_response(request, http::status::unauthorized, "INVALID_API_KEY",
                            "Authentication credentials are invalid. Check your API key and try "
                            "again.");
    }
    return std::nullopt;
  }

  bool authorized(const Request& request, const Reply& reply) {
    auto refusal = auth_refusal(request);
    if (!refusal) return true;
    reply(std::move(*refusal));
    return false;
  }

  bool stopping() { return state_->gate.stopping(); }

  void write(Response response) {
    answered_ = true;
    hangup_ = nullptr;
    response.set("x-request-id", request_id_);
    if (!keep_alive_ || stopping()) response.keep_alive(false);
    spdlog::debug("sbx serve: answered {} (request {})", response.result_int(), request_id_);
    if (upload_) {  // answered before the upload's body was read to its end
      upload_.reset();
      response.keep_alive(false);
    }
    auto held = std::make_shared<Response>(std::move(response));
    http::async_write(stream_, *held,
                      [self = shared_from_this(), held](beast::error_code ec, std::size_t) {
                        self->state_->gate.leave_request();
                        if (!ec && self->unread_body_) {
                          self->linger_close();
                          return;
                        }
                        if (ec || !held->keep_alive()) {
                          self->close();
                          return;
                        }
                        self->read();
                      });
  }

  // After an answer given before the request's body was read: closing a socket with unread bytes
  // resets the connection, and a reset can make the client's kernel drop the answer before the
  // client read it. So the sending side is shut, and what the client still sends is read into a
  // small scratch buffer and dropped (never kept), for a bounded time and amount, then the socket
  // closes.
  // An upload's body may be long: it gets up to kUploadLingerBytes and kUploadLingerTime.
  void linger_close() {
    unread_body_ = false;
    beast::error_code ignored;
    stream_.socket().shutdown(asio::socket_base::shutdown_send, ignored);
    const bool upload = linger_bytes_ > 0;
    stream_.expires_after(std::min<std::chrono::milliseconds>(
        state_->options.read_timeout, upload ? kUploadLingerTime : std::chrono::seconds(2)));
    linger_left_ =
        (upload ? linger_bytes_ : state_->options.body_limit) + state_->options.header_limit;
    linger_bytes_ = 0;
    linger_read();
  }
  void linger_read() {
    stream_.async_read_some(asio::buffer(linger_buffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              if (ec || n >= self->linger_left_) {
                                self->stream_.close();
                                return;
                              }
                              self->linger_left_ -= n;
                              self->linger_read();
                            });
  }

  // --- uploads: the body read as it arrives -------------------------------------------------

  // `faults`: ask the fault plan first (false when a delay brings the upload back here).
  void start_upload(Request head, bool faults = true) {
    Reply reply = metered_reply();
    spdlog::debug("sbx serve: {} {} (request {}, streamed body)", std::string(head.method_string()),
                  std::string(head.target()), request_id_);
    keep_alive_ = false;  // an upload refused before its body is read leaves the body unread
    // Answered before its body is read (a sandbox gone, a refusal, a failed file): the client,
    // which sends the whole body before it reads (httpx, curl), must still get the answer; the
    // body is read and dropped (linger_close), up to its length and kUploadLingerBytes.
    unread_body_ = true;
    const auto length = header_parser_ ? header_parser_->content_length() : boost::none;
    linger_bytes_ =
        std::min<std::uint64_t>(length.value_or(kUploadLingerBytes), kUploadLingerBytes);
    if (!authorized(head, reply)) return;
    if (faults && fault_taken(head, reply, [self = shared_from_this(), head]() mutable {
          self->start_upload(std::move(head), false);
        })) {
      return;
    }
    std::shared_ptr<BodySink> sink;
    try {
      if (auto call = call_of(head, reply)) sink = match_->route->body_handler(*call);
    } catch (const std::exception& e) {
      reply(execd_error(head, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
      return;
    }
    if (!sink) return;
    keep_alive_ = head.keep_alive();
    upload_ = sink;
    body_parser_.emplace(std::move(*header_parser_));
    header_parser_.reset();
    body_parser_->body_limit(boost::none);
    const auto expect = head.find(http::field::expect);
    if (expect != head.end() && beast::iequals(expect->value(), "100-continue")) {
      // curl asks before sending a large body; answer at once rather than let it wait.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue),
                        [self = shared_from_this()](beast::error_code ec, std::size_t) {
                          if (ec) {
                            self->on_upload_read(ec);
                            return;
                          }
                          self->read_upload();
                        });
      return;
    }
    read_upload();
  }

  void read_upload() {
    auto& p = *body_parser_;
    if (p.is_done()) {
      stream_.expires_never();
      unread_body_ = false;
      auto sink = std::move(upload_);
      upload_.reset();
      sink->finish();
      return;
    }
    // Only connections that upload: the body's buffer, and room in the connection's buffer, whose
    // free space is what Beast asks the socket for (at least 512 bytes: an empty buffer made every
    // read 512 bytes, a syscall and a provider write each; issue 35).
    if (upload_buffer_.empty()) {
      upload_buffer_.resize(kUploadChunk);
      buffer_.reserve(kUploadChunk);
    }
    p.get().body().data = upload_buffer_.data();
    p.get().body().size = upload_buffer_.size();
    stream_.expires_after(state_->options.read_timeout);  // an idle client, not a slow one
    http::async_read_some(stream_, buffer_, p,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) {
                            self->on_upload_read(ec);
                          });
  }

  void on_upload_read(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    if (!upload_) return;  // answered already (write() dropped it)
    if (ec) {
      spdlog::debug("sbx serve: an upload's body was cut: {}", ec.message());
      unread_body_ = false;  // nothing more comes
      auto sink = std::move(upload_);
      upload_.reset();
      sink->abort();
      Request shape;
      shape.version(11);
      keep_alive_ = false;
      write(execd_error(shape, http::status::bad_request, "INVALID_FILE_CONTENT",
                        "the request body ended early: " + ec.message()));
      return;
    }
    const std::size_t n = upload_buffer_.size() - body_parser_->get().body().size;
    auto sink = upload_;
    if (n > 0 && !sink->write(std::string_view(upload_buffer_.data(), n))) return;
    if (upload_) read_upload();
  }

  // --- streamed answers -----------------------------------------------------------------------

  class StreamSink final : public ChunkSink {
   public:
    explicit StreamSink(std::shared_ptr<Session> s) : s_(std::move(s)) {}
    void send(std::string data, std::function<void()> done) override {
      s_->post_send(std::move(data), std::move(done));
    }
    void end() override { s_->post_end(); }
    std::size_t queued() const override { return s_->queued_bytes(); }
    void abort() override { s_->post_abort(); }
    bool gone() const override { return s_->gone_flag(); }
    void on_gone(std::function<void()> fn) override { s_->post_on_gone(std::move(fn)); }
    void cut_after(int pieces) override {
      asio::post(s_->stream_.get_executor(), [s = s_, pieces] { s->cut_after_ = pieces; });
    }
    void never_stall() override {
      asio::post(s_->stream_.get_executor(), [s = s_] { s->stall_never_ = true; });
    }

   private:
    std::shared_ptr<Session> s_;
  };

  // Any thread: what follows runs on the strand, before anything sent through the sink.
  std::shared_ptr<ChunkSink> open_stream(Response head, bool chunked) {
    state_->metrics.record(metrics_route_, head.result_int(), seconds_since(metrics_start_),
                           error_type(head));
    {
      std::lock_guard lock(room_mutex_);
      gone_flag_ = false;
      queued_ = 0;
    }
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), h = std::move(head), chunked]() mutable {
                 self->begin_stream(std::move(h), chunked);
               });
    return std::make_shared<StreamSink>(shared_from_this());
  }

  // A write's bound: the stall timeout, or none for a stream whose producer a slow client holds.
  void arm_stall() {
    if (stall_never_) {
      stream_.expires_never();
    } else {
      stream_.expires_after(state_->options.stream_stall_timeout);
    }
  }

  void begin_stream(Response head, bool chunked) {
    stall_never_ = false;
    answered_ = true;
    hangup_ = nullptr;
    streaming_ = true;
    chunked_ = chunked;
    end_requested_ = ended_ = gone_ = finished_ = false;
    on_gone_ = nullptr;
    cut_after_.reset();
    head.set("x-request-id", request_id_);
    if (!keep_alive_ || stopping()) head.keep_alive(false);
    keep_alive_ = head.keep_alive();
    auto res = std::make_shared<http::response<http::empty_body>>(std::move(head.base()));
    if (chunked) res->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    writing_ = true;
    arm_stall();
    http::async_write_header(
        stream_, *sr, [self = shared_from_this(), res, sr](beast::error_code ec, std::size_t) {
          self->writing_ = false;
          self->stream_.expires_never();
          if (ec) {
            self->mark_gone();
            return;
          }
          self->pump();
        });
    if (chunked) watch();
  }

  // A wait while a chunked stream is open: the client's EOF or reset means it went away. The
  // socket is peeked at, never read (as watch_hangup): a client that sends its next request
  // before this answer ended is there, and the request stays for read() once the stream is over
  // (the connection is kept alive after a stream, as execd's; a client then gone is seen by the
  // stream's next write failing).
  void watch() {
    watching_ = true;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        asio::bind_executor(stream_.get_executor(),
                            [self = shared_from_this()](beast::error_code ec) {
                              self->watching_ = false;
                              if (self->finished_) {
                                if (std::exchange(self->read_after_watch_, false)) self->read();
                                return;
                              }
                              const Peer peer = self->peek(ec);
                              if (peer == Peer::quiet) {
                                self->watch();  // not readable after all
                                return;
                              }
                              if (peer == Peer::gone) self->mark_gone();
                              // Peer::sending: its next request, left for read(); the client is
                              // there.
                            }));
  }

  void enqueue(std::string data, std::function<void()> done) {
    if (gone_ || ended_) {
      release(data.size());
      if (done) done();
      return;
    }
    out_.emplace_back(std::move(data), std::move(done));
    pump();
  }

  void release(std::size_t n) {
    {
      std::lock_guard lock(room_mutex_);
      queued_ -= n;
    }
  }

  void pump() {
    if (writing_ || gone_ || finished_) return;
    if (cut_after_ && *cut_after_ <= 0) {  // an injected network cut, right after the Nth piece
      spdlog::info("sbx serve: cutting a stream (fault injection, request {})", request_id_);
      cut_after_.reset();
      ::linger l{1, 0};
      ::setsockopt(stream_.socket().native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
      mark_gone();
      return;
    }
    if (out_.empty()) {
      if (!end_requested_ || ended_) return;
      ended_ = true;
      if (!chunked_) {
        finish_stream();
        return;
      }
      writing_ = true;
      arm_stall();
      asio::async_write(stream_, http::make_chunk_last(),
                        [self = shared_from_this()](beast::error_code ec, std::size_t) {
                          self->writing_ = false;
                          self->stream_.expires_never();
                          if (ec) {
                            self->mark_gone();
                            return;
                          }
                          self->finish_stream();
                        });
      return;
    }
    if (cut_after_) {  // an injected cut counts pieces: one at a time
      --*cut_after_;
      write_items(1);
      return;
    }
    write_items(out_.size());
  }

  // Writes up to `most` waiting pieces in one write: a command's events come in bursts (its
  // init, its lines, its end), and a write each was a syscall and a strand hop each. A chunked
  // body gets them as one chunk, followed by the last chunk when the stream's end was asked and
  // nothing else waits. Their `done`s run once the write is over.
  void write_items(std::size_t most) {
    std::size_t n = 0, bytes = 0;
    while (n < out_.size() && n < most && (n == 0 || bytes + out_[n].first.size() <= kBatchBytes)) {
      bytes += out_[n].first.size();
      ++n;
    }
    const bool last = chunked_ && n == out_.size() && end_requested_ && !cut_after_;
    writing_ = true;
    writing_items_ = n;
    if (last) ended_ = true;
    arm_stall();
    auto on_written = [self = shared_from_this(), n, last](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      self->writing_items_ = 0;
      self->stream_.expires_never();
      for (std::size_t i = 0; i < n; ++i) {
        auto item = std::move(self->out_.front());
        self->out_.pop_front();
        self->release(item.first.size());
        if (item.second) item.second();
      }
      if (ec) {
        self->mark_gone();
        return;
      }
      if (last) {
        self->finish_stream();
        return;
      }
      self->pump();
    };
    if (!chunked_ && n == 1) {
      asio::async_write(stream_, asio::buffer(out_.front().first), std::move(on_written));
      return;
    }
    batch_.clear();
    if (chunked_) {
      char size[24];
      const int len = std::snprintf(size, sizeof size, "%zx\r\n", bytes);
      batch_.append(size, static_cast<std::size_t>(len));
    }
    for (std::size_t i = 0; i < n; ++i)
      batch_ += out_[i].first;
    if (chunked_) batch_ += last ? "\r\n0\r\n\r\n" : "\r\n";
    asio::async_write(stream_, asio::buffer(batch_), std::move(on_written));
  }

  void mark_gone() {
    if (gone_ || finished_) return;
    gone_ = true;
    {
      std::lock_guard lock(room_mutex_);
      gone_flag_ = true;
    }
    // What waits is dropped; the items being written stay until their write completes.
    while (out_.size() > (writing_ ? writing_items_ : 0u)) {
      auto item = std::move(out_.back());
      out_.pop_back();
      release(item.first.size());
      if (item.second) item.second();
    }
    if (auto fn = std::move(on_gone_)) {
      on_gone_ = nullptr;
      fn();
    }
    finish_stream();
  }

  void finish_stream() {
    if (finished_) return;
    finished_ = true;
    state_->gate.leave_request();
    if (gone_ || !keep_alive_ || stopping()) {
      close();
      return;
    }
    streaming_ = false;
    if (watching_) {  // the watch's handler reads the next request once it is cancelled
      read_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    read();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(asio::socket_base::shutdown_send, ignored);
    stream_.close();
  }

  std::shared_ptr<Server::State> state_;
  beast::basic_stream<stream_protocol> stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> header_parser_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request_parser<http::buffer_body>> body_parser_;
  std::shared_ptr<BodySink> upload_;
  std::vector<char> upload_buffer_;  // kUploadChunk once the connection uploads
  std::string request_id_;
  std::optional<RouteMatch> match_;  // the route of the request being answered
  std::string metrics_route_;        // its label, for RequestMetrics
  std::chrono::steady_clock::time_point metrics_start_;
  bool keep_alive_ = true;
  bool unread_body_ = false;        // the answer being written leaves the request's body unread
  std::size_t linger_left_ = 0;     // bytes linger_close() still drops before closing
  std::uint64_t linger_bytes_ = 0;  // an upload's body left to drop (0: not an upload)

  // The stream being answered (strand only, but for what room_mutex_ guards).
  bool streaming_ = false;
  bool chunked_ = false;
  bool writing_ = false;
  bool end_requested_ = false;
  bool ended_ = false;
  bool gone_ = false;
  bool finished_ = false;
  std::deque<std::pair<std::string, std::function<void()>>> out_;
  std::function<void()> on_gone_;
  std::optional<int> cut_after_;            // pieces left before an injected cut
  bool stall_never_ = false;                // never_stall(): no write timeout for this stream
  std::size_t writing_items_ = 0;           // pieces of out_ the write under way carries
  std::string batch_;                       // those pieces as one write
  std::array<char, 1024> linger_buffer_{};  // what linger_close() reads, dropped
  bool watching_ = false;                   // watch() waits on the socket
  bool read_after_watch_ = false;  // the stream ended: the watch's handler reads the next request
  // The request being answered (strand only): whether its answer started, and what runs if the
  // client goes away before (WatchHangup).
  bool answered_ = false;
  std::function<void()> hangup_;
  std::mutex room_mutex_;  // guards what follows
  std::size_t queued_ = 0;
  bool gone_flag_ = false;
};

// A client's TCP connection: keepalive, as a command's stream has no write timeout (its output is
// held while the client reads slowly), so a peer that vanished is found this way, in about 2 min;
// and no Nagle delay: the server batches its writes itself, and a stream's head and first events
// are separate writes that Nagle held until the client's delayed ACK (40 ms on a kept-alive
// connection).
void tune_tcp(stream_protocol::socket& socket) {
  const int fd = socket.native_handle();
  int family = 0;
  socklen_t len = sizeof family;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &len) != 0 ||
      (family != AF_INET && family != AF_INET6)) {
    return;  // a unix socket: its peer's end is seen at once
  }
  const int on = 1, idle = 60, interval = 10, count = 6;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

void accept(const std::shared_ptr<Server::State>& state) {
  state->acceptor.async_accept(
      asio::make_strand(state->ioc), [state](beast::error_code ec, stream_protocol::socket socket) {
        if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
        if (ec) {
          // E.g. out of file descriptors: try again a little later rather than spin.
          spdlog::warn("sbx serve: accept failed: {}", ec.message());
          auto timer = std::make_shared<asio::steady_timer>(state->control);
          timer->expires_after(std::chrono::milliseconds(100));
          timer->async_wait([state, timer](beast::error_code) { accept(state); });
          return;
        }
        tune_tcp(socket);
        std::make_shared<Session>(state, std::move(socket))->start();
        accept(state);
      });
}

// Every second, on the control strand: close the sandboxes whose TTL passed (registry.cpp).
void sweep(const std::shared_ptr<Server::State>& state) {
  state->sweep_timer.expires_after(std::chrono::seconds(1));
  state->sweep_timer.async_wait([state](beast::error_code ec) {
    if (ec) return;  // cancelled: the server stops
    retire_expired(state);
    sweep(state);
  });
}

}  // namespace

Server::State::SocketFile::~SocketFile() {
  struct ::stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == device &&
      st.st_ino == inode) {
    ::unlink(path.c_str());
  }
}

namespace {

// Binds `acceptor` to the unix socket `path` with `mode` and starts listening; records the file
// in `state.socket_file`. An existing socket file is replaced only when nobody listens on it.
void listen_unix(Server::State& state, const std::filesystem::path& path, unsigned mode) {
  const std::string where = "unix socket " + path.string();
  if (path.string().size() >= sizeof(sockaddr_un::sun_path)) {
    throw std::runtime_error("cannot listen on " + where + ": its path is " +
                             std::to_string(path.string().size()) +
                             " bytes, and a unix socket's holds at most " +
                             std::to_string(sizeof(sockaddr_un::sun_path) - 1));
  }
  struct ::stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw std::runtime_error("refusing to listen on " + where +
                               ": the path exists and is not a socket (remove it first)");
    }
    // A socket: a server that listens on it answers a connect; a stale one (its server died)
    // refuses it and may go.
    asio::io_context probe_context;
    asio::local::stream_protocol::socket probe(probe_context);
    boost::system::error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(path.string()), ec);
    if (!ec)
      throw std::runtime_error("refusing to listen on " + where + ": a server listens on it");
    if (ec != asio::error::connection_refused) {
      throw std::runtime_error("refusing to listen on " + where + ": " + ec.message());
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw std::runtime_error("cannot remove the stale " + where + ": " + std::strerror(errno));
    }
  } else if (errno != ENOENT) {
    throw std::runtime_error("cannot use " + where + ": " + std::strerror(errno));
  }
  const stream_protocol::endpoint endpoint{asio::local::stream_protocol::endpoint(path.string())};
  state.acceptor.open(endpoint.protocol());
  state.acceptor.bind(endpoint);
  if (::lstat(path.c_str(), &st) != 0) {
    throw std::runtime_error("cannot stat " + where + ": " + std::strerror(errno));
  }
  state.socket_file.emplace(path, st.st_dev, st.st_ino);
  // Before listen(): until then no client can connect, whatever the umask gave the file.
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    throw std::runtime_error("cannot chmod " + where + ": " + std::strerror(errno));
  }
  state.acceptor.listen(asio::socket_base::max_listen_connections);
}

}  // namespace

Server::Server(sbx::Provider provider, Options options)
    : state_(std::make_shared<State>(std::move(provider), std::move(options))) {
  const Options& o = state_->options;
  if (o.threads < 1) throw std::invalid_argument("threads must be at least 1");
  if (o.keep_on_stop && !o.state_dir) {
    throw std::invalid_argument(
        "keeping sandboxes at a stop needs a state directory, or the next server could not "
        "find them again");
  }
  if (o.state_dir && !state_->provider.supports("sbx.connect/1")) {
    throw std::invalid_argument("provider '" + state_->provider.name() +
                                "' cannot connect to existing sandboxes (sbx.connect/1), which "
                                "a state directory needs");
  }
  if (o.socket_mode > 0777) throw std::invalid_argument("the socket mode must be at most 0777");
  if (o.unix_socket) {
    if (o.unix_socket->empty()) throw std::invalid_argument("the unix socket path is empty");
    listen_unix(*state_, *o.unix_socket, o.socket_mode);
  } else {
    const std::string host = o.host == "localhost" ? "127.0.0.1" : o.host;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    if (ec) throw std::invalid_argument("--listen needs an IP address, got '" + o.host + "'");
    if (!address.is_loopback() && !o.api_key) {
      throw std::invalid_argument("refusing to listen on " + o.host +
                                  " without an API key: anyone who can reach it could run "
                                  "commands (give --api-key-env VAR, or listen on 127.0.0.1)");
    }
    const tcp::endpoint tcp_endpoint(address, o.port);
    const stream_protocol::endpoint endpoint(tcp_endpoint);
    state_->acceptor.open(endpoint.protocol());
    state_->acceptor.set_option(asio::socket_base::reuse_address(true));
    state_->acceptor.bind(endpoint);
    state_->acceptor.listen(asio::socket_base::max_listen_connections);
    state_->port = 0;
    ::sockaddr_storage bound{};
    ::socklen_t size = sizeof bound;
    if (::getsockname(state_->acceptor.native_handle(), reinterpret_cast<::sockaddr*>(&bound),
                      &size) == 0) {
      state_->port = ntohs(bound.ss_family == AF_INET6
                               ? reinterpret_cast<const ::sockaddr_in6*>(&bound)->sin6_port
                               : reinterpret_cast<const ::sockaddr_in*>(&bound)->sin_port);
    }
  }
  // The private temp dir: command logs and uploads on their way. Those of servers that died
  // without removing theirs (kill -9) go first.
  const std::filesystem::path temp_root = o.temp_root.empty()
                                              ? std::filesystem::temp_directory_path()
                                              : std::filesystem::path(o.temp_root);
  sweep_temp_dirs(temp_root);
  std::string pattern = (temp_root / "sbx-serve-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) {
    throw std::runtime_error("cannot make a temp dir like " + pattern + ": " +
                             std::strerror(errno));
  }
  state_->temp_dir = pattern;
  state_->temp_dir_lock = lock_temp_dir(state_->temp_dir);
  // Only once the address is bound: a server that cannot start must not touch the sandboxes.
  if (o.state_dir) store_load(*state_);
  // With Options::admin the host hands out the provider (its current generation) at each use:
  // holding this one would keep its generation, and its plugin image, alive after a reload.
  if (o.admin && o.admin->provider) state_->provider = sbx::Provider();
  if (o.handle_signals) {
    state_->signals.emplace(state_->ioc, SIGINT, SIGTERM);
    if (o.admin) state_->hangups.emplace(state_->ioc, SIGHUP);
  }
  if (o.admin && o.admin->watched) {  // --watch: fails here, before anything is served
    state_->watch_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (state_->watch_fd < 0) {
      throw std::runtime_error(std::string("--watch: inotify_init1 failed: ") +
                               std::strerror(errno));
    }
  }
}

Server::~Server() {
  // run() returned (or never ran): nothing is in flight on the io_context's threads. Sandboxes
  // still in the registry (a server that never ran) are closed by their destructors, or left
  // running for the next server with keep_on_stop. Reloads queued or running finish first (their
  // plugin code is not interrupted, and a move must not swap a handle being detached here).
  stop_admin(*state_);
  if (state_->options.keep_on_stop) {
    for (const auto& entry : state_->registry.snapshot())
      if (const auto box = entry->box()) box->detach();
    for (const auto& entry : state_->registry.kept())
      if (const auto box = entry->box()) box->detach();
  }
  if (state_->state_dir_lock >= 0) ::close(state_->state_dir_lock);
  state_->state_dir_lock = -1;
  if (state_->watch_fd >= 0) ::close(state_->watch_fd);  // run() never took it
  state_->watch_fd = -1;
  {
    beast::error_code ignored;
    state_->acceptor.close(ignored);
  }
  state_->socket_file.reset();  // the unix socket file it made, if still its own
  std::error_code ignored;
  std::filesystem::remove_all(state_->temp_dir, ignored);
  if (state_->temp_dir_lock >= 0) ::close(state_->temp_dir_lock);  // after: nobody sweeps it
  state_->temp_dir_lock = -1;
  // The handlers still queued hold the state: destroy them (a continuation a plugin completes
  // later may still hold it; the state then goes with that continuation).
  state_->ioc.shutdown();
}

uint16_t Server::port() const {
  return state_->port;
}

Options::Limits Server::limits() const {
  return state_->limits.get();
}

void Server::set_limits(const Options::Limits& limits) {
  state_->limits.set(limits);
}

bool Server::run() {
  auto state = state_;
  if (state->signals) {
    state->signals->async_wait([this](beast::error_code ec, int signal) {
      if (ec) return;
      spdlog::info("sbx serve: signal {}: stopping", signal);
      stop();
    });
  }
  // SIGHUP: a reload, as POST /admin/reload (its outcome is logged).
  if (state->hangups) {
    struct OnHangup {
      std::shared_ptr<State> state;
      asio::signal_set* set;
      void operator()(beast::error_code ec, int) const {
        if (ec) return;
        spdlog::info("sbx serve: SIGHUP: reloading");
        start_reload(state, std::nullopt, [](bool, boost::json::object) {});
        set->async_wait(*this);
      }
    };
    state->hangups->async_wait(OnHangup{state, &*state->hangups});
  }
  if (state->watch_fd >= 0) start_watch(state);
  asio::post(state->control, [state] {
    accept(state);
    sweep(state);
  });
  std::vector<std::thread> threads;
  for (int i = 1; i < state->options.threads; ++i)
    threads.emplace_back([state] { state->ioc.run(); });
  state->ioc.run();
  for (auto& t : threads)
    t.join();
  // The signals' default actions again: a second Ctrl-C during the exit's clean-up ends it.
  state->signals.reset();
  state->hangups.reset();
  return state->gate.all_closed();
}

namespace {

// The stop's first step (on the control strand): running commands get up to the grace period to
// finish; then what still runs is cancelled and the sandboxes are closed, within another grace
// period.
void drain_then_close(const std::shared_ptr<Server::State>& state,
                      std::vector<std::shared_ptr<Entry>> to_close,
                      std::chrono::steady_clock::time_point deadline) {
  const int running = state->gate.running_commands();
  if (running > 0 && std::chrono::steady_clock::now() < deadline) {
    auto timer = std::make_shared<asio::steady_timer>(state->control);
    timer->expires_after(std::chrono::milliseconds(50));
    timer->async_wait(
        [state, timer, to_close = std::move(to_close), deadline](beast::error_code) mutable {
          drain_then_close(state, std::move(to_close), deadline);
        });
    return;
  }
  if (running > 0) spdlog::warn("sbx serve: cancelling {} command(s) still running", running);
  // Left running for the next server, without this one's commands.
  for (auto& entry : state->registry.kept())
    shutdown_execd(*entry->execd);
  state->grace_timer.expires_after(state->options.grace);
  state->grace_timer.async_wait([state](beast::error_code ec) {
    if (ec) return;  // cancelled: everything closed in time
    const auto left = state->gate.give_up();
    if (!left) return;
    spdlog::warn(
        "sbx serve: the grace period passed with {} sandbox(es) still closing and {} "
        "create(s) in flight",
        left->closing, left->creating);
    state->ioc.stop();
  });
  spdlog::info("sbx serve: closing {} sandbox(es)", to_close.size());
  for (auto& entry : to_close) {
    store_remove(*state, *entry);
    begin_close(state, entry, [](std::exception_ptr) {});
  }
  state->gate.finish_if_done();
}

}  // namespace

void Server::stop() {
  auto state = state_;
  // The registry first, then the gate (state.hpp): the first stop() takes the sandboxes (to close,
  // or kept with keep_on_stop, detached once run() returned, by ~Server), and counts them as
  // closes in the step that makes the server stop.
  auto taken = state->registry.close(state->options.keep_on_stop);
  if (!taken) return;  // stopping already
  std::vector<std::shared_ptr<Entry>> to_close = std::move(taken->to_close);
  const std::size_t kept = taken->kept;
  state->gate.stop(static_cast<int>(to_close.size()));
  for (auto& op : taken->creates)
    op.cancel();
  // A reload hung in plugin code is abandoned now: its request is answered (a refusal) and the
  // stop does not wait for the plugin (nor for the grace period, counting that request).
  if (state->options.admin && state->options.admin->stop_reloads) {
    state->options.admin->stop_reloads();
  }
  spdlog::info("sbx serve: stopping: {} sandbox(es) to close, {} to keep", to_close.size(), kept);
  asio::post(state->control, [state, to_close = std::move(to_close)]() mutable {
    beast::error_code ignored;
    state->acceptor.close(ignored);
    state->sweep_timer.cancel();
    drain_then_close(state, std::move(to_close),
                     std::chrono::steady_clock::now() + state->options.grace);
  });
}

void begin_close(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
                 std::function<void(std::exception_ptr)> done) {
  shutdown_execd(*entry->execd);  // its commands are cancelled, their records and logs freed
  sbx::Operation<void> op;
  try {
    op = entry->box()->close_async();
  } catch (...) {
    const auto error = std::current_exception();
    state->gate.end_close();
    done(error);
    return;
  }
  op.then([state, entry, done = std::move(done)](sbx::Operation<void>& finished) {
    std::exception_ptr error;
    try {
      finished.get();
    } catch (...) {
      error = std::current_exception();
      spdlog::warn("sbx serve: closing sandbox {} failed: {}", entry->id,
                   sbx::to_error(error).what());
    }
    state->gate.end_close();
    done(error);
  });
}

}  // namespace sbx::serve
