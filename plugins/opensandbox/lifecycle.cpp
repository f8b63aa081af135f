#include "lifecycle.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

namespace sbx::opensandbox {

namespace {

namespace json = boost::json;

constexpr std::string_view kApiKeyHeader = "OPEN-SANDBOX-API-KEY";

// Codes the real server sends for a request that will fail the same way again.
const std::set<std::string, std::less<>> kPermanentCodes = {
    "SANDBOX::INVALID_PARAMETER",
    "SANDBOX::API_NOT_SUPPORTED",
    "SANDBOX::INVALID_METADATA_LABEL",
    "SANDBOX::UNSUPPORTED_POOL_REF",
    "DOCKER::SANDBOX_UNSUPPORTED_POOL_REF",
    "MISSING_API_KEY",
    "INVALID_API_KEY",
    "DOCKER::INVALID_PORT",
};

// Codes that name a transient server state: worth another attempt whatever the status.
const std::set<std::string, std::less<>> kTransientCodes = {
    "DOCKER::SANDBOX_EXECD_START_FAILED",
    "SANDBOX::TOO_MANY_SANDBOXES",
    "SANDBOX::SERVER_STOPPING",
};

const std::set<long> kRetryableStatuses = {408, 409, 425, 429, 500, 502, 503, 504};

}  // namespace

ApiError parse_api_error(const sdk::http::Response& response) {
  ApiError error;
  error.status = response.status;
  error.request_id = response.header("x-request-id");
  boost::system::error_code ec;
  const json::value body = json::parse(response.body, ec);
  if (!ec && body.is_object()) {
    const auto& object = body.get_object();
    if (const auto* code = object.if_contains("code"); code && code->is_string()) {
      error.code = std::string(code->get_string());
    }
    if (const auto* message = object.if_contains("message"); message && message->is_string()) {
      error.message = std::string(message->get_string());
    }
    if (const auto* detail = object.if_contains("detail")) {
      if (detail->is_array()) {
        for (const auto& item : detail->get_array()) {
          if (!item.is_object()) continue;
          const auto* msg = item.get_object().if_contains("msg");
          if (msg && msg->is_string()) {
            error.message += (error.message.empty() ? "" : "; ") + std::string(msg->get_string());
          }
        }
      } else if (detail->is_string()) {
        error.message = std::string(detail->get_string());
      }
    }
    if (const auto* e = object.if_contains("error"); e && e->is_string() && error.message.empty()) {
      error.message = std::string(e->get_string());
    }
  }
  if (error.message.empty()) error.message = response.body.substr(0, 200);
  return error;
}

namespace {

// A missing image or one the registry refuses: DOCKER::SANDBOX_IMAGE_PULL_FAILED, a 500 on the
// real server.
bool is_image_pull_failure(const ApiError& error) {
  return error.code.ends_with("IMAGE_PULL_FAILED");
}

}  // namespace

bool is_retryable_create_answer(const ApiError& error) {
  if (kPermanentCodes.contains(error.code)) return false;
  if (is_image_pull_failure(error)) return false;  // the next attempt fails the same way
  if (kTransientCodes.contains(error.code)) return true;
  return kRetryableStatuses.contains(error.status);
}

sdk::Error to_error(const ApiError& error, const std::string& what, bool retryable) {
  std::string message = what + ": HTTP " + std::to_string(error.status);
  if (!error.code.empty()) message += " " + error.code;
  if (!error.message.empty()) message += ": " + error.message;
  if (!error.request_id.empty()) message += " (request id " + error.request_id + ")";
  // The server's code as the reason, the one it shares with sbx by its well-known name.
  sdk::ErrorDetails details{.retryable = retryable,
                            .http_status = static_cast<int32_t>(error.status),
                            .request_id = error.request_id,
                            .reason = is_image_pull_failure(error)
                                          ? std::string(SBX_REASON_IMAGE_PULL_FAILED)
                                          : error.code};
  sbx_status status = SBX_STATUS_INTERNAL;
  if (error.status == 404) {
    status = SBX_STATUS_NOT_FOUND;
  } else if (error.status == 400 || error.status == 422) {
    status = SBX_STATUS_INVALID_ARGUMENT;
  } else if (error.status == 401 || error.status == 403 || error.status == 409) {
    status = SBX_STATUS_FAILED_PRECONDITION;
  } else if (error.status == 429 || error.status >= 500) {
    status = SBX_STATUS_UNAVAILABLE;
  }
  return sdk::Error(status, std::move(message), std::move(details));
}

namespace {

// The error of a lifecycle answer other than success: retryable by its HTTP status alone (a 409,
// a conflict with the sandbox's state, never is when `conflict_final`).
[[noreturn]] void throw_answer(const sdk::http::Response& response, const std::string& what,
                               bool conflict_final = false) {
  const ApiError error = parse_api_error(response);
  throw to_error(
      error, what,
      kRetryableStatuses.contains(error.status) && !(conflict_final && error.status == 409));
}

}  // namespace

sdk::http::ClientOptions client_options(const ConnectionConfig& connection, std::string base_url) {
  sdk::http::ClientOptions options;
  options.base_url = std::move(base_url);
  options.connect_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(connection.connect_timeout_s * 1000)));
  options.max_connections = static_cast<long>(connection.max_connections);
  options.max_idle_connections = static_cast<long>(connection.max_keepalive_connections);
  options.user_agent = "sbx-opensandbox";
  if (connection.disable_connection_pooling || connection.max_keepalive_connections == 0) {
    options.keepalive_expiry = std::chrono::milliseconds(0);
  } else if (connection.keepalive_expiry_s) {
    options.keepalive_expiry = std::chrono::milliseconds(
        static_cast<int64_t>(std::llround(*connection.keepalive_expiry_s * 1000)));
  } else {
    options.keepalive_expiry = std::chrono::milliseconds(118'000);  // libcurl's own default
  }
  if (connection.ca_bundle) options.ca_bundle = *connection.ca_bundle;
  options.insecure_skip_verify = !connection.verify_tls;
  return options;
}

LifecycleClient::LifecycleClient(const ConnectionConfig& connection, sdk::Logger log)
    : connection_(connection), log_(log), http_([&] {
        auto options = client_options(connection, connection.base_url() + "/v1");
        if (connection.api_key) {
          options.default_headers.emplace_back(std::string(kApiKeyHeader), *connection.api_key);
        }
        return options;
      }()) {}

sdk::http::Response LifecycleClient::send(sdk::http::Request request,
                                          const sdk::CancelToken& cancel) {
  // Connect failures (nothing sent) are tried again up to connect_retries times at once, as the
  // seed's transport does; anything else is the caller's to judge.
  // Each attempt is logged at debug: method, path (the query too: ids and the metadata filter,
  // no secret), status or error, milliseconds. Never a header: the API key travels in one.
  for (int64_t attempt = 0;; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    const auto elapsed_ms = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - start)
          .count();
    };
    try {
      auto response = http_.send(request, cancel);
      log_.debug("opensandbox: ", request.method, " /v1", request.target, " -> ", response.status,
                 " in ", elapsed_ms(), " ms");
      return response;
    } catch (const sdk::Error& e) {
      log_.debug("opensandbox: ", request.method, " /v1", request.target, " failed in ",
                 elapsed_ms(), " ms: ", e.what());
      if (attempt >= connection_.connect_retries || !e.retryable() || e.may_have_run() ||
          e.status() != SBX_STATUS_UNAVAILABLE) {
        throw;
      }
    }
  }
}

std::string metadata_filter(const KeyValues& pairs) {
  std::string query;
  for (const auto& [k, v] : pairs) {
    if (!query.empty()) query += '&';
    query += sdk::http::url_encode(k) + "=" + sdk::http::url_encode(v);
  }
  return sdk::http::url_encode(query);
}

std::optional<ListedSandbox> parse_listed(const json::object& o) {
  const auto* id = o.if_contains("id");
  if (!id || !id->is_string() || id->get_string().empty()) return std::nullopt;
  ListedSandbox out;
  out.id = std::string(id->get_string());
  if (const auto* status = o.if_contains("status"); status && status->is_object()) {
    const auto* state = status->get_object().if_contains("state");
    if (state && state->is_string()) out.state = std::string(state->get_string());
  }
  if (const auto* metadata = o.if_contains("metadata"); metadata && metadata->is_object()) {
    for (const auto& m : metadata->get_object()) {
      if (m.value().is_string())
        out.metadata[std::string(m.key())] = std::string(m.value().get_string());
    }
  }
  if (const auto* created = o.if_contains("createdAt"); created && created->is_string()) {
    out.created_unix_ms = parse_rfc3339(created->get_string()).value_or(0);
  }
  return out;
}

ListPage parse_list_page(std::string_view body) {
  boost::system::error_code ec;
  const json::value answer = json::parse(body, ec);
  const json::object* object = !ec && answer.is_object() ? &answer.get_object() : nullptr;
  const json::value* items = object ? object->if_contains("items") : nullptr;
  if (!items || !items->is_array()) {
    throw sdk::Error::internal("OpenSandbox list sandboxes: the answer has no items array");
  }
  ListPage page;
  for (const auto& item : items->get_array()) {
    if (!item.is_object()) continue;
    if (auto out = parse_listed(item.get_object())) page.items.push_back(std::move(*out));
  }
  if (const auto* pagination = object->if_contains("pagination");
      pagination && pagination->is_object()) {
    const auto* next = pagination->get_object().if_contains("hasNextPage");
    page.has_next_page = next && next->is_bool() && next->get_bool();
  }
  return page;
}

ListPage LifecycleClient::list_page(const std::string& filter, int64_t page, int64_t page_size,
                                    std::chrono::milliseconds timeout,
                                    const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.target = "/sandboxes?" + (filter.empty() ? std::string() : "metadata=" + filter + "&") +
                   "page=" + std::to_string(page) + "&pageSize=" + std::to_string(page_size);
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status != 200) throw_answer(response, "OpenSandbox list sandboxes");
  return parse_list_page(response.body);
}

std::string LifecycleClient::create(const json::object& body, std::chrono::milliseconds timeout,
                                    const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.method = "POST";
  request.target = "/sandboxes";
  request.headers = {{"Content-Type", "application/json"}};
  request.body = json::serialize(body);
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status != 202 && response.status != 200 && response.status != 201) {
    const auto error = parse_api_error(response);
    const bool retryable = is_retryable_create_answer(error);
    auto e = to_error(error, "OpenSandbox create", retryable);
    if (e.status() == SBX_STATUS_INVALID_ARGUMENT && !retryable) throw e;
    throw sdk::Error(SBX_STATUS_CREATE_FAILED, e.what(), e.details());
  }
  boost::system::error_code ec;
  const auto answer = json::parse(response.body, ec);
  const json::value* id = nullptr;
  if (!ec && answer.is_object()) id = answer.get_object().if_contains("id");
  if (!id || !id->is_string() || id->get_string().empty()) {
    throw sdk::Error::create_failed("OpenSandbox create answered " +
                                    std::to_string(response.status) + " without a sandbox id");
  }
  return std::string(id->get_string());
}

std::string LifecycleClient::state(const std::string& id, std::chrono::milliseconds timeout,
                                   const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.target = "/sandboxes/" + sdk::http::url_encode(id);
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status != 200) {
    throw_answer(response, "OpenSandbox get sandbox " + id);
  }
  return parse_sandbox_status(response.body, "OpenSandbox get sandbox " + id).state;
}

ListedSandbox LifecycleClient::get(const std::string& id, std::chrono::milliseconds timeout,
                                   const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.target = "/sandboxes/" + sdk::http::url_encode(id);
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status != 200) throw_answer(response, "OpenSandbox get sandbox " + id);
  boost::system::error_code ec;
  const json::value answer = json::parse(response.body, ec);
  std::optional<ListedSandbox> out;
  if (!ec && answer.is_object()) out = parse_listed(answer.get_object());
  if (!out) {
    throw sdk::Error::internal("OpenSandbox get sandbox " + id +
                               ": the answer is not a sandbox (no id)");
  }
  return *out;
}

void LifecycleClient::status_async(
    const std::string& id, std::chrono::milliseconds timeout,
    std::function<void(const SandboxStatusInfo*, const sdk::Error*)> done) {
  sdk::http::Request request;
  request.target = "/sandboxes/" + sdk::http::url_encode(id);
  request.timeout = timeout;
  http_.start(std::move(request),
              [id, done = std::move(done)](sdk::http::Response* response, const sdk::Error* error) {
                if (error) return done(nullptr, error);
                try {
                  if (response->status != 200)
                    throw_answer(*response, "OpenSandbox get sandbox " + id);
                  const SandboxStatusInfo status =
                      parse_sandbox_status(response->body, "OpenSandbox get sandbox " + id);
                  done(&status, nullptr);
                } catch (const sdk::Error& e) {
                  done(nullptr, &e);
                }
              });
}

SandboxStatusInfo parse_sandbox_status(const std::string& body, const std::string& what) {
  boost::system::error_code ec;
  const auto answer = json::parse(body, ec);
  if (ec || !answer.is_object()) {
    throw sdk::Error::internal(what + ": the answer is not a JSON object");
  }
  SandboxStatusInfo out;
  const auto* status = answer.get_object().if_contains("status");
  if (!status || !status->is_object()) return out;
  const auto text = [&](const char* key) {
    const auto* v = status->get_object().if_contains(key);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
  };
  out.state = text("state");
  out.reason = text("reason");
  out.message = text("message");
  return out;
}

void LifecycleClient::remove(const std::string& id, std::chrono::milliseconds timeout,
                             const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.method = "DELETE";
  request.target = "/sandboxes/" + sdk::http::url_encode(id);
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status == 204 || response.status == 200 || response.status == 404) return;
  throw_answer(response, "OpenSandbox delete sandbox " + id);
}

ExecdEndpoint LifecycleClient::endpoint(const std::string& id, uint16_t port,
                                        std::chrono::milliseconds timeout,
                                        const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.target = "/sandboxes/" + sdk::http::url_encode(id) + "/endpoints/" +
                   std::to_string(port) +
                   (connection_.use_server_proxy ? "?use_server_proxy=true" : "");
  request.timeout = timeout;
  const auto response = send(std::move(request), cancel);
  if (response.status != 200) {
    throw_answer(response, "OpenSandbox endpoint of sandbox " + id);
  }
  boost::system::error_code ec;
  const auto answer = json::parse(response.body, ec);
  const json::object* object = !ec && answer.is_object() ? &answer.get_object() : nullptr;
  const auto* value = object ? object->if_contains("endpoint") : nullptr;
  if (!value || !value->is_string() || value->get_string().empty()) {
    throw sdk::Error::internal("OpenSandbox returned an empty endpoint for sandbox " + id +
                               " port " + std::to_string(port));
  }
  std::string url(value->get_string());
  if (url.find("://") == std::string::npos) {
    while (!url.empty() && url.front() == '/')
      url.erase(0, 1);
    url = connection_.scheme() + "://" + url;
  }
  while (!url.empty() && url.back() == '/')
    url.pop_back();
  ExecdEndpoint out{std::move(url), {}};
  // The connection's headers first (the key only through the server's proxy: in direct mode the
  // sandbox runs untrusted code), then the endpoint's own, which win.
  if (connection_.use_server_proxy && connection_.api_key) {
    out.headers.emplace_back(std::string(kApiKeyHeader), *connection_.api_key);
  }
  if (const auto* headers = object->if_contains("headers"); headers && headers->is_object()) {
    for (const auto& h : headers->get_object()) {
      if (!h.value().is_string()) continue;
      const std::string name(h.key());
      std::erase_if(out.headers, [&](const auto& existing) {
        return std::equal(existing.first.begin(), existing.first.end(), name.begin(), name.end(),
                          [](char a, char b) { return std::tolower(a) == std::tolower(b); });
      });
      out.headers.emplace_back(name, std::string(h.value().get_string()));
    }
  }
  return out;
}

std::string format_rfc3339(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[96];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return text;
}

std::optional<int64_t> parse_rfc3339(std::string_view text) {
  std::tm tm{};
  int consumed = 0;
  const std::string s(text);
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != 19) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  int64_t ms = static_cast<int64_t>(timegm(&tm)) * 1000;
  size_t at = 19;
  if (at < s.size() && s[at] == '.') {
    int64_t scale = 100;
    for (++at; at < s.size() && std::isdigit(static_cast<unsigned char>(s[at])); ++at) {
      ms += (s[at] - '0') * scale;
      scale /= 10;
    }
  }
  if (at < s.size() && (s[at] == 'Z' || s[at] == 'z') && at + 1 == s.size()) return ms;
  int hours = 0, minutes = 0;
  if (at < s.size() && (s[at] == '+' || s[at] == '-') &&
      std::sscanf(s.c_str() + at + 1, "%2d:%2d", &hours, &minutes) == 2 && at + 6 == s.size()) {
    const int64_t offset = (hours * 60 + minutes) * 60'000;
    return s[at] == '+' ? ms - offset : ms + offset;
  }
  return std::nullopt;
}

void LifecycleClient::pause_or_resume(const std::string& id, bool pause,
                                      std::chrono::milliseconds timeout,
                                      const sdk::CancelToken& cancel) {
  const std::string what =
      std::string("OpenSandbox ") + (pause ? "pause" : "resume") + " of sandbox " + id;
  sdk::http::Request request;
  request.method = "POST";
  request.target = "/sandboxes/" + sdk::http::url_encode(id) + (pause ? "/pause" : "/resume");
  request.timeout = timeout;
  request.idempotent = true;  // asking twice leaves the same state
  const auto response = send(std::move(request), cancel);
  if (response.status >= 200 && response.status < 300) return;
  const auto error = parse_api_error(response);
  if (error.status == 409) {
    // Already in the state asked for? (The server answers 409 to pausing a paused sandbox.)
    std::string now = state(id, timeout, cancel);
    for (char& c : now)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (now == (pause ? "paused" : "running")) return;
  }
  throw to_error(error, what, kRetryableStatuses.contains(error.status) && error.status != 409);
}

int64_t LifecycleClient::renew(const std::string& id, int64_t expires_at_unix_ms,
                               std::chrono::milliseconds timeout, const sdk::CancelToken& cancel) {
  sdk::http::Request request;
  request.method = "POST";
  request.target = "/sandboxes/" + sdk::http::url_encode(id) + "/renew-expiration";
  request.headers = {{"Content-Type", "application/json"}};
  request.body = json::serialize(json::object{{"expiresAt", format_rfc3339(expires_at_unix_ms)}});
  request.timeout = timeout;
  request.idempotent = true;  // setting the same expiry twice is harmless
  const auto response = send(std::move(request), cancel);
  if (response.status != 200) {
    throw_answer(response, "OpenSandbox renew of sandbox " + id, /*conflict_final=*/true);
  }
  boost::system::error_code ec;
  const auto answer = json::parse(response.body, ec);
  if (!ec && answer.is_object()) {
    const auto* at = answer.get_object().if_contains("expiresAt");
    if (at && at->is_string()) {
      if (const auto parsed = parse_rfc3339(at->get_string())) return *parsed;
    }
  }
  return expires_at_unix_ms;
}

}  // namespace sbx::opensandbox
