// The lifecycle operations on one sandbox, at the root and under /v1:
//   POST /sandboxes/{id}/pause             202, empty (sbx.pause/1)
//   POST /sandboxes/{id}/resume            202, empty (sbx.pause/1)
//   POST /sandboxes/{id}/renew-expiration  200 {expiresAt} (sbx.renew/1)
//   GET  /sandboxes/{id}/endpoints/{port}  200 {endpoint, headers?}: the gateway's own paths
// Wrong states answer 409 DOCKER::SANDBOX_NOT_RUNNING / DOCKER::SANDBOX_NOT_PAUSED; a provider
// without the extension answers 501 SANDBOX::API_NOT_SUPPORTED (docs/serve.md).

#include "state.hpp"

#include <sbx/base/time.hpp>
#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/algorithm/string/case_conv.hpp>
#include <boost/json.hpp>

#include <algorithm>

namespace sbx::serve {

namespace json = boost::json;

namespace {

// A sandbox whose generation (the plugin that made it, which may differ from the block's current
// one after a reload) lacks `extension`.
Response unsupported(const Request& request, const sbx::Sandbox& box, const char* what,
                     const char* extension) {
  return error_response(request, http::status::not_implemented, "SANDBOX::API_NOT_SUPPORTED",
                        "Provider '" + box.provider_name() + "' cannot " + what + " (" + extension +
                            "): sandbox " + box.id() +
                            " runs on a generation of its plugin that does not offer it.");
}

// A failed provider call of an operation: the statuses with a meaning of their own as for every
// route; anything else as the real server's "<operation> failed" 500.
Response operation_error(const Request& shape, std::exception_ptr error, const std::string& id,
                         const char* code, const char* what) {
  const sbx::Error e = sbx::to_error(error);
  switch (e.status()) {
    case SBX_STATUS_INTERNAL:
    case SBX_STATUS_TIMEOUT:
    case SBX_STATUS_PERMISSION_DENIED:
      return error_response(shape, http::status::internal_server_error, code,
                            std::string(what) + ": " + e.what());
    default:
      return provider_error_response(shape, error, id);
  }
}

// pause and resume: the state is checked first (the ABI's pause of a paused sandbox succeeds; the
// real server answers 409), then the provider is asked.
void pause_or_resume(const std::shared_ptr<Server::State>& state, const Request& request,
                     const Reply& reply, const std::string& id, bool pause) {
  auto entry = find_live(state, id);
  if (!entry) {
    reply(not_found(request, id));
    return;
  }
  // The sandbox's own generation answers, not the block's current one (docs/hot-swap.md).
  const std::shared_ptr<sbx::Sandbox> box = entry->box();
  if (!box->supports("sbx.pause/1")) {
    reply(
        unsupported(request, *box, pause ? "pause sandboxes" : "resume sandboxes", "sbx.pause/1"));
    return;
  }
  const auto version = request.version();
  entry->box()->status_async().then(
      [entry, id, pause, version, reply](sbx::Operation<sbx::SandboxStatus>& done) {
        Request shape;
        shape.version(version);
        sbx::SandboxStatus status = sbx::SandboxStatus::unknown;
        try {
          status = done.get();
        } catch (...) {
          reply(provider_error_response(shape, std::current_exception(), id));
          return;
        }
        if (status == sbx::SandboxStatus::stopped) entry->not_running = true;
        if (pause && status != sbx::SandboxStatus::running) {
          reply(error_response(shape, http::status::conflict, "DOCKER::SANDBOX_NOT_RUNNING",
                               "Sandbox is not in a running state."));
          return;
        }
        if (!pause && status != sbx::SandboxStatus::paused) {
          reply(error_response(shape, http::status::conflict, "DOCKER::SANDBOX_NOT_PAUSED",
                               "Sandbox is not in a paused state."));
          return;
        }
        // A failed pause or resume, whether it throws at the call or completes with an error.
        auto failed = [id, pause, reply](const Request& shape, std::exception_ptr error) {
          reply(operation_error(
              shape, error, id,
              pause ? "DOCKER::SANDBOX_PAUSE_FAILED" : "DOCKER::SANDBOX_RESUME_FAILED",
              pause ? "Failed to pause sandbox" : "Failed to resume sandbox"));
        };
        sbx::Operation<void> op;
        try {
          op = pause ? entry->box()->pause_async() : entry->box()->resume_async();
        } catch (...) {
          failed(shape, std::current_exception());
          return;
        }
        op.then([id, pause, version, reply, failed](sbx::Operation<void>& finished) {
          Request shape;
          shape.version(version);
          try {
            finished.get();
          } catch (...) {
            failed(shape, std::current_exception());
            return;
          }
          spdlog::info("sbx serve: {} sandbox {}", pause ? "paused" : "resumed", id);
          reply(empty_response(shape, http::status::accepted));
        });
      });
}

// The body of renew-expiration as pydantic reads RenewSandboxExpirationRequest; answers the 422
// and returns nullopt when it cannot.
// A time outside what system_clock holds is given as its side: -1 (long past) or 1 (far future).
struct RenewTime {
  std::optional<std::chrono::system_clock::time_point> time;
  int out_of_range = 0;
};

std::optional<RenewTime> read_renew(const Request& request, const Reply& reply) {
  const auto parsed = parse_json_body(request, reply);
  if (!parsed) return std::nullopt;
  auto unprocessable = [&](json::object item) {
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", json::array{std::move(item)}}}));
    return std::nullopt;
  };
  if (!parsed->is_object()) {
    return unprocessable(
        json::object{{"type", "model_attributes_type"},
                     {"loc", json::array{"body"}},
                     {"msg", "Input should be a valid dictionary or object to extract fields from"},
                     {"input", *parsed}});
  }
  const json::value* v = parsed->as_object().if_contains("expiresAt");
  const json::array where{"body", "expiresAt"};
  if (!v) {
    return unprocessable(json::object{
        {"type", "missing"}, {"loc", where}, {"msg", "Field required"}, {"input", *parsed}});
  }
  if (v->is_string()) {
    const ParsedTime t = parse_time(std::string(v->as_string()));
    if (t.error.empty()) return RenewTime{t.time, t.out_of_range};
    return unprocessable(
        json::object{{"type", "datetime_from_date_parsing"},
                     {"loc", where},
                     {"msg", "Input should be a valid datetime or date, " + t.error},
                     {"input", *v},
                     {"ctx", json::object{{"error", t.error}}}});
  }
  if (v->is_number()) {  // pydantic: Unix seconds, or milliseconds past 2e10
    double n = v->to_number<double>();
    if (std::abs(n) > 2e10) n /= 1000;
    const auto time = sbx::base::add_checked(
        std::chrono::system_clock::time_point{},
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(
            std::clamp(n, -1e12, 1e12))));  // clamped: the cast below must not overflow either
    if (!time) return RenewTime{std::nullopt, n < 0 ? -1 : 1};
    return RenewTime{time, 0};
  }
  return unprocessable(json::object{{"type", "datetime_type"},
                                    {"loc", where},
                                    {"msg", "Input should be a valid datetime"},
                                    {"input", *v}});
}

void renew(const std::shared_ptr<Server::State>& state, const Request& request, const Reply& reply,
           const std::string& id) {
  const auto wanted = read_renew(request, reply);
  if (!wanted) return;
  auto entry = find_live(state, id);
  if (!entry) {
    reply(not_found(request, id));
    return;
  }
  if (const std::shared_ptr<sbx::Sandbox> box = entry->box(); !box->supports("sbx.renew/1")) {
    reply(unsupported(request, *box, "renew sandboxes", "sbx.renew/1"));
    return;
  }
  const auto now = std::chrono::system_clock::now();
  if (wanted->out_of_range < 0 || (wanted->time && *wanted->time <= now)) {
    reply(error_response(request, http::status::bad_request, "DOCKER::INVALID_EXPIRATION",
                         "New expiration time must be in the future."));
    return;
  }
  // At most kMaxTimeoutS from now, as a create's timeout: a later expiry would overflow.
  if (wanted->out_of_range > 0 || *wanted->time - now > std::chrono::seconds(kMaxTimeoutS)) {
    reply(error_response(request, http::status::bad_request, "DOCKER::INVALID_EXPIRATION",
                         "New expiration time must be at most " + std::to_string(kMaxTimeoutS) +
                             " seconds (about 31 years) from now."));
    return;
  }
  if (!state->registry.expires_at(*entry)) {
    reply(error_response(request, http::status::conflict, "DOCKER::INVALID_EXPIRATION",
                         "Sandbox " + id + " does not have automatic expiration enabled."));
    return;
  }
  const auto version = request.version();
  const auto expires_at = *wanted->time;
  auto done = [state, entry, id, expires_at, version, reply](std::exception_ptr error) {
    Request shape;
    shape.version(version);
    if (error) {
      reply(operation_error(shape, error, id, "DOCKER::SANDBOX_RENEW_FAILED",
                            "Failed to renew sandbox"));
      return;
    }
    if (!state->registry.renew(
            entry,
            expires_at)) {  // deleted (or expired) while the provider renewed it: nothing to keep
      reply(not_found(shape, id));
      return;
    }
    store_save(*state, *entry);  // a no-op once a delete removed the record meanwhile
    spdlog::info("sbx serve: sandbox {} now expires at {}", id, format_time(expires_at));
    reply(json_response(shape, http::status::ok,
                        json::object{{"expiresAt", format_time(expires_at)}}));
  };
  sbx::Operation<std::chrono::system_clock::time_point> op;
  try {
    op = entry->box()->renew_async(expires_at);
  } catch (...) {
    done(std::current_exception());
    return;
  }
  op.then([done](sbx::Operation<std::chrono::system_clock::time_point>& finished) {
    try {
      finished.get();
    } catch (...) {
      done(std::current_exception());
      return;
    }
    done(nullptr);
  });
}

// A boolean query value as pydantic reads it.
std::optional<bool> query_bool(std::string text) {
  boost::algorithm::to_lower(text);
  if (text == "1" || text == "true" || text == "t" || text == "yes" || text == "y" ||
      text == "on") {
    return true;
  }
  if (text == "0" || text == "false" || text == "f" || text == "no" || text == "n" ||
      text == "off") {
    return false;
  }
  return std::nullopt;
}

// GET /sandboxes/{id}/endpoints/{port}: every port is reached through the gateway's proxy paths,
// as the real server's Docker runtime hands out execd's /proxy/{port} for every port but 8080.
void endpoint(const std::shared_ptr<Server::State>& state, const Request& request,
              const Reply& reply, const std::string& id, const std::string& port_text) {
  json::array detail;
  std::optional<int64_t> port;
  {
    bool digits = !port_text.empty() && port_text.size() <= 18;
    for (std::size_t i = 0; digits && i < port_text.size(); ++i)
      digits = (port_text[i] >= '0' && port_text[i] <= '9') || (i == 0 && port_text[i] == '-');
    if (digits && port_text != "-") port = std::stoll(port_text);
  }
  if (!port) {
    detail.push_back(json::object{
        {"type", "int_parsing"},
        {"loc", json::array{"path", "port"}},
        {"msg", "Input should be a valid integer, unable to parse string as an integer"},
        {"input", json::string(port_text)}});
  }
  bool server_proxy = false;
  std::optional<std::string> expires;
  for (const auto& [name, value] : query_params(request)) {
    if (name == "use_server_proxy") {
      const auto b = query_bool(value);
      if (!b) {
        detail.push_back(json::object{{"type", "bool_parsing"},
                                      {"loc", json::array{"query", "use_server_proxy"}},
                                      {"msg",
                                       "Input should be a valid boolean, unable to "
                                       "interpret input"},
                                      {"input", json::string(value)}});
      } else {
        server_proxy = *b;
      }
    }
    if (name == "expires") expires = value;
  }
  if (!detail.empty()) {
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", std::move(detail)}}));
    return;
  }
  if (server_proxy && expires) {
    reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                         "use_server_proxy cannot be combined with expires; signed endpoints "
                         "require the gateway route."));
    return;
  }
  if (*port < 1 || *port > 65535) {
    reply(error_response(request, http::status::bad_request, "DOCKER::INVALID_PORT",
                         "Port must be between 1 and 65535."));
    return;
  }
  if (!find_live(state, id)) {
    reply(not_found(request, id));
    return;
  }
  if (expires) {
    reply(error_response(request, http::status::bad_request, "SANDBOX::API_NOT_SUPPORTED",
                         "Signed endpoints (expires) are not supported by this server."));
    return;
  }
  const std::string& host = state->options.host;
  std::string address = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                        std::to_string(state->port);
  if (state->options.unix_socket) {  // no address to give: the request's Host, as the client used
    const auto given = request.find(http::field::host);
    address = given != request.end() && !given->value().empty() ? std::string(given->value())
                                                                : "localhost";
  }
  json::object body{{"endpoint", address + (server_proxy ? "/v1" : "") + "/sandboxes/" + id +
                                     "/proxy/" + std::to_string(*port)}};
  // With a key, execd paths need the sandbox's token, in both modes: clients send an endpoint's
  // headers with every execd call, and the Python SDK sends nothing else there (no API key).
  if (state->options.api_key) {
    body["headers"] =
        json::object{{"X-EXECD-ACCESS-TOKEN", execd_access_token(state->options, id)}};
  }
  reply(json_response(request, http::status::ok, body));
}

}  // namespace

void post_pause(const Call& call) {
  pause_or_resume(call.state, call.request, call.reply, call.sandbox_id, true);
}

void post_resume(const Call& call) {
  pause_or_resume(call.state, call.request, call.reply, call.sandbox_id, false);
}

void post_renew_expiration(const Call& call) {
  renew(call.state, call.request, call.reply, call.sandbox_id);
}

void get_endpoint(const Call& call) {
  endpoint(call.state, call.request, call.reply, call.sandbox_id, call.params.at(0));
}

}  // namespace sbx::serve
