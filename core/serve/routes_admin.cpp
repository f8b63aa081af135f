// Hot swap for operators (docs/hot-swap.md), with Options::admin:
//   POST /admin/reload     reloads the host's config (a replaced plugin file is a new generation);
//                          200 with the report, 409 {"code": "ADMIN::RELOAD_REFUSED"} when the
//                          reload was refused as a whole (the old generation still serves)
//   GET  /admin/providers  the generations (current and draining), the last reload, the counts
// Authenticated like every route but /health. Without Options::admin both answer 404.

#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

namespace sbx::serve {

void start_reload(const std::shared_ptr<Server::State>& state,
                  std::function<void(bool ok, boost::json::object body)> done) {
  std::lock_guard lock(state->mutex);
  // A reload runs plugin code (a library's init, a canary's create, exec and close): never on the
  // server's threads.
  state->reloads.emplace_back([state, done = std::move(done)] {
    try {
      boost::json::object report = state->options.admin->reload();
      spdlog::info("sbx serve: reload: {}", boost::json::serialize(report));
      done(true, std::move(report));
    } catch (const std::exception& e) {
      spdlog::error("sbx serve: {}", e.what());
      const auto error = sbx::to_error(std::current_exception());
      done(false,
           boost::json::object{{"code", "ADMIN::RELOAD_REFUSED"}, {"message", error.what()}});
    }
  });
}

bool route_admin(const std::shared_ptr<Server::State>& state, const Request& request,
                 const Reply& reply) {
  const std::string path = route_path(request);
  if (path != "/admin/reload" && path != "/admin/providers") return false;
  if (!state->options.admin) {
    reply(json_response(request, http::status::not_found,
                        boost::json::object{{"detail", "Not Found"}}));
    return true;
  }
  const bool reload = path == "/admin/reload";
  if (request.method() != (reload ? http::verb::post : http::verb::get)) {
    reply(json_response(request, http::status::method_not_allowed,
                        boost::json::object{{"detail", "Method Not Allowed"}}));
    return true;
  }
  if (!reload) {
    reply(json_response(request, http::status::ok, state->options.admin->providers()));
    return true;
  }
  Request shape;  // what the answer needs of the request, kept past it
  shape.version(request.version());
  shape.keep_alive(request.keep_alive());
  if (const auto id = request.find("x-request-id"); id != request.end()) {
    shape.set("x-request-id", id->value());
  }
  start_reload(state, [shape, reply](bool ok, boost::json::object body) {
    reply(json_response(shape, ok ? http::status::ok : http::status::conflict, std::move(body)));
  });
  return true;
}

}  // namespace sbx::serve
