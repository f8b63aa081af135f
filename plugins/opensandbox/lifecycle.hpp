// The OpenSandbox lifecycle API (the control plane, {server}/v1/sandboxes...) over the SDK's
// HTTP client, and the classification of its failures.
//
// THREADING: LifecycleClient is thread-safe (its http::Client is); every call blocks the calling
// thread (an SDK pool thread) until its answer, and honours `cancel`.
// SECRETS: the API key travels in the client's default headers and is never logged or put in an
// error message.
#pragma once

#include "config.hpp"

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/http.hpp>
#include <sbx/sdk/log.hpp>

#include <boost/json/object.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::opensandbox {

// An error answer of the lifecycle or execd API: HTTP status plus the `code` of the
// {"code","message"} envelope ("" for FastAPI's 422 {"detail":[...]} and other shapes).
struct ApiError {
  long status = 0;
  std::string code;
  std::string message;
  std::string request_id;
};

// Reads an error answer into ApiError (message: the envelope's message, the 422 items' "msg"s, or
// the first 200 characters of the body).
ApiError parse_api_error(const sdk::http::Response& response);

// Whether a failed create may succeed when tried again, by type: an HTTP status in the seed's
// set {408, 409, 425, 429, 500, 502, 503, 504} unless the server's error code says the request
// itself is wrong; codes that name a transient server state are retryable whatever the status.
bool is_retryable_create_answer(const ApiError& error);

// An sdk::Error for an API error answer: 404 NOT_FOUND, 400/422 INVALID_ARGUMENT, 401/403
// FAILED_PRECONDITION (the key), 409 FAILED_PRECONDITION, 429/5xx UNAVAILABLE (retryable when
// `retryable`), else INTERNAL. `what` names the operation and the sandbox.
sdk::Error to_error(const ApiError& error, const std::string& what, bool retryable);

// The execd endpoint of a sandbox: its base URL (scheme://host:port/path, no trailing '/') and the
// headers every request to it carries (X-EXECD-ACCESS-TOKEN, ...; in server-proxy mode also the
// API key). A secret when headers hold a token: never logged.
struct ExecdEndpoint {
  std::string base_url;
  sdk::http::Headers headers;
};

// A sandbox's status as GET /sandboxes/{id} answers it ("" for what is absent).
struct SandboxStatusInfo {
  std::string state;
  std::string reason;
  std::string message;
};

// Reads the status object of a GET /sandboxes/{id} answer body; INTERNAL when the body is not a
// JSON object. `what` names the request in that error.
SandboxStatusInfo parse_sandbox_status(const std::string& body, const std::string& what);

// One sandbox of a list answer: id, status.state ("" when absent), metadata (string values),
// createdAt (Unix ms, 0 when absent or unreadable).
struct ListedSandbox {
  std::string id;
  std::string state;
  KeyValues metadata;
  int64_t created_unix_ms = 0;
};

// A sandbox object of the lifecycle API (an item of a list, or GET /sandboxes/{id}'s answer);
// nullopt when it has no id.
std::optional<ListedSandbox> parse_listed(const boost::json::object& sandbox);

// One page of GET /sandboxes.
struct ListPage {
  std::vector<ListedSandbox> items;
  bool has_next_page = false;
};

// The `metadata` query value of a list filtered by `pairs` (every pair ANDed): the pairs as a
// query of their own ("k=v&k2=v2", each key and value percent-encoded), percent-encoded again as
// one parameter value, as the lifecycle spec asks. Empty for no pairs.
std::string metadata_filter(const KeyValues& pairs);

// Reads a list answer's body. Items without a string id are skipped; throws INTERNAL when the body
// is not an object with an `items` array.
ListPage parse_list_page(std::string_view body);

class LifecycleClient {
 public:
  // `log`: every request is logged at debug (method, path, status, milliseconds; never a header).
  LifecycleClient(const ConnectionConfig& connection, sdk::Logger log);

  // POST /sandboxes; returns the new sandbox's id. Throws sdk::Error: CREATE_FAILED (retryable as
  // is_retryable_create_answer says) for an error answer, INVALID_ARGUMENT for a 422, the HTTP
  // client's transport errors as they are.
  std::string create(const boost::json::object& request, std::chrono::milliseconds timeout,
                     const sdk::CancelToken& cancel);
  // GET /sandboxes/{id} → status.state ("" when absent). NOT_FOUND for 404.
  std::string state(const std::string& id, std::chrono::milliseconds timeout,
                    const sdk::CancelToken& cancel);
  // GET /sandboxes/{id} → id, state, metadata, createdAt. NOT_FOUND for 404.
  ListedSandbox get(const std::string& id, std::chrono::milliseconds timeout,
                    const sdk::CancelToken& cancel);
  // GET /sandboxes/{id} without a thread waiting: `done` runs once on the client's loop thread (or
  // on the calling thread when the client is closing) with the status, or with the error.
  void status_async(const std::string& id, std::chrono::milliseconds timeout,
                    std::function<void(const SandboxStatusInfo*, const sdk::Error*)> done);
  // Runs `fn` on the client's loop thread after `delay` (sdk::http::Client::after).
  void after(std::chrono::milliseconds delay, std::function<void()> fn) {
    http_.after(delay, std::move(fn));
  }
  // DELETE /sandboxes/{id}; a sandbox already gone (404) is success.
  void remove(const std::string& id, std::chrono::milliseconds timeout,
              const sdk::CancelToken& cancel);
  // GET /sandboxes/{id}/endpoints/{port}[?use_server_proxy=true], made into an ExecdEndpoint (of
  // execd's port for the plugin's own calls, of any port for sbx.endpoint/1): the endpoint gets
  // the connection's scheme when it has none; headers are the connection's (the API key only in
  // server-proxy mode) with the endpoint's own on top.
  ExecdEndpoint endpoint(const std::string& id, uint16_t port, std::chrono::milliseconds timeout,
                         const sdk::CancelToken& cancel);
  // GET /sandboxes?metadata=<filter>&page=<page>&pageSize=<page_size> (`filter` as
  // metadata_filter makes it; empty: no filter).
  ListPage list_page(const std::string& filter, int64_t page, int64_t page_size,
                     std::chrono::milliseconds timeout, const sdk::CancelToken& cancel);
  // POST /sandboxes/{id}/pause or /resume (`pause` false). A 409 (not running / not paused) is
  // success when the sandbox already is in the state asked for (read back), else
  // FAILED_PRECONDITION; NOT_FOUND for a sandbox that is gone.
  void pause_or_resume(const std::string& id, bool pause, std::chrono::milliseconds timeout,
                       const sdk::CancelToken& cancel);
  // POST /sandboxes/{id}/renew-expiration; returns the expiry the server answered (Unix ms).
  // A time not in the future is INVALID_ARGUMENT (400), a sandbox that is gone NOT_FOUND.
  int64_t renew(const std::string& id, int64_t expires_at_unix_ms,
                std::chrono::milliseconds timeout, const sdk::CancelToken& cancel);

 private:
  sdk::http::Response send(sdk::http::Request request, const sdk::CancelToken& cancel);

  ConnectionConfig connection_;
  sdk::Logger log_;
  sdk::http::Client http_;
};

// RFC 3339 in UTC with milliseconds ("2026-12-01T01:00:00.250Z").
std::string format_rfc3339(int64_t unix_ms);
// Parses RFC 3339 (optional fraction, "Z" or "+hh:mm"); nullopt when it is not.
std::optional<int64_t> parse_rfc3339(std::string_view text);

// The HTTP client options of a connection (keep-alive expiry, pool cap, TLS, no proxy).
sdk::http::ClientOptions client_options(const ConnectionConfig& connection, std::string base_url);

}  // namespace sbx::opensandbox
