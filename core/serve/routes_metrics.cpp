// POST /metrics/events (also /v1): the official SDKs' best-effort telemetry. The 1.1.1 Python SDK
// and the JS SDK report each create's latency here, fire-and-forget, after the sandbox is ready
// or the create failed; the real server accepts the event with 204 (its generated client reads
// 204, and 400/401/500 as the error envelope). This server checks the event's shape, logs it at
// debug level and answers 204.

#include "state.hpp"

#include <spdlog/spdlog.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace sbx::serve {

namespace json = boost::json;

namespace {

// The event's problem, or "" when it is well formed: {"eventType": "sandbox.create",
// "createDurationMs": int >= 0, "success": bool, "sandboxId"?: string, "image"?: string}.
std::string event_problem(const json::value& body) {
  const json::object* event = body.if_object();
  if (event == nullptr) return "the event must be a JSON object";
  const json::value* type = event->if_contains("eventType");
  if (type == nullptr || !type->is_string()) return "eventType must be a string";
  if (type->get_string() != "sandbox.create")
    return "unknown eventType '" + std::string(type->get_string()) + "'";
  const json::value* duration = event->if_contains("createDurationMs");
  if (duration == nullptr || !(duration->is_int64() || duration->is_uint64()) ||
      (duration->is_int64() && duration->get_int64() < 0)) {
    return "createDurationMs must be an integer >= 0";
  }
  const json::value* success = event->if_contains("success");
  if (success == nullptr || !success->is_bool()) return "success must be a boolean";
  for (const char* key : {"sandboxId", "image"}) {
    const json::value* v = event->if_contains(key);
    if (v != nullptr && !v->is_string() && !v->is_null())
      return std::string(key) + " must be a string";
  }
  return {};
}

}  // namespace

bool route_metrics(const std::shared_ptr<Server::State>&, const Request& request,
                   const Reply& reply) {
  if (route_path(request) != "/metrics/events") return false;
  if (request.method() != http::verb::post) {
    reply(json_response(request, http::status::method_not_allowed,
                        json::object{{"detail", "Method Not Allowed"}}));
    return true;
  }
  boost::system::error_code ec;
  const json::value body = json::parse(request.body(), ec);
  const std::string problem = ec ? "the body is not JSON: " + ec.message() : event_problem(body);
  if (!problem.empty()) {
    reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                         "Invalid metrics event: " + problem + "."));
    return true;
  }
  const json::object& event = body.get_object();
  const auto agent = request.find(http::field::user_agent);
  spdlog::debug("sbx serve: SDK event sandbox.create: {} ms, success {}, sandbox {} ({})",
                event.at("createDurationMs").to_number<int64_t>(), event.at("success").get_bool(),
                event.contains("sandboxId") ? json::serialize(event.at("sandboxId")) : "-",
                agent != request.end() ? std::string(agent->value()) : "no User-Agent");
  reply(empty_response(request, http::status::no_content));
  return true;
}

}  // namespace sbx::serve
