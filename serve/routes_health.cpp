// GET /health (also /v1/health): {"status": "healthy"}, without authentication.

#include "state.hpp"

namespace sbx::serve {

bool route_health(const std::shared_ptr<Server::State>&, const Request& request,
                  const Reply& reply) {
  if (route_path(request) != "/health") return false;
  if (request.method() != http::verb::get) {
    reply(json_response(request, http::status::method_not_allowed,
                        boost::json::object{{"detail", "Method Not Allowed"}}));
    return true;
  }
  reply(json_response(request, http::status::ok, boost::json::object{{"status", "healthy"}}));
  return true;
}

}  // namespace sbx::serve
