// The server: listening, connections (one strand each), authentication, request ids, limits and
// the graceful stop (server.hpp). The routes are in routes_*.cpp.

#include "faults.hpp"
#include "state.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <stdexcept>
#include <thread>

#include <unistd.h>

namespace sbx::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

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
      sweep_timer(control) {}

void Server::State::maybe_finish_locked() {
  if (!stopping || finished || !creating.empty() || closing != 0 || answering != 0) return;
  finished = true;
  asio::post(control, [this] {
    grace_timer.cancel();
    ioc.stop();
  });
}

namespace {

// One connection: reads requests one after the other (keep-alive), answers each in order.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Server::State> state, tcp::socket socket)
      : state_(std::move(state)), stream_(std::move(socket)) {}

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(state_->options.header_limit));
    parser_->body_limit(state_->options.body_limit);
    stream_.expires_after(state_->options.read_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    const bool limit = ec == http::error::header_limit || ec == http::error::body_limit;
    if (!ec || limit) {  // a request to answer: a stop waits for the answer (write() counts down)
      std::lock_guard lock(state_->mutex);
      ++state_->answering;
    }
    if (limit) {
      // The rest of the request is not read: answer and close.
      Request request;
      request.version(11);
      const bool header = ec == http::error::header_limit;
      request_id_ = new_request_id();
      Response r =
          header ? error_response(request, http::status::request_header_fields_too_large,
                                  "GENERAL::REQUEST_HEADER_TOO_LARGE",
                                  "Request headers exceed " +
                                      std::to_string(state_->options.header_limit) + " bytes.")
                 : error_response(request, http::status::payload_too_large,
                                  "GENERAL::REQUEST_TOO_LARGE",
                                  "Request body exceeds " +
                                      std::to_string(state_->options.body_limit) + " bytes.");
      r.keep_alive(false);
      write(std::move(r));
      return;
    }
    if (ec) {  // end of stream, a reset, a slow client's timeout, a malformed request line
      if (ec != http::error::end_of_stream && ec != beast::error::timeout &&
          ec != asio::error::connection_reset && ec != asio::error::operation_aborted) {
        spdlog::debug("sbx serve: dropping a connection: {}", ec.message());
      }
      close();
      return;
    }
    stream_.expires_never();  // a provider call may take long; the read timeout is for clients
    handle(parser_->release());
  }

  void handle(Request request) {
    const auto id = request.find("X-Request-ID");
    request_id_ = id != request.end() && !id->value().empty() && id->value().size() <= 256
                      ? std::string(id->value())
                      : new_request_id();
    keep_alive_ = request.keep_alive();
    auto self = shared_from_this();
    auto request_ptr = std::make_shared<const Request>(std::move(request));
    // The strand is copied here, on it: the reply may come from a plugin thread.
    Reply reply = [self, request_ptr, strand = stream_.get_executor()](Response response) {
      asio::post(strand, [self, r = std::move(response)]() mutable { self->write(std::move(r)); });
    };
    const Request& req = *request_ptr;
    spdlog::debug("sbx serve: {} {} (request {})", std::string(req.method_string()),
                  std::string(req.target()), request_id_);
    route(request_ptr, reply, true);
  }

  // Authentication, then (with `faults`) the fault plan, then the route groups; an exception
  // becomes 500 GENERAL::UNKNOWN_ERROR. A delayed request comes back here without `faults`.
  void route(const std::shared_ptr<const Request>& request_ptr, const Reply& reply, bool faults) {
    const Request& req = *request_ptr;
    try {
      if (!authorized(req, reply)) return;
      // Fault injection (faults.hpp), when the config file has a plan: may answer, reset or delay.
      if (faults && state_->options.faults && inject_fault(request_ptr, reply)) return;
      if (route_health(state_, req, reply)) return;
      if (route_lifecycle(state_, req, reply)) return;
      if (route_sandbox_ops(state_, req, reply)) return;
      reply(json_response(req, http::status::not_found,
                          boost::json::object{{"detail", "Not Found"}}));
    } catch (const std::exception& e) {
      spdlog::error("sbx serve: {} {}: {}", std::string(req.method_string()),
                    std::string(req.target()), e.what());
      reply(error_response(req, http::status::internal_server_error, "GENERAL::UNKNOWN_ERROR",
                           e.what()));
    }
  }

  // Asks the fault plan for this request's action: answers it (status), aborts the connection
  // (reset) or routes it after a wait (delay) and returns true; false to route it now.
  bool inject_fault(const std::shared_ptr<const Request>& request, const Reply& reply) {
    const auto key = route_key(std::string(request->method_string()), route_path(*request));
    if (!key) return false;
    std::optional<std::chrono::system_clock::time_point> created_at;
    if (!key->sandbox_id.empty()) {
      std::lock_guard lock(state_->mutex);
      if (auto it = state_->sandboxes.find(key->sandbox_id); it != state_->sandboxes.end())
        created_at = it->second->created_at;
    }
    const auto action = state_->options.faults->take(*key, created_at);
    if (!action) return false;
    switch (action->kind) {
      case FaultAction::Kind::status:
        reply(error_response(*request, static_cast<http::status>(action->status), action->code,
                             action->message));
        return true;
      case FaultAction::Kind::reset:
        reset();
        return true;
      case FaultAction::Kind::delay: {
        auto timer = std::make_shared<asio::steady_timer>(stream_.get_executor());
        timer->expires_after(action->delay);
        timer->async_wait([self = shared_from_this(), timer, request, reply](beast::error_code) {
          self->route(request, reply, false);
        });
        return true;
      }
      case FaultAction::Kind::cut_after_events:  // taken by the stream code (stream_cut)
      case FaultAction::Kind::pass:
        return false;
    }
    return false;
  }

  // Aborts the connection without an answer: SO_LINGER 0 makes the close send an RST.
  void reset() {
    beast::error_code ignored;
    stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
    stream_.socket().close(ignored);
    std::lock_guard lock(state_->mutex);
    --state_->answering;  // counted when the request was read; it gets no answer
    state_->maybe_finish_locked();
  }

  // OPEN-SANDBOX-API-KEY when a key is configured; /health is exempt, as on the real server.
  bool authorized(const Request& request, const Reply& reply) {
    if (!state_->options.api_key || route_path(request) == "/health") return true;
    const auto key = request.find("OPEN-SANDBOX-API-KEY");
    if (key == request.end() || key->value().empty()) {
      reply(error_response(request, http::status::unauthorized, "MISSING_API_KEY",
                           "Authentication credentials are missing. Provide API key via "
                           "OPEN-SANDBOX-API-KEY header."));
      return false;
    }
    if (!constant_time_equal(std::string(key->value()), *state_->options.api_key)) {
      reply(error_response(request, http::status::unauthorized, "INVALID_API_KEY",
                           "Authentication credentials are invalid. Check your API key and try "
                           "again."));
      return false;
    }
    return true;
  }

  void write(Response response) {
    response.set("x-request-id", request_id_);
    bool stopping = false;
    {
      std::lock_guard lock(state_->mutex);
      stopping = state_->stopping;
    }
    if (!keep_alive_ || stopping) response.keep_alive(false);
    spdlog::debug("sbx serve: answered {} (request {})", response.result_int(), request_id_);
    auto held = std::make_shared<Response>(std::move(response));
    http::async_write(stream_, *held,
                      [self = shared_from_this(), held](beast::error_code ec, std::size_t) {
                        {
                          std::lock_guard lock(self->state_->mutex);
                          --self->state_->answering;
                          self->state_->maybe_finish_locked();
                        }
                        if (ec || !held->keep_alive()) {
                          self->close();
                          return;
                        }
                        self->read();
                      });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  std::shared_ptr<Server::State> state_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string request_id_;
  bool keep_alive_ = true;
};

void accept(const std::shared_ptr<Server::State>& state) {
  state->acceptor.async_accept(
      asio::make_strand(state->ioc), [state](beast::error_code ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
        if (ec) {
          // E.g. out of file descriptors: try again a little later rather than spin.
          spdlog::warn("sbx serve: accept failed: {}", ec.message());
          auto timer = std::make_shared<asio::steady_timer>(state->control);
          timer->expires_after(std::chrono::milliseconds(100));
          timer->async_wait([state, timer](beast::error_code) { accept(state); });
          return;
        }
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

Server::Server(sbx::Provider provider, Options options)
    : state_(std::make_shared<State>(std::move(provider), std::move(options))) {
  const Options& o = state_->options;
  const std::string host = o.host == "localhost" ? "127.0.0.1" : o.host;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) throw std::invalid_argument("--listen needs an IP address, got '" + o.host + "'");
  if (!address.is_loopback() && !o.api_key) {
    throw std::invalid_argument("refusing to listen on " + o.host +
                                " without an API key: anyone who can reach it could run "
                                "commands (give --api-key-env VAR, or listen on 127.0.0.1)");
  }
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
  const tcp::endpoint endpoint(address, o.port);
  state_->acceptor.open(endpoint.protocol());
  state_->acceptor.set_option(asio::socket_base::reuse_address(true));
  state_->acceptor.bind(endpoint);
  state_->acceptor.listen(asio::socket_base::max_listen_connections);
  state_->port = state_->acceptor.local_endpoint().port();
  // Only once the address is bound: a server that cannot start must not touch the sandboxes.
  if (o.state_dir) store_load(*state_);
}

Server::~Server() {
  // run() returned (or never ran): nothing is in flight on the io_context's threads. Sandboxes
  // still in the registry (a server that never ran) are closed by their destructors, or left
  // running for the next server with keep_on_stop.
  std::lock_guard lock(state_->mutex);
  if (state_->options.keep_on_stop) {
    for (auto& [id, entry] : state_->sandboxes)
      if (entry->box) entry->box->detach();
    for (auto& entry : state_->kept)
      if (entry->box) entry->box->detach();
  }
  if (state_->state_dir_lock >= 0) ::close(state_->state_dir_lock);
  state_->state_dir_lock = -1;
}

uint16_t Server::port() const {
  return state_->port;
}

bool Server::run() {
  auto state = state_;
  std::optional<asio::signal_set> signals;
  if (state->options.handle_signals) {
    signals.emplace(state->ioc, SIGINT, SIGTERM);
    signals->async_wait([this](beast::error_code ec, int signal) {
      if (ec) return;
      spdlog::info("sbx serve: signal {}: stopping", signal);
      stop();
    });
  }
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
  std::lock_guard lock(state->mutex);
  return state->all_closed;
}

void Server::stop() {
  auto state = state_;
  std::vector<std::shared_ptr<Entry>> to_close;
  std::vector<sbx::Operation<sbx::Sandbox>> to_cancel;
  std::size_t kept = 0;
  {
    std::lock_guard lock(state->mutex);
    if (state->stopping) return;
    state->stopping = true;
    for (auto& [id, entry] : state->sandboxes) {
      if (state->options.keep_on_stop) {
        // Left running, its state file kept for the next server; detached once run() returned
        // (~Server), when no request can be using it.
        state->kept.push_back(entry);
        ++kept;
      } else {
        to_close.push_back(entry);
      }
    }
    state->sandboxes.clear();
    for (auto& [ticket, op] : state->creating)
      if (op.valid()) to_cancel.push_back(op);
    state->closing += static_cast<int>(to_close.size());
  }
  asio::post(state->control, [state] {
    beast::error_code ignored;
    state->acceptor.close(ignored);
    state->sweep_timer.cancel();
    state->grace_timer.expires_after(state->options.grace);
    state->grace_timer.async_wait([state](beast::error_code ec) {
      if (ec) return;  // cancelled: everything closed in time
      std::lock_guard lock(state->mutex);
      if (state->finished) return;
      state->finished = true;
      state->all_closed = false;
      spdlog::warn(
          "sbx serve: the grace period passed with {} sandbox(es) still closing and {} "
          "create(s) in flight",
          state->closing, state->creating.size());
      state->ioc.stop();
    });
  });
  spdlog::info("sbx serve: closing {} sandbox(es), keeping {}", to_close.size(), kept);
  for (auto& op : to_cancel)
    op.cancel();
  for (auto& entry : to_close) {
    store_remove(*state, entry->id);
    begin_close(state, entry, [](std::exception_ptr) {});
  }
  std::lock_guard lock(state->mutex);
  state->maybe_finish_locked();
}

void begin_close(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
                 std::function<void(std::exception_ptr)> done) {
  sbx::Operation<void> op;
  try {
    op = entry->box->close_async();
  } catch (...) {
    const auto error = std::current_exception();
    {
      std::lock_guard lock(state->mutex);
      --state->closing;
      state->maybe_finish_locked();
    }
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
    {
      std::lock_guard lock(state->mutex);
      --state->closing;
      state->maybe_finish_locked();
    }
    done(error);
  });
}

}  // namespace sbx::serve
