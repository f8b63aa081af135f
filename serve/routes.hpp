// The server's routes, declared once (routes.cpp): each route's method, path template, API and
// handler. The same declaration gives a request its handler, its label in GET /metrics and its
// key in the fault plan ("GET /sandboxes/{id}", "POST /command"), so a route cannot be served
// under one name and counted or faulted under another.
//
// Lifecycle routes are matched at the root or under /v1 alike (route_path() folds the prefix);
// execd routes by their execd path under /sandboxes/{id}/proxy/44772 (also under /v1): the sandbox
// is the prefix's. A route declared without a handler is one of the OpenSandbox APIs that sbx serve
// does not serve: the fault plan may still name it, and a request gets the API's "not served"
// answer.
//
// THREADING: the table is immutable; every function here is pure and callable from any thread.
#pragma once

#include <boost/beast/http/verb.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::serve {

struct Call;     // a request given to its route's handler (state.hpp)
class BodySink;  // a body consumed as it arrives (state.hpp)

enum class Api {
  lifecycle,  // OpenSandbox's lifecycle API (sandbox-lifecycle.yml), /health included
  execd,      // execd's API (execd-api.yaml), under /sandboxes/{id}/proxy/44772
  server,     // sbx serve's own: GET /metrics, POST /metrics/events, /admin/*
};

struct Route {
  boost::beast::http::verb method;
  std::string_view path;  // the template: "/sandboxes/{id}/endpoints/{port}", "/command/{id}/logs"
  Api api;
  // An event stream or a download (sent in pieces): the fault plan may cut it after N pieces.
  bool stream = false;
  // Answers the request (once, through Call::reply). Null: declared, not served.
  void (*handler)(const Call&) = nullptr;
  // For a body read as it arrives (POST /files/upload) instead of `handler`: returns the sink the
  // body goes to, or null once it has answered through Call::reply.
  std::shared_ptr<BodySink> (*body_handler)(const Call&) = nullptr;

  // "METHOD /path/{template}": the fault plan's key of the route.
  std::string key() const;
  // The label of its requests in GET /metrics: the key, "other" for the server's own routes.
  std::string metrics_label() const;
  // Whether a path parameter is a sandbox the fault plan's windows count from (lifecycle routes
  // under /sandboxes/{id}, every execd route).
  bool names_sandbox() const;
};

// Every route, lifecycle then execd then the server's own.
std::span<const Route> routes();
// The route of the OpenSandbox APIs (not the server's own) whose key() is `key`, or null.
const Route* find_route(std::string_view key);

// What a request's method and path are in the table.
struct RouteMatch {
  // The route of the path and method; or, with `wrong_method`, the first route of the path
  // whose method differs (the request is answered 405, or execd's "not served").
  const Route* route = nullptr;
  bool wrong_method = false;
  std::string sandbox_id;           // the sandbox the path names, or empty
  std::vector<std::string> params;  // the template's other {...} segments, in order
};

// The route of `method` and `path` (a request target's path without its query, the "/v1" prefix
// removed: route_path() in state.hpp); nullopt for a path no route has (a proxy to another port
// included).
std::optional<RouteMatch> match_route(std::string_view method, std::string_view path);

// A request's route as the fault plan names it: the key and the sandbox of a route of the
// OpenSandbox APIs matched by method and path; nullopt for any other request.
struct RouteKey {
  std::string key;
  std::string sandbox_id;
};
std::optional<RouteKey> route_key(const std::optional<RouteMatch>& match);
std::optional<RouteKey> route_key(std::string_view method, std::string_view path);

}  // namespace sbx::serve
