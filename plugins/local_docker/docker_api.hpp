// The Docker Engine API client: HTTP over the daemon's unix socket (sdk::http::Client), API
// version negotiation, and the mapping of Docker's error responses to sdk::Error.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>
#include <sbx/sdk/http.hpp>
#include <sbx/sdk/log.hpp>

#include <boost/json/object.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::local_docker {

namespace http = sdk::http;

// An Engine API version such as 1.41.
struct ApiVersion {
  int major = 1;
  int minor = 0;

  static std::optional<ApiVersion> parse(std::string_view text);
  std::string text() const { return std::to_string(major) + "." + std::to_string(minor); }
  friend bool operator<(const ApiVersion& a, const ApiVersion& b) {
    return a.major != b.major ? a.major < b.major : a.minor < b.minor;
  }
};

// 1.40 (Docker 19.03) brought DeviceRequests; 1.47 is Docker 27. A newer daemon still serves 1.47.
inline constexpr ApiVersion kOldestApi{1, 40};
inline constexpr ApiVersion kNewestApi{1, 47};

// A request timeout for transfers that take as long as their data does (archives): effectively
// none; cancellation bounds them instead.
inline constexpr std::chrono::milliseconds kNoTimeout = std::chrono::hours(24 * 365);

struct ApiOptions {
  std::string socket;
  std::optional<std::string> api_version;  // pinned; otherwise negotiated at first use
  std::chrono::milliseconds request_timeout{60'000};
  long max_connections = 64;
};

// THREADING: thread-safe; the calls block the calling thread (except start()), never while holding
// a lock of this object.
class DockerApi {
 public:
  DockerApi(ApiOptions options, sdk::Logger log);

  const std::string& socket() const noexcept { return options_.socket; }
  std::chrono::milliseconds request_timeout() const noexcept { return options_.request_timeout; }

  // "/v1.41" + target, negotiating the version on first use: concurrent first callers share one
  // GET /version in flight (bounded by the request timeout), each waiting with its own
  // cancellation; a failed negotiation fails all who waited for it and is not remembered.
  std::string versioned(std::string_view target, const sdk::CancelToken& cancel);

  // Sends a request under the negotiated version and waits for it. A response with any status is
  // returned; transport failures throw (UNAVAILABLE naming the socket when the daemon is not
  // there). `request.timeout` 0 means the configured request timeout.
  http::Response send(http::Request request, const sdk::CancelToken& cancel);

  // send() plus error mapping: a status >= 400 throws api_error(response, what).
  http::Response call(std::string method, std::string target, std::string body,
                      std::string_view what, const sdk::CancelToken& cancel,
                      std::chrono::milliseconds timeout = {});

  // Starts a streaming request under the negotiated version (no default timeout). The callbacks
  // of `request` run on the client's loop thread.
  http::Call start(http::Request request, const sdk::CancelToken& cancel);
  // Waits for a started call; throws like send().
  http::Response finish(const http::Call& call) const;

 private:
  std::string version(const sdk::CancelToken& cancel);
  struct Negotiated {
    std::string api;     // the version to speak, "1.41"
    std::string engine;  // the daemon's, for the log: Docker "20.10.24" speaking API "1.41"
    std::string daemon_api;
  };
  // From the daemon's answer to GET /version; throws when there is no version to speak.
  Negotiated choose_version(const http::Response& response) const;
  sdk::Error unreachable(const sdk::Error& cause) const;

  ApiOptions options_;
  sdk::Logger log_;
  http::Client client_;
  std::mutex version_mutex_;               // guards the three below; never held across a request
  std::string version_;                    // "1.41" once known
  std::optional<http::Call> negotiation_;  // GET /version in flight
  uint64_t negotiation_number_ = 0;        // which one negotiation_ is
};

// Where a streamed response body goes: to `feed` when the status is 200; for any other status the
// first 64 KiB are kept as the daemon's error text (for api_error). attach() wires a request to it
// (the request must not outlive it); a pulled body (Request::pull_body_limit) is passed to route()
// by whoever reads it.
class BodyRouter {
 public:
  explicit BodyRouter(std::function<void(std::string_view)> feed) : feed_(std::move(feed)) {}
  void attach(http::Request& request);
  void route(std::string_view bytes);
  const std::string& error_body() const noexcept { return error_body_; }

 private:
  std::function<void(std::string_view)> feed_;
  std::atomic<long> status_{0};  // set on the client's loop thread, read where the body is routed
  std::string error_body_;
};

// Docker's error text from a response body ({"message": "..."}), else the raw body, shortened.
std::string docker_message(std::string_view body);

// Maps a Docker error response to an sdk::Error: 400 INVALID_ARGUMENT, 401/403 PERMISSION_DENIED,
// 404 NOT_FOUND, 409 FAILED_PRECONDITION, 5xx UNAVAILABLE (502-504) or INTERNAL, both retryable.
// The message is "<what>: <docker message>"; http_status is set.
sdk::Error api_error(long status, std::string_view body, std::string_view what);

// Parses a JSON object response body; throws INTERNAL naming `what` when it is not one.
boost::json::object parse_body(std::string_view body, std::string_view what);

// Shortens text for messages and logs.
std::string shorten(std::string_view text, size_t limit = 500);

}  // namespace sbx::local_docker
