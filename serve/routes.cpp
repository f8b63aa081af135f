// The route table (routes.hpp) and the matching of a request's method and path against it.

#include "routes.hpp"

#include "state.hpp"

#include <array>

namespace sbx::serve {

namespace {

using http::verb;

// In the order of the APIs' specifications. The handlers live in routes_*.cpp (state.hpp).
const std::array kRoutes{
    // The lifecycle API (sandbox-lifecycle.yml).
    Route{verb::get, "/health", Api::lifecycle, false, get_health},
    Route{verb::get, "/sandboxes", Api::lifecycle, false, get_sandboxes},
    Route{verb::post, "/sandboxes", Api::lifecycle, false, post_sandboxes},
    Route{verb::get, "/sandboxes/{id}", Api::lifecycle, false, get_sandbox},
    Route{verb::delete_, "/sandboxes/{id}", Api::lifecycle, false, delete_sandbox},
    Route{verb::patch, "/sandboxes/{id}/metadata", Api::lifecycle, false, patch_sandbox_metadata},
    Route{verb::post, "/sandboxes/{id}/snapshots", Api::lifecycle},
    Route{verb::post, "/sandboxes/{id}/pause", Api::lifecycle, false, post_pause},
    Route{verb::post, "/sandboxes/{id}/resume", Api::lifecycle, false, post_resume},
    Route{verb::post, "/sandboxes/{id}/renew-expiration", Api::lifecycle, false,
          post_renew_expiration},
    Route{verb::get, "/sandboxes/{id}/endpoints/{port}", Api::lifecycle, false, get_endpoint},
    Route{verb::get, "/snapshots", Api::lifecycle},
    Route{verb::get, "/snapshots/{id}", Api::lifecycle},
    Route{verb::delete_, "/snapshots/{id}", Api::lifecycle},
    // The execd API (execd-api.yaml).
    Route{verb::get, "/ping", Api::execd, false, get_ping},
    Route{verb::get, "/code/contexts", Api::execd},
    Route{verb::delete_, "/code/contexts", Api::execd},
    Route{verb::get, "/code/contexts/{id}", Api::execd},
    Route{verb::delete_, "/code/contexts/{id}", Api::execd},
    Route{verb::post, "/code/context", Api::execd},
    Route{verb::post, "/code", Api::execd},
    Route{verb::delete_, "/code", Api::execd},
    Route{verb::post, "/pty", Api::execd, false, post_pty},
    Route{verb::get, "/pty/{id}", Api::execd, false, get_pty},
    Route{verb::get, "/pty/{id}/ws", Api::execd, false, get_pty_ws},  // a WebSocket
    Route{verb::delete_, "/pty/{id}", Api::execd, false, delete_pty},
    Route{verb::post, "/session", Api::execd, false, post_session},
    Route{verb::post, "/session/{id}/run", Api::execd, true, post_session_run},  // a stream
    Route{verb::delete_, "/session/{id}", Api::execd, false, delete_session},
    Route{verb::post, "/command", Api::execd, true, post_command},  // an event stream
    Route{verb::delete_, "/command", Api::execd, false, delete_command},
    Route{verb::get, "/command/status/{id}", Api::execd, false, get_command_status},
    Route{verb::get, "/command/{id}/logs", Api::execd, false, get_command_logs},
    Route{verb::get, "/files/info", Api::execd, false, get_files_info},
    Route{verb::delete_, "/files", Api::execd, false, delete_files},
    Route{verb::post, "/files/permissions", Api::execd, false, post_files_permissions},
    Route{verb::post, "/files/mv", Api::execd, false, post_files_mv},
    Route{verb::get, "/files/search", Api::execd, false, get_files_search},
    Route{verb::post, "/files/replace", Api::execd, false, post_files_replace},
    Route{verb::post, "/files/upload", Api::execd, false, nullptr, post_files_upload},
    Route{verb::get, "/files/download", Api::execd, true, get_files_download},  // 64 KiB pieces
    Route{verb::get, "/directories/list", Api::execd, false, get_directories_list},
    Route{verb::post, "/directories", Api::execd, false, post_directories},
    Route{verb::delete_, "/directories", Api::execd, false, delete_directories},
    Route{verb::get, "/metrics", Api::execd, false, get_execd_metrics},
    Route{verb::get, "/metrics/watch", Api::execd, false, get_execd_metrics_watch},
    // sbx serve's own.
    Route{verb::get, "/metrics", Api::server, false, get_metrics},
    Route{verb::post, "/metrics/events", Api::server, false, post_metrics_events},
    Route{verb::post, "/admin/reload", Api::server, false, post_admin_reload},
    Route{verb::get, "/admin/providers", Api::server, false, get_admin_providers},
};

constexpr std::string_view kExecdPort = "44772";

// "/a/b/c" -> {"a","b","c"}; "/" -> {}. An empty segment (a doubled or trailing slash) is kept,
// so such a path matches no template.
std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  if (path.empty() || path.front() != '/') return {{}};  // matches nothing
  path.remove_prefix(1);
  if (path.empty()) return out;
  for (;;) {
    const auto slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

bool is_placeholder(std::string_view segment) {
  return segment.size() > 2 && segment.front() == '{';
}

// Walks `route`'s template against `parts` without allocating (this runs for every route on
// every request): `on_placeholder` gets each part a {...} segment takes. False when they differ.
template <class OnPlaceholder>
bool walk_template(const Route& route, const std::vector<std::string_view>& parts,
                   OnPlaceholder&& on_placeholder) {
  std::string_view pattern = route.path;  // "/a/{id}/b"
  std::size_t i = 0;
  while (!pattern.empty()) {
    pattern.remove_prefix(1);  // its '/'
    const auto slash = pattern.find('/');
    const std::string_view segment = pattern.substr(0, slash);
    pattern = slash == std::string_view::npos ? std::string_view() : pattern.substr(slash);
    if (i == parts.size() || parts[i].empty()) return false;
    if (is_placeholder(segment)) {
      on_placeholder(parts[i]);
    } else if (segment != parts[i]) {
      return false;
    }
    ++i;
  }
  return i == parts.size();
}

bool path_matches(const Route& route, const std::vector<std::string_view>& parts) {
  return walk_template(route, parts, [](std::string_view) {});
}

// The parts `route`'s {...} segments take, in order (`parts` fit its template).
std::vector<std::string> params_of(const Route& route, const std::vector<std::string_view>& parts) {
  std::vector<std::string> params;
  walk_template(route, parts, [&](std::string_view part) { params.emplace_back(part); });
  return params;
}

// The route of `method` among the execd routes (`execd`) or the others (the server's own go with
// the lifecycle API's, at the root), or the first of the path with another method.
std::optional<RouteMatch> match_in(bool execd, std::string_view method,
                                   const std::vector<std::string_view>& parts) {
  const Route* other_method = nullptr;
  for (const Route& route : kRoutes) {
    if ((route.api == Api::execd) != execd || !path_matches(route, parts)) continue;
    if (http::to_string(route.method) == method) {
      return RouteMatch{&route, false, {}, params_of(route, parts)};
    }
    if (!other_method) other_method = &route;
  }
  if (!other_method) return std::nullopt;
  return RouteMatch{other_method, true, {}, params_of(*other_method, parts)};
}

}  // namespace

std::string Route::key() const {
  return std::string(http::to_string(method)) + " " + std::string(path);
}

std::string Route::metrics_label() const {
  return api == Api::server ? "other" : key();
}

bool Route::names_sandbox() const {
  return api == Api::execd || path.rfind("/sandboxes/{id}", 0) == 0;
}

std::span<const Route> routes() {
  return kRoutes;
}

const Route* find_route(std::string_view key) {
  for (const Route& route : kRoutes) {
    if (route.api != Api::server && route.key() == key) return &route;
  }
  return nullptr;
}

std::optional<RouteMatch> match_route(std::string_view method, std::string_view path) {
  const auto parts = segments(path);
  if (parts.size() >= 4 && parts[0] == "sandboxes" && !parts[1].empty() && parts[2] == "proxy") {
    if (parts[3] != kExecdPort) return std::nullopt;  // a proxy to another port: not an API route
    auto match = match_in(true, method, {parts.begin() + 4, parts.end()});
    if (match) match->sandbox_id = std::string(parts[1]);
    return match;
  }
  auto match = match_in(false, method, parts);
  if (match && match->route->names_sandbox()) {
    match->sandbox_id = match->params.front();  // "/sandboxes/{id}..." is the first placeholder
    match->params.erase(match->params.begin());
  }
  return match;
}

std::optional<RouteKey> route_key(const std::optional<RouteMatch>& match) {
  if (!match || match->wrong_method || match->route->api == Api::server) return std::nullopt;
  return RouteKey{match->route->key(), match->sandbox_id};
}

std::optional<RouteKey> route_key(std::string_view method, std::string_view path) {
  return route_key(match_route(method, path));
}

}  // namespace sbx::serve
