// What the server's parts share (internal to core/serve): the server state, the registry of the
// sandboxes the server created, and the types the route files answer with.
//
// THREADING: State is shared (shared_ptr) by the connections and by the continuations of provider
// operations; its registry is guarded by its mutex. A route handler runs on its connection's strand
// and answers through `Reply`, which may be called once, from any thread (it posts to the strand).
#pragma once

#include "server.hpp"

#include <sbx/core/sandbox.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sbx::serve {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// Answers a request; callable once, from any thread.
using Reply = std::function<void(Response)>;

// A sandbox the server created (or found again in its state directory), with what the lifecycle
// API reports of it. Filled in before it enters the registry; after that only `expires_at`
// changes (renew), under State::mutex. The Sandbox itself is thread-safe.
struct Entry {
  std::shared_ptr<sbx::Sandbox> box;
  std::string id;  // box->id(), kept: a detached Sandbox has none
  std::string image;
  std::vector<std::string> entrypoint;
  std::optional<boost::json::object> metadata;
  std::chrono::system_clock::time_point created_at;
  std::optional<std::chrono::system_clock::time_point> expires_at;  // guarded by State::mutex
  std::string descriptor;  // sbx.connect/1 descriptor, when the server keeps a state directory
};

struct Server::State {
  sbx::Provider provider;
  Options options;
  boost::asio::io_context ioc;
  // Where the acceptor, the grace timer and the stop's steps run, one at a time.
  boost::asio::strand<boost::asio::io_context::executor_type> control;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer grace_timer;
  boost::asio::steady_timer sweep_timer;  // closes sandboxes whose TTL passed (on `control`)
  uint16_t port = 0;
  int state_dir_lock = -1;  // flock'ed file descriptor of Options::state_dir/.lock, or -1

  std::mutex mutex;  // guards what follows
  std::map<std::string, std::shared_ptr<Entry>> sandboxes;
  std::vector<std::shared_ptr<Entry>> kept;  // left running by a stop with keep_on_stop
  std::map<uint64_t, sbx::Operation<sbx::Sandbox>> creating;  // creates in flight, by ticket
  uint64_t next_ticket = 0;
  int closing = 0;    // closes in flight (deletes and the stop's)
  int answering = 0;  // requests read and not yet answered: a stop lets them finish
  bool stopping = false;
  bool finished = false;
  bool all_closed = true;

  State(sbx::Provider p, Options o);

  void maybe_finish_locked();
};

// Starts closing `entry`'s sandbox. The caller has counted it in State::closing (under the
// mutex) and must not hold the mutex: the operation may complete at once, on this thread. When it
// ends, `closing` goes down and `done` runs (on a plugin thread, or this one) with the error, if
// any.
void begin_close(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
                 std::function<void(std::exception_ptr)> done);

// The registry entry for `id`, or nullptr. One whose expiry has passed is retired first (answered
// as unknown, as the real server answers once its TTL timer removed the container).
std::shared_ptr<Entry> find_live(const std::shared_ptr<Server::State>& state,
                                 const std::string& id);
// Takes `entry` out of the registry (if it is still there) and closes its sandbox in the
// background, counted in State::closing; its state file goes too. Must not hold the mutex.
void retire(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
            const char* why);
// Retires every entry whose expiry is at or before `now` (the TTL sweep).
void retire_expired(const std::shared_ptr<Server::State>& state);

// The state directory (store.cpp): one JSON file per sandbox, written atomically (temporary file
// and rename); a no-op without Options::state_dir. Errors are logged, not thrown.
void store_save(Server::State& state, const Entry& entry);
void store_remove(const Server::State& state, const std::string& id);
// Locks the directory (creating it) and connects to every sandbox recorded there; files of
// sandboxes that are gone or expired are removed. Blocking: called by the constructor.
void store_load(Server::State& state);

// The Sandbox object of the lifecycle API (GET, list) for `entry` in `status`. Reads expires_at:
// the caller holds no lock.
boost::json::object sandbox_json(const std::shared_ptr<Server::State>& state, const Entry& entry,
                                 sbx::SandboxStatus status);
Response not_found(const Request& request, const std::string& id);
// A request's JSON body as the real server reads it; when it is empty or not JSON, answers
// FastAPI's 422 (`missing` at ["body"], `json_invalid` with the offset) and returns nullopt.
std::optional<boost::json::value> parse_json_body(const Request& request, const Reply& reply);
Response method_not_allowed(const Request& request);

// Route groups, one file each. Each answers the request or returns false when the path is not its.
bool route_health(const std::shared_ptr<Server::State>& state, const Request& request,
                  const Reply& reply);
bool route_lifecycle(const std::shared_ptr<Server::State>& state, const Request& request,
                     const Reply& reply);
// pause, resume, renew-expiration, endpoints (routes_sandbox_ops.cpp).
bool route_sandbox_ops(const std::shared_ptr<Server::State>& state, const Request& request,
                       const Reply& reply);

// Helpers of the route files (http_util.cpp).
Response json_response(const Request& request, http::status status, const boost::json::value& body);
Response empty_response(const Request& request, http::status status);
// {"code": code, "message": message}, the lifecycle API's error envelope.
Response error_response(const Request& request, http::status status, const std::string& code,
                        const std::string& message);
// The response for a failed provider call, by the error's status.
Response provider_error_response(const Request& request, std::exception_ptr error,
                                 const std::string& sandbox_id);
// RFC 3339 UTC with microseconds and 'Z', as the real server prints.
std::string format_time(std::chrono::system_clock::time_point t);
// A 32-hex-digit request id.
std::string new_request_id();
// Equal without an early exit on the first difference.
bool constant_time_equal(const std::string& a, const std::string& b);
// The token a client sends as X-EXECD-ACCESS-TOKEN on the sandbox's direct execd paths when the
// server has an API key: hex HMAC-SHA256(api key, sandbox id). Stateless, so it survives a restart,
// and it unlocks one sandbox only (the key itself is never handed to a sandbox endpoint). Empty
// when the server has no key (execd paths are then open, as the real execd is).
std::string execd_access_token(const Options& options, const std::string& sandbox_id);
// The path of a request target without its query; "/v1" prefix removed (the routes are the same).
std::string route_path(const Request& request);
// The query of a request target as (name, value) pairs in order, form-decoded ('+' and %XX).
std::vector<std::pair<std::string, std::string>> query_params(const Request& request);
// Percent-decoding ('+' as a space when `form`); nullopt for a malformed escape.
std::optional<std::string> percent_decode(std::string_view text, bool form);
// RFC 3339 as pydantic reads a datetime (fraction, 'Z' or an offset, naive = UTC, a date alone
// = midnight UTC); on failure, pydantic's error text (e.g. "input is too short").
struct ParsedTime {
  std::optional<std::chrono::system_clock::time_point> time;
  std::string error;
};
ParsedTime parse_time(std::string_view text);

}  // namespace sbx::serve
