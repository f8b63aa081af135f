// An HTTP/1.1 client over libcurl for plugins (target sbx::sdk_http).
//
// One Client owns one libcurl multi handle driven by one event-loop thread, so many requests can be
// in flight on a single thread, connections are kept alive and reused, and every transfer can be
// cancelled or given a deadline. Unix-domain sockets are supported (Docker's /var/run/docker.sock).
//
// THREADING: Client is thread-safe. Request callbacks (on_headers, on_body, body_source and the
// completion) run on the client's loop thread, one at a time; they must not block and must not call
// Call::get()/wait on the same client (that would deadlock the loop). A request started on a client
// that is already closed completes at once, on the calling thread.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::sdk::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct ClientOptions {
  std::string base_url = "http://localhost";  // scheme://host[:port][/prefix], no trailing '/'
  std::string unix_socket;                    // when set, every connection goes through it
  std::chrono::milliseconds connect_timeout{10'000};
  long max_connections = 64;  // cap on open connections (CURLMOPT_MAX_TOTAL_CONNECTIONS)
  std::string user_agent = "sbx";
};

struct Request {
  std::string method = "GET";
  std::string target;  // path and query appended to base_url, e.g. "/v1.41/containers/json"
  Headers headers;
  std::string body;  // request body, unless body_source is set
  // Streamed request body: fills `buffer` with up to `capacity` bytes and returns the count, 0 at
  // the end. Throwing aborts the request with that error. `body_size` is the exact length
  // (sent as Content-Length), or -1 for chunked transfer encoding.
  std::function<size_t(char* buffer, size_t capacity)> body_source;
  int64_t body_size = -1;
  // Whole-request deadline measured from start; 0 = none. Expiry fails with Error::timeout.
  std::chrono::milliseconds timeout{0};
  // Called once when the status line and headers are in, before any body bytes.
  std::function<void(long status, const Headers& headers)> on_headers;
  // Streamed response body: when set, body bytes go here instead of into Response::body.
  // Throwing aborts the request with that error.
  std::function<void(std::string_view bytes)> on_body;
  // Pulled response body, when on_body is unset and this is > 0: body bytes wait in the Call (about
  // this many at most) until Call::read_body takes them, and the transfer pauses while they wait.
  // A slow consumer then slows only its own transfer, where a slow on_body (which runs on the
  // loop thread) would stall every request of the client.
  size_t pull_body_limit = 0;
  // The most a response body kept in Response::body may hold; a larger one fails the request
  // with Error::resource_exhausted, so a peer that never ends its answer cannot eat the memory.
  // Streamed (on_body) and pulled bodies are not kept and not limited. 0 means no limit.
  size_t max_body_bytes = 64 * 1024 * 1024;
};

struct Response {
  long status = 0;
  Headers headers;
  std::string body;  // empty when Request::on_body was set

  // Value of the first header with this name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

namespace detail {
struct CallState;
}

// An in-flight request. Copies share the same request.
class Call {
 public:
  Call() = default;
  explicit Call(std::shared_ptr<detail::CallState> state) : state_(std::move(state)) {}

  // Aborts the transfer; the call then fails with Error::cancelled(). Idempotent, thread-safe,
  // no effect after completion.
  void cancel() const;
  // True once the call has completed (successfully or not).
  bool done() const;
  // Waits for completion; returns false if the deadline passed first.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  // Waits for completion and returns the response, or throws the sdk::Error that ended it.
  // A response with any HTTP status (also 4xx/5xx) is a success here.
  Response get() const;
  // For a pulled body (Request::pull_body_limit): replaces `out` with the body bytes received so
  // far, waiting until there are some, the call is done, or `deadline`. Returns true once the call
  // is done and `out` holds the last of its bytes (get() then gives the outcome). One reader.
  bool read_body(std::string& out, std::chrono::steady_clock::time_point deadline) const;

 private:
  std::shared_ptr<detail::CallState> state_;
};

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();  // cancels what is in flight (each completes with Error::cancelled) and joins the loop
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const noexcept { return options_; }

  // Starts a request. `on_complete` (optional) runs exactly once on the loop thread with the
  // response, or with a null response and the error, before the Call counts as done; exceptions it
  // throws are ignored.
  Call start(Request request,
             std::function<void(Response* response, const Error* error)> on_complete = {});

  // Starts a request and waits for it. Cancellation through `cancel` aborts the transfer and
  // throws Error::cancelled(). Transport failures throw: Error::unavailable (cannot connect, naming
  // the URL or unix socket; or the connection was lost mid-request), Error::timeout (deadline),
  // Error::internal (other curl errors).
  Response send(Request request, const CancelToken& cancel = {});

 private:
  struct Loop;
  ClientOptions options_;
  std::unique_ptr<Loop> loop_;
};

// Percent-encodes a query parameter value or path segment (RFC 3986 unreserved characters kept).
std::string url_encode(std::string_view text);

}  // namespace sbx::sdk::http
