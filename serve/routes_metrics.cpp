// POST /metrics/events (also /v1): the official SDKs' best-effort telemetry. The 1.1.1 Python SDK
// and the JS SDK report each create's latency here, fire-and-forget, after the sandbox is ready
// or the create failed; the real server accepts the event with 204 (its generated client reads
// 204, and 400/401/500 as the error envelope). This server checks the event's shape, logs it at
// debug level and answers 204.
// GET /metrics (root only): the server's own metrics in the Prometheus text format.

#include "state.hpp"

#include <fmt/format.h>
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

std::string error_type(const Response& response) {
  const int status = response.result_int();
  if (status < 400) return {};
  const std::string fallback = "HTTP_" + std::to_string(status);
  boost::system::error_code ec;
  const json::value body = json::parse(response.body(), ec);
  const json::object* object = ec ? nullptr : body.if_object();
  if (object == nullptr) return fallback;
  if (const auto* code = object->if_contains("code"); code && code->is_string()) {
    return std::string(code->get_string());
  }
  if (const auto* detail = object->if_contains("detail"); detail && detail->is_array()) {
    return "VALIDATION";  // FastAPI's 422: a list of field errors
  }
  return fallback;
}

// GET /metrics: Prometheus text (version 0.0.4): requests and latency per route, the sandboxes and
// event streams open, and with hot swap the reloads and each generation's sandboxes and operations.
Response prometheus(const std::shared_ptr<Server::State>& state, const Request& request) {
  std::string text = state->metrics.prometheus();
  const std::size_t sandboxes = state->registry.count();
  const int streams = state->gate.open_streams();
  text += fmt::format(
      "# HELP sbx_serve_sandboxes Sandboxes the server holds.\n"
      "# TYPE sbx_serve_sandboxes gauge\nsbx_serve_sandboxes {}\n"
      "# HELP sbx_serve_open_streams Event streams open (commands' and metrics watches).\n"
      "# TYPE sbx_serve_open_streams gauge\nsbx_serve_open_streams {}\n",
      sandboxes, streams);
  if (state->options.admin) {
    {
      std::lock_guard lock(state->admin_queue.mutex);
      text += fmt::format(
          "# HELP sbx_serve_reloads_total Reloads, by result (refused: rolled back as a whole).\n"
          "# TYPE sbx_serve_reloads_total counter\n"
          "sbx_serve_reloads_total{{result=\"ok\"}} {}\n"
          "sbx_serve_reloads_total{{result=\"refused\"}} {}\n",
          state->admin_queue.reloads, state->admin_queue.refused);
    }
    text +=
        "# HELP sbx_provider_generation_sandboxes Sandboxes held per provider generation.\n"
        "# TYPE sbx_provider_generation_sandboxes gauge\n";
    std::string operations =
        "# HELP sbx_provider_generation_operations Operations in flight per provider generation.\n"
        "# TYPE sbx_provider_generation_operations gauge\n";
    for (const sbx::GenerationInfo& g : state->options.admin->generations()) {
      const std::string labels =
          fmt::format("provider=\"{}\",generation=\"{}\",version=\"{}\",current=\"{}\"",
                      prometheus_label(g.name), g.serial, prometheus_label(g.plugin_version),
                      g.current ? "true" : "false");
      text += fmt::format("sbx_provider_generation_sandboxes{{{}}} {}\n", labels, g.sandboxes);
      operations +=
          fmt::format("sbx_provider_generation_operations{{{}}} {}\n", labels, g.operations);
    }
    text += operations;
  }
  Response response{http::status::ok, request.version()};
  response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  response.keep_alive(request.keep_alive());
  response.body() = std::move(text);
  response.prepare_payload();
  return response;
}

void get_metrics(const Call& call) {
  call.reply(prometheus(call.state, call.request));
}

void post_metrics_events(const Call& call) {
  const Request& request = call.request;
  boost::system::error_code ec;
  const json::value body = json::parse(request.body(), ec);
  const std::string problem = ec ? "the body is not JSON: " + ec.message() : event_problem(body);
  if (!problem.empty()) {
    call.reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                              "Invalid metrics event: " + problem + "."));
    return;
  }
  const json::object& event = body.get_object();
  const auto agent = request.find(http::field::user_agent);
  spdlog::debug("sbx serve: SDK event sandbox.create: {} ms, success {}, sandbox {} ({})",
                event.at("createDurationMs").to_number<int64_t>(), event.at("success").get_bool(),
                event.contains("sandboxId") ? json::serialize(event.at("sandboxId")) : "-",
                agent != request.end() ? std::string(agent->value()) : "no User-Agent");
  call.reply(empty_response(request, http::status::no_content));
}

}  // namespace sbx::serve
