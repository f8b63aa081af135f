// An HTTP/1.1 client over libcurl for plugins (target sbx::sdk_http).
//
// One Client owns one libcurl multi handle driven by one event-loop thread, so many requests can be
// in flight on a single thread, connections are kept alive and reused, and every transfer can be
// cancelled or given a deadline. Unix-domain sockets are supported (Docker's /var/run/docker.sock).
//
// THREADING: Client is thread-safe. Request callbacks (on_headers, on_body, body_source and the
// completion) run on the client's loop thread, one at a time; they must not block and must not call
// Call::get()/wait on the same client (that would deadlock the loop). A request started on a client
// that is already closed completes at once, on the calling thread. A body that comes from a slow
// producer (a pipe, another request) is pushed from the producer's own thread instead
// (Request::push_body, Call::write_body), so it never stalls the loop.
//
// ERRORS: Client::send() and Call::get() throw sdk::Error. Transport failures are classified:
//   - Error::unavailable, retryable: could not connect (nothing was sent), or the connection was
//     lost on an idempotent request (GET, HEAD, PUT, DELETE, OPTIONS, or Request::idempotent).
//   - Error::unavailable with may_have_run() true and retryable() false: the connection was lost
//     after a non-idempotent request (POST, PATCH) was (possibly) sent. The server may have acted
//     on it; repeating it blindly may do the work twice.
//   - Error::timeout: the request deadline or the idle timeout passed; also may_have_run() and not
//     retryable when the request was non-idempotent and already sent.
//   - Error::unavailable, not retryable: TLS failed (handshake, or the peer's certificate did not
//     verify, naming the endpoint); Error::invalid_argument: a TLS file that cannot be used.
//   - Error::resource_exhausted: a kept body over Request::max_body_bytes, or an answer whose
//     status line and headers together pass kMaxHeaderBytes (a peer that never ends its head).
//   - Error::internal: a 200 or a mismatched 206 to a Request::range; other curl errors.
// An idle pooled connection the server closed is not an error: an idempotent request that failed
// on a reused connection before any response byte arrived is sent once more on a new connection.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::sdk::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The most an answer's head (status line and header lines, 1xx heads included) may take.
inline constexpr size_t kMaxHeaderBytes = 256 * 1024;

// How a Client connects. Read once, by the constructor; the Client keeps its own copy.
struct ClientOptions {
  std::string base_url = "http://localhost";  // scheme://host[:port][/prefix], no trailing '/'
  std::string unix_socket;                    // when set, every connection goes through it
  // false: every unix socket of this client (this one, or a request's) is reached without
  // following a symbolic link anywhere in its path, and must be a socket (sbx/sdk/unix_socket.hpp:
  // for sockets in directories that someone you do not trust can write to, such as a sandbox's).
  // A path that does not hold fails the request with Error::unavailable, not retryable, naming
  // what was found there. Give such paths in canonical form.
  bool unix_socket_follow_links = true;
  std::chrono::milliseconds connect_timeout{10'000};  // TCP connect and TLS handshake
  long max_connections = 64;  // cap on open connections (CURLMOPT_MAX_TOTAL_CONNECTIONS)
  // Cap on idle connections kept for reuse (CURLMOPT_MAXCONNECTS); -1: max_connections.
  long max_idle_connections = -1;
  std::string user_agent = "sbx";

  // A kept-alive connection idle this long is closed instead of reused (libcurl keeps them 118 s,
  // but many servers, e.g. uvicorn after about 5 s, close idle sockets themselves, and a request
  // sent on such a socket fails). libcurl counts whole seconds: the value is rounded down to whole
  // seconds, at least 1. 0 means never reuse a connection (a new one per request).
  std::chrono::milliseconds keepalive_expiry{3'000};
  // Sent with every request, under the request's own headers: a request header of the same name
  // (case-insensitive) replaces the default one.
  Headers default_headers;

  // TLS (https:// URLs). The peer's certificate and host name are verified by default against
  // the system's CA store, or against `ca_bundle` (a PEM file) when set. `client_cert` and
  // `client_key` (PEM files) authenticate this client to a server that asks for it.
  std::string ca_bundle;
  std::string client_cert;
  std::string client_key;
  // Turns certificate and host name verification off: anyone on the path can read and change
  // the traffic. For test servers with throw-away certificates only.
  bool insecure_skip_verify = false;

  // Proxy policy. By default no proxy is used for any transfer, whatever the environment says
  // (libcurl alone would honour http_proxy, https_proxy, all_proxy and no_proxy). `proxy`
  // ("http://host:port", "socks5h://host:port") sends every TCP transfer through that proxy;
  // `use_env_proxy` lets the environment variables decide, as curl does. Unix sockets never
  // use a proxy.
  std::string proxy;
  bool use_env_proxy = false;
};

// A byte range to ask for (Request::range): bytes [start, end], end inclusive; no end means to
// the end of the resource.
struct ByteRange {
  uint64_t start = 0;
  std::optional<uint64_t> end;
  // The resource's total size when the caller knows it; a 206 naming another total fails.
  std::optional<uint64_t> total;
};

struct Request {
  std::string method = "GET";
  std::string target;  // path and query appended to base_url, e.g. "/v1.41/containers/json"
  // When set, this request connects through this unix socket instead of
  // ClientOptions::unix_socket (one client, one loop thread, for many sockets: a kept-alive
  // connection is reused only for the same socket).
  std::string unix_socket;
  Headers headers;
  std::string body;  // request body, unless body_source is set
  // Streamed request body, pulled on the loop thread: fills `buffer` with up to `capacity` bytes
  // and returns the count, 0 at the end. It must not block (a slow source stalls every transfer
  // of the client; use push_body for those). Throwing aborts the request with that error.
  // `body_size` is the exact length (sent as Content-Length), or -1 for chunked transfer encoding.
  std::function<size_t(char* buffer, size_t capacity)> body_source;
  int64_t body_size = -1;
  // Pushed request body: the caller writes it from any thread through Call::write_body and ends
  // it with Call::finish_body (or fails it with Call::fail_body). At most `push_buffer_limit`
  // bytes wait in the Call; a writer blocks while the buffer is full, and the transfer pauses
  // while it is empty, so a slow producer slows only its own request. `body_size` as above.
  bool push_body = false;
  size_t push_buffer_limit = 256 * 1024;
  // Whole-request deadline measured from start; 0 = none. Expiry fails with Error::timeout.
  std::chrono::milliseconds timeout{0};
  // Idle timeout, for event streams and long downloads: fails with Error::timeout when no byte
  // is received or sent for this long once the connection is up (the connect timeout covers the
  // time before). A stream that keeps trickling lives on. Time the transfer spends paused by the
  // caller (an unread pulled body, an empty pushed body) does not count. 0 = none.
  std::chrono::milliseconds idle_timeout{0};
  // Whether repeating the request is harmless. Unset: by method (GET, HEAD, PUT, DELETE,
  // OPTIONS and TRACE are; POST and PATCH are not). Decides the retry on a stale reused
  // connection and whether a lost connection is retryable or "may have run" (see ERRORS).
  std::optional<bool> idempotent;
  // Asks for a byte range (sends "Range: bytes=start-[end]") and checks the answer before any
  // body byte is delivered: a 206 must carry a Content-Range with the same start, an end no later
  // than the one asked for (earlier only at the end of the resource) and, when `total` is set, the
  // same total. A 200 means the server ignored the range: the request fails (Error::internal)
  // rather than hand over the whole resource as if it were the range. Other statuses (416, 404,
  // ...) are responses as usual.
  std::optional<ByteRange> range;
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
  // The most a response body kept in Response::body may hold, whatever the status (error bodies
  // included); a larger one fails the request with Error::resource_exhausted, so a peer that
  // never ends its answer cannot eat the memory. Streamed (on_body) and pulled bodies are not kept
  // and not limited. 0 means no limit.
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

  // For a streamed body (Request::on_body), from any thread, also from inside on_body: holds
  // (true) or releases (false) its reception. While held, no more body bytes reach on_body (the
  // bytes of the read under way may still) and the transfer stops reading its connection, so the
  // peer's writes wait. Time held does not count as idle (Request::idle_timeout); the request's
  // deadline (Request::timeout) still runs. Idempotent.
  void hold_receive(bool hold) const;

  // For a pushed body (Request::push_body), from any thread but the client's loop: queues
  // `bytes`, waiting while the call's buffer is full. Returns how many bytes were queued: all of
  // them, or fewer when the call ended first (get() then gives the outcome) or `deadline` passed.
  // One writer at a time.
  size_t write_body(std::string_view bytes, std::chrono::steady_clock::time_point deadline =
                                                std::chrono::steady_clock::time_point::max()) const;
  // Ends a pushed body: the request completes once the queued bytes are sent. A write_body waiting
  // for room returns (with what it queued). Idempotent.
  void finish_body() const;
  // Aborts a pushed body: the request fails with `error` (the first one given wins).
  void fail_body(Error error) const;

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

  // Runs `fn` once on the loop thread after `delay` (a retry's backoff between requests, without
  // a thread waiting for it). When the client is destroyed first, every pending `fn` runs at once
  // during the destruction, and a request it starts then completes with Error::cancelled. `fn`
  // must not block; exceptions it throws are ignored. Thread-safe.
  void after(std::chrono::milliseconds delay, std::function<void()> fn);

 private:
  struct Loop;
  ClientOptions options_;
  std::unique_ptr<Loop> loop_;
};

// A multipart/form-data body (RFC 7578) built from parts and streamed: the parts' bytes are not
// copied into one buffer. The boundary is 32 random hex digits. Not thread-safe; it is read from
// one thread at a time (the loop thread once attached, or the pump's thread).
class Multipart {
 public:
  // A part's bytes come from `source` when it is set (as Request::body_source: fill up to
  // `capacity`, return the count, 0 at the end; `size` is its exact length or -1 when unknown),
  // else from `bytes`.
  struct Part {
    std::string name;
    std::string filename;      // omitted from Content-Disposition when empty
    std::string content_type;  // omitted when empty
    std::string bytes;
    std::function<size_t(char* buffer, size_t capacity)> source;
    int64_t size = -1;
  };

  Multipart();
  void add(Part part);
  const std::string& boundary() const noexcept { return boundary_; }
  std::string content_type() const;  // "multipart/form-data; boundary=..."
  // The exact encoded length, or -1 when a streamed part's size is unknown (then chunked).
  int64_t size() const;
  // Fills `buffer` with the next encoded bytes; 0 at the end. A source that gives more or fewer
  // bytes than its declared size throws Error::invalid_argument.
  size_t read(char* buffer, size_t capacity);

  // Makes this multipart the request's body, pulled on the loop thread (sources must not block):
  // sets body_source, body_size and the Content-Type header.
  static void attach(Request& request, Multipart multipart);
  // For a request with push_body: sets the Content-Type header and body_size only; then
  // pump() writes the body from the caller's thread, where sources may block.
  void prepare_push(Request& request) const;
  // Writes the whole body into `call` (Call::write_body) and finishes it, or fails the body with
  // what a source threw (and rethrows it). Returns false when the call ended first.
  bool pump(const Call& call);

 private:
  std::string boundary_;
  std::vector<Part> parts_;
  size_t index_ = 0;     // part being read
  int stage_ = 0;        // 0 part head, 1 part data, 2 part tail; closing after the last part
  std::string pending_;  // encoded framing bytes not yet handed out
  size_t pending_at_ = 0;
  uint64_t part_read_ = 0;
  bool closed_ = false;
};

// Percent-encodes a query parameter value or path segment (RFC 3986 unreserved characters kept).
std::string url_encode(std::string_view text);

}  // namespace sbx::sdk::http
