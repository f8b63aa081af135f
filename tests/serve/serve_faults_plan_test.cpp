// The fault plan (serve/faults.hpp) as a library: route keys, the sequences (repeat, pass,
// cut_after_events through stream_cut), the windows per sandbox, many threads at once, and the
// validation of the config (every message names the JSON path).

#include <faults.hpp>

#include <sbx/core/errors.hpp>

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace sbx::serve;
using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

namespace {

std::shared_ptr<Faults> plan(const std::string& json) {
  return Faults::parse(boost::json::parse(json), "sbx.json: $.serve.faults");
}

std::string plan_error(const std::string& json) {
  try {
    plan(json);
  } catch (const sbx::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError for " << json);
  return {};
}

RouteKey key(const std::string& k, const std::string& sandbox = {}) {
  return RouteKey{k, sandbox};
}

// The kinds of the actions `take` returns for `n` requests ("-" for none).
std::vector<std::string> takes(Faults& faults, const RouteKey& route, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    const auto a = faults.take(route, std::nullopt);
    out.push_back(a ? describe(*a) : "-");
  }
  return out;
}

}  // namespace

TEST_CASE("route keys: lifecycle routes at their templates, execd routes by their execd path") {
  auto k = route_key("POST", "/sandboxes");
  REQUIRE(k);
  CHECK(k->key == "POST /sandboxes");
  CHECK(k->sandbox_id.empty());
  k = route_key("GET", "/sandboxes/abc");
  REQUIRE(k);
  CHECK(k->key == "GET /sandboxes/{id}");
  CHECK(k->sandbox_id == "abc");
  k = route_key("DELETE", "/sandboxes/abc");
  REQUIRE(k);
  CHECK(k->key == "DELETE /sandboxes/{id}");
  k = route_key("GET", "/sandboxes/abc/endpoints/44772");
  REQUIRE(k);
  CHECK(k->key == "GET /sandboxes/{id}/endpoints/{port}");
  CHECK(k->sandbox_id == "abc");
  k = route_key("GET", "/health");
  REQUIRE(k);
  CHECK(k->key == "GET /health");

  // execd, reached through the gateway (route_path() has already removed a /v1 prefix).
  k = route_key("POST", "/sandboxes/s1/proxy/44772/command");
  REQUIRE(k);
  CHECK(k->key == "POST /command");
  CHECK(k->sandbox_id == "s1");
  k = route_key("GET", "/sandboxes/s1/proxy/44772/ping");
  REQUIRE(k);
  CHECK(k->key == "GET /ping");
  k = route_key("GET", "/sandboxes/s1/proxy/44772/command/status/c9");
  REQUIRE(k);
  CHECK(k->key == "GET /command/status/{id}");
  CHECK(k->sandbox_id == "s1");
  k = route_key("GET", "/sandboxes/s1/proxy/44772/command/c9/logs");
  REQUIRE(k);
  CHECK(k->key == "GET /command/{id}/logs");
  k = route_key("POST", "/sandboxes/s1/proxy/44772/files/upload");
  REQUIRE(k);
  CHECK(k->key == "POST /files/upload");
  k = route_key("DELETE", "/sandboxes/s1/proxy/44772/command");
  REQUIRE(k);
  CHECK(k->key == "DELETE /command");

  // Not routes of either API: no key, no fault.
  CHECK_FALSE(route_key("PUT", "/sandboxes"));
  CHECK_FALSE(route_key("GET", "/nope"));
  CHECK_FALSE(route_key("GET", "/sandboxes/"));
  CHECK_FALSE(route_key("GET", "/sandboxes//x"));
  CHECK_FALSE(route_key("GET", "/sandboxes/s1/proxy/8080/ping"));
  CHECK_FALSE(route_key("GET", "/sandboxes/s1/proxy/44772"));
  CHECK_FALSE(route_key("GET", "/sandboxes/s1/proxy/44772/nope"));
  CHECK_FALSE(route_key("POST", "/sandboxes/s1/proxy/44772/ping"));

  CHECK(is_known_route("POST /command"));
  CHECK(is_known_route("GET /sandboxes/{id}"));
  CHECK_FALSE(is_known_route("GET /sandboxes/abc"));
  CHECK_FALSE(is_known_route("post /sandboxes"));
}

TEST_CASE("the route table: one route per key, each found by its key and matched by its path") {
  std::set<std::string> keys;
  int served = 0;
  for (const Route& route : routes()) {
    const std::string key = route.key();
    CHECK_MESSAGE(keys.insert(key + (route.api == Api::server ? " (server)" : "")).second, key);
    CHECK_MESSAGE((route.handler != nullptr) + (route.body_handler != nullptr) <= 1, key);
    served += route.handler || route.body_handler ? 1 : 0;
    // A concrete path of the template matches the route itself, with its parameters in order.
    std::string path;
    std::vector<std::string> values;
    for (std::string_view rest = route.path; !rest.empty();) {
      const auto slash = rest.find('/', 1);
      const std::string_view segment = rest.substr(0, slash);
      if (segment.size() > 3 && segment[1] == '{') {
        values.push_back("v" + std::to_string(values.size()));
        path += "/" + values.back();
      } else {
        path += std::string(segment);
      }
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
    }
    if (route.api == Api::execd) path = "/sandboxes/box/proxy/44772" + path;
    const auto match = match_route(std::string(boost::beast::http::to_string(route.method)), path);
    REQUIRE_MESSAGE(match, key, " at ", path);
    CHECK_MESSAGE(match->route == &route, key, " at ", path);
    CHECK_FALSE(match->wrong_method);
    if (route.api == Api::execd) {
      CHECK(match->sandbox_id == "box");
      CHECK(match->params == values);
    } else if (route.names_sandbox()) {
      CHECK(match->sandbox_id == "v0");
      CHECK(match->params == std::vector<std::string>(values.begin() + 1, values.end()));
    } else {
      CHECK(match->params == values);
    }
    // The fault plan knows exactly the OpenSandbox APIs' routes (execd's GET /metrics is one,
    // the server's own is not).
    CHECK_MESSAGE((find_route(key) == &route) == (route.api != Api::server), key);
  }
  // 10 lifecycle, 4 of the server's own, 25 execd (the upload's a body handler; 4 terminals)
  CHECK(served == 39);
  // Another method on a route's path is the route's path with the wrong method (405), no key.
  const auto put = match_route("PUT", "/sandboxes/abc");
  REQUIRE(put);
  CHECK(put->wrong_method);
  CHECK_FALSE(route_key(put));
  const auto post_metrics = match_route("POST", "/metrics");
  REQUIRE(post_metrics);
  CHECK(post_metrics->wrong_method);
  // The server's own routes are no route of the plan, and are labelled "other" in GET /metrics.
  const auto metrics = match_route("GET", "/metrics");
  REQUIRE(metrics);
  CHECK(metrics->route->api == Api::server);
  CHECK(metrics->route->metrics_label() == "other");
  CHECK_FALSE(route_key("GET", "/metrics"));
  CHECK_FALSE(route_key("POST", "/admin/reload"));
  CHECK(route_key("GET", "/sandboxes/s1/proxy/44772/metrics")->key == "GET /metrics");
}

TEST_CASE("the first N command submissions answer 502, then normal service") {
  auto f = plan(R"([{"route": "POST /command",
                     "actions": [{"status": 502}, {"status": 502}, {"status": 502}]}])");
  CHECK_FALSE(f->empty());
  const auto a = f->take(key("POST /command", "s1"), std::nullopt);
  REQUIRE(a);
  CHECK(a->kind == FaultAction::Kind::status);
  CHECK(a->status == 502);
  CHECK(a->code == "GENERAL::INJECTED_FAULT");
  CHECK(a->message.find("502 on POST /command") != std::string::npos);
  // The sequence is the route's, whichever sandbox; other routes are untouched.
  CHECK_FALSE(f->take(key("GET /ping", "s1"), std::nullopt));
  CHECK(takes(*f, key("POST /command", "s2"), 4) ==
        std::vector<std::string>{"status 502 GENERAL::INJECTED_FAULT",
                                 "status 502 GENERAL::INJECTED_FAULT", "-", "-"});
}

TEST_CASE("create answers 503 twice with the configured code and message, then passes") {
  auto f = plan(R"([{"route": "POST /sandboxes",
                     "actions": [{"status": 503, "code": "X::BUSY", "message": "busy"},
                                 {"status": 503}]}])");
  const auto a = f->take(key("POST /sandboxes"), std::nullopt);
  REQUIRE(a);
  CHECK(a->status == 503);
  CHECK(a->code == "X::BUSY");
  CHECK(a->message == "busy");
  const auto b = f->take(key("POST /sandboxes"), std::nullopt);
  REQUIRE(b);
  CHECK(b->code == "GENERAL::INJECTED_FAULT");
  CHECK_FALSE(f->take(key("POST /sandboxes"), std::nullopt));
}

TEST_CASE("repeat starts the sequence again; pass, delay and reset are consumed in order") {
  auto f = plan(R"([{"route": "GET /health", "repeat": true,
                     "actions": [{"pass": true}, {"delay_ms": 250}, {"reset": true}]}])");
  const auto r = key("GET /health");
  const auto first = f->take(r, std::nullopt);
  REQUIRE(first);
  CHECK(first->kind == FaultAction::Kind::pass);
  const auto second = f->take(r, std::nullopt);
  REQUIRE(second);
  CHECK(second->kind == FaultAction::Kind::delay);
  CHECK(second->delay == 250ms);
  CHECK(takes(*f, r, 4) == std::vector<std::string>{"reset", "pass", "delay 250 ms", "reset"});
}

TEST_CASE("a command stream is cut mid-way: cut_after_events is left for stream_cut") {
  auto f = plan(R"([{"route": "POST /command",
                     "actions": [{"status": 502}, {"cut_after_events": 3}, {"status": 500}]}])");
  const auto r = key("POST /command", "s1");
  // Nothing to cut before the 502 is consumed.
  CHECK_FALSE(f->stream_cut("POST /command", "s1"));
  const auto first = f->take(r, std::nullopt);
  REQUIRE(first);
  CHECK(first->status == 502);
  // The hook lets the request through without consuming the cut...
  CHECK_FALSE(f->take(r, std::nullopt));
  CHECK_FALSE(f->take(r, std::nullopt));
  // ...which the stream code takes when it opens the stream, once.
  CHECK(f->stream_cut("POST /command", "s1") == 3);
  CHECK_FALSE(f->stream_cut("POST /command", "s1"));
  CHECK_FALSE(f->stream_cut("GET /ping", "s1"));
  const auto last = f->take(r, std::nullopt);
  REQUIRE(last);
  CHECK(last->status == 500);
  CHECK_FALSE(f->take(r, std::nullopt));

  auto every = plan(R"([{"route": "POST /command", "repeat": true,
                         "actions": [{"cut_after_events": 0}]}])");
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(every->take(r, std::nullopt));
    CHECK(every->stream_cut("POST /command", "s1") == 0);
  }
}

TEST_CASE("a window: the route fails for S seconds from each sandbox's creation") {
  auto f = plan(R"([{"route": "GET /ping", "fail_for_s": 5, "status": 502}])");
  const auto now = Clock::now();
  const auto young = f->take(key("GET /ping", "young"), now - 1s, now);
  REQUIRE(young);
  CHECK(young->status == 502);
  CHECK(young->message.find("for 5 s after the sandbox's creation") != std::string::npos);
  // The window consumes nothing: it answers for as long as it lasts.
  CHECK(f->take(key("GET /ping", "young"), now - 4900ms, now));
  CHECK_FALSE(f->take(key("GET /ping", "old"), now - 5s, now));
  CHECK_FALSE(f->take(key("GET /ping", "old"), now - 1h, now));
  // A sandbox the server does not hold: no window.
  CHECK_FALSE(f->take(key("GET /ping", "unknown"), std::nullopt, now));
}

TEST_CASE("a window and a sequence on one route: the window first, the sequence after it") {
  auto f = plan(R"([{"route": "GET /sandboxes/{id}", "fail_for_s": 2, "status": 503,
                     "code": "X::WARMING"},
                    {"route": "GET /sandboxes/{id}", "actions": [{"status": 500}]}])");
  const auto now = Clock::now();
  const auto r = key("GET /sandboxes/{id}", "s");
  const auto in_window = f->take(r, now, now);
  REQUIRE(in_window);
  CHECK(in_window->status == 503);
  CHECK(in_window->code == "X::WARMING");
  const auto after = f->take(r, now - 3s, now);
  REQUIRE(after);
  CHECK(after->status == 500);
  CHECK_FALSE(f->take(r, now - 3s, now));
}

TEST_CASE("many threads at once consume each action exactly once") {
  std::string actions;
  for (int i = 0; i < 100; ++i)
    actions += std::string(i ? "," : "") + R"({"status": 502})";
  auto f = plan(R"([{"route": "POST /command", "actions": [)" + actions + "]}]");
  std::atomic<int> faults{0}, passes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (f->take(key("POST /command", "s"), std::nullopt))
          ++faults;
        else
          ++passes;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(faults == 100);
  CHECK(passes == 300);
}

TEST_CASE("the plan's errors name the JSON path") {
  CHECK(plan_error(R"({"route": "GET /ping"})") ==
        "sbx.json: $.serve.faults: expected an array of fault rules, got object");
  CHECK(plan_error(R"([3])") == "sbx.json: $.serve.faults[0]: expected a rule object, got number");
  CHECK(plan_error(R"([{"actions": [{"pass": true}]}])")
            .starts_with("sbx.json: $.serve.faults[0].route: required"));
  CHECK(plan_error(R"([{"route": "GET /sandboxes/abc", "actions": [{"pass": true}]}])")
            .starts_with("sbx.json: $.serve.faults[0].route: unknown route 'GET /sandboxes/abc'"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"pass": true}], "repaet": true}])")
            .starts_with("sbx.json: $.serve.faults[0].repaet: unknown key"));
  CHECK(plan_error(R"([{"route": "GET /health"}])")
            .starts_with("sbx.json: $.serve.faults[0].actions: required"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": []}])") ==
        "sbx.json: $.serve.faults[0].actions: expected a non-empty array of actions");
  // Actions.
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"pass": true}, {"stauts": 502}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[1]: an action has exactly one of"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"status": 502, "extra": 1}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].extra: unknown key"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"reset": true, "code": "X"}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].code: unknown key"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"status": 502, "reset": true}]}])")
            .find("got status, reset") != std::string::npos);
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"status": 200}]}])") ==
        "sbx.json: $.serve.faults[0].actions[0].status: must be between 400 and 599, got 200");
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"status": "502"}]}])") ==
        "sbx.json: $.serve.faults[0].actions[0].status: expected an integer, got string");
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"delay_ms": -1}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].delay_ms: must be between 0"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"reset": false}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].reset: must be true"));
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [7]}])") ==
        "sbx.json: $.serve.faults[0].actions[0]: expected an action object, got number");
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"cut_after_events": 2}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].cut_after_events: only a "
                         "streamed route (POST /command, GET /files/download) can be cut"));
  CHECK(plan_error(R"([{"route": "POST /command", "actions": [{"cut_after_events": -2}]}])")
            .starts_with("sbx.json: $.serve.faults[0].actions[0].cut_after_events: must be"));
  // Windows.
  CHECK(plan_error(R"([{"route": "GET /ping", "fail_for_s": 5}])")
            .starts_with("sbx.json: $.serve.faults[0].status: required with fail_for_s"));
  CHECK(plan_error(R"([{"route": "GET /ping", "fail_for_s": 0, "status": 502}])")
            .starts_with("sbx.json: $.serve.faults[0].fail_for_s: must be > 0"));
  CHECK(plan_error(R"([{"route": "POST /sandboxes", "fail_for_s": 5, "status": 502}])")
            .starts_with("sbx.json: $.serve.faults[0].fail_for_s: a window counts from a "
                         "sandbox's creation"));
  CHECK(plan_error(R"([{"route": "GET /ping", "fail_for_s": 5, "status": 502,
                        "actions": [{"pass": true}]}])")
            .starts_with("sbx.json: $.serve.faults[0].fail_for_s: a rule has actions or"));
  CHECK(plan_error(R"([{"route": "GET /ping", "fail_for_s": 5, "status": 502, "repeat": true}])")
            .starts_with("sbx.json: $.serve.faults[0].repeat: unknown key"));
  // One sequence and one window per route.
  CHECK(plan_error(R"([{"route": "GET /health", "actions": [{"pass": true}]},
                       {"route": "GET /health", "actions": [{"pass": true}]}])") ==
        "sbx.json: $.serve.faults[1].route: a second sequence for GET /health");
  CHECK(plan_error(R"([{"route": "GET /ping", "fail_for_s": 1, "status": 502},
                       {"route": "GET /ping", "fail_for_s": 2, "status": 503}])") ==
        "sbx.json: $.serve.faults[1].route: a second window for GET /ping");

  CHECK(plan("[]")->empty());
}
