// GET /health (also /v1/health): {"status": "healthy"}, without authentication.

#include "state.hpp"

namespace sbx::serve {

void get_health(const Call& call) {
  call.reply(
      json_response(call.request, http::status::ok, boost::json::object{{"status", "healthy"}}));
}

}  // namespace sbx::serve
