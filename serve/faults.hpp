// Fault injection for tests of OpenSandbox clients (docs/serve.md, "Fault injection"): a plan read
// from the config file's `serve.faults` (never from a request or the environment) that makes
// chosen routes answer an error status, reset the connection, wait before serving, or cut an
// event stream (or a download) after N events (pieces).
//
//   "faults": [
//     {"route": "POST /sandboxes", "actions": [{"status": 503}, {"status": 503}]},
//     {"route": "POST /command", "actions": [{"pass": true}, {"cut_after_events": 3}],
//      "repeat": true},
//     {"route": "GET /ping", "fail_for_s": 5, "status": 502}
//   ]
//
// A sequence rule's actions are consumed one per matching request, in the order requests reach
// the server; after the last, the route is served normally (or, with "repeat": true, the sequence
// starts again). A window rule ("fail_for_s") makes the route answer `status` for S seconds counted
// from the creation of the sandbox named in the path (per sandbox id); it is checked before the
// route's sequence and consumes nothing. Route keys are "METHOD PATH" with the OpenAPI path
// templates: lifecycle routes as "GET /sandboxes/{id}" (at the root or under /v1 alike), execd
// routes by their execd path ("POST /command", "GET /ping", "POST /files/upload"), whether reached
// directly (/sandboxes/{id}/proxy/44772/...) or through the server proxy
// (/v1/sandboxes/{id}/proxy/44772/...).
//
// THREADING: a Faults is shared by every connection (shared_ptr); take() and stream_cut() may be
// called from any thread at once (one mutex). parse() is pure. The route keys are those of
// routes.hpp.
#pragma once

#include "routes.hpp"

#include <boost/json/value.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::serve {

// One scripted action.
struct FaultAction {
  enum class Kind {
    status,            // answer `status` with the {"code","message"} envelope
    reset,             // abort the connection (RST, SO_LINGER 0), no answer
    delay,             // wait `delay`, then serve normally
    cut_after_events,  // an event stream ends its connection after `events` events
    pass,              // serve this request normally
  };
  Kind kind = Kind::pass;
  int status = 0;
  std::string code;     // status: defaults to "GENERAL::INJECTED_FAULT"
  std::string message;  // status: defaults to a sentence naming the route and the status
  // status: the answer announces a Content-Length longer than its body, then the connection
  // closes (the real execd's answer to a directory download: a 500 whose body breaks off).
  bool short_body = false;
  std::chrono::milliseconds delay{0};
  int events = 0;
};

// "status 503", "reset", "delay 1500 ms", "cut after 3 events", "pass": for the logs.
std::string describe(const FaultAction& action);

// True when `key` names a route the plan may use (the lifecycle and execd APIs' routes).
bool is_known_route(std::string_view key);

class Faults {
 public:
  // Reads `plan`, the `serve.faults` array; `path` names it in messages ("sbx.json:
  // $.serve.faults"). Throws sbx::ConfigError("<path>[i].<key>: <problem>") for an unknown rule or
  // action key, an unknown route key, a bad value, a route given two sequences or two windows, a
  // window on a route that names no sandbox, or cut_after_events on a route that is no event
  // stream.
  static std::shared_ptr<Faults> parse(const boost::json::value& plan, std::string_view path);

  bool empty() const { return rules_.empty(); }

  // What to do with one request, called once per request after authentication and before
  // routing. `sandbox_created_at`: when the sandbox named in the path was created (nullopt when
  // the server does not hold it: no window applies). Returns:
  //   - a window rule's status action while `now` is within its window (nothing consumed);
  //   - else the next action of the route's sequence, consumed (a `pass` too; after the last
  //     action and without repeat, nullopt);
  //   - nullopt, without consuming it, when the next action is `cut_after_events`: that one is
  //     taken by the event stream's code through stream_cut().
  // Logs every action it returns, at info, with the route.
  std::optional<FaultAction> take(
      const RouteKey& route,
      std::optional<std::chrono::system_clock::time_point> sandbox_created_at,
      std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

  // For the event-stream code (POST /command), when it opens a stream: when the next action of
  // `route_key`'s sequence is `cut_after_events`, consumes it and returns N; else nullopt and
  // nothing is consumed. `sandbox_id` is for the log line. With N, the stream writes N events
  // (every event counts, `init` and `ping` too; 0: none) and then closes the connection without
  // the final event and without ending the chunked body, as a network cut looks to a client; its
  // command is then handled as when a client goes away mid-stream.
  std::optional<int> stream_cut(std::string_view route_key, std::string_view sandbox_id);

 private:
  struct Rule {
    std::string route;
    // A sequence rule:
    std::vector<FaultAction> actions;
    bool repeat = false;
    std::size_t next = 0;  // guarded by mutex_
    // A window rule (fail_for > 0): `window_action` (a status) while inside it.
    std::chrono::milliseconds fail_for{0};
    FaultAction window_action;
  };
  Rule* sequence_locked(std::string_view route);

  std::mutex mutex_;
  std::vector<Rule> rules_;
};

}  // namespace sbx::serve
