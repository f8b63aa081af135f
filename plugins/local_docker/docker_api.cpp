#include "docker_api.hpp"

#include <boost/json/parse.hpp>

#include <charconv>

namespace sbx::local_docker {
namespace {

// The daemon is local: a connect that takes longer than this means it is not answering.
constexpr std::chrono::milliseconds kConnectTimeout{5'000};

std::string seconds_text(std::chrono::milliseconds ms) {
  const double s = static_cast<double>(ms.count()) / 1000.0;
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, s);
  return ec == std::errc() ? std::string(buffer, end) : std::to_string(ms.count() / 1000);
}

std::string string_member(const boost::json::object& object, std::string_view key) {
  const auto* value = object.if_contains(key);
  return value && value->is_string() ? std::string(value->get_string()) : std::string();
}

}  // namespace

std::optional<ApiVersion> ApiVersion::parse(std::string_view text) {
  const size_t dot = text.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == text.size()) return std::nullopt;
  ApiVersion v;
  const char* first = text.data();
  const char* end = text.data() + text.size();
  auto major = std::from_chars(first, first + dot, v.major);
  auto minor = std::from_chars(first + dot + 1, end, v.minor);
  if (major.ec != std::errc() || major.ptr != first + dot || minor.ec != std::errc() ||
      minor.ptr != end) {
    return std::nullopt;
  }
  return v;
}

DockerApi::DockerApi(ApiOptions options, sdk::Logger log)
    : options_(std::move(options)),
      log_(log),
      client_(http::ClientOptions{.base_url = "http://docker",
                                  .unix_socket = options_.socket,
                                  .connect_timeout = kConnectTimeout,
                                  .max_connections = options_.max_connections,
                                  .user_agent = "sbx-local_docker/0.1.0"}) {
  if (options_.api_version) version_ = *options_.api_version;
}

sdk::Error DockerApi::unreachable(const sdk::Error& cause) const {
  return sdk::Error::unavailable("the Docker daemon is not reachable at unix socket " +
                                 options_.socket +
                                 " (is dockerd running? set \"socket\" in the "
                                 "local_docker config or DOCKER_HOST=unix://...): " +
                                 cause.what());
}

DockerApi::Negotiated DockerApi::choose_version(const http::Response& response) const {
  if (response.status != 200) throw api_error(response.status, response.body, "GET /version");
  const auto body = parse_body(response.body, "GET /version");
  const std::string daemon_text = string_member(body, "ApiVersion");
  const auto daemon = ApiVersion::parse(daemon_text);
  if (!daemon) {
    throw sdk::Error::internal("GET /version: the daemon reported no usable ApiVersion ('" +
                               shorten(daemon_text, 40) + "')");
  }
  const std::string engine = string_member(body, "Version");
  if (*daemon < kOldestApi) {
    throw sdk::Error::failed_precondition("the Docker daemon at " + options_.socket + " (Docker " +
                                          engine + ") speaks Engine API " + daemon->text() +
                                          ", older than the oldest local_docker supports (" +
                                          kOldestApi.text() + ", Docker 19.03)");
  }
  const ApiVersion chosen = *daemon < kNewestApi ? *daemon : kNewestApi;
  if (const auto minimum = ApiVersion::parse(string_member(body, "MinAPIVersion"));
      minimum && chosen < *minimum) {
    throw sdk::Error::failed_precondition("the Docker daemon at " + options_.socket + " (Docker " +
                                          engine + ") requires Engine API " + minimum->text() +
                                          " or newer; local_docker speaks up to " +
                                          kNewestApi.text());
  }
  return {chosen.text(), engine, daemon->text()};
}

std::string DockerApi::version(const sdk::CancelToken& cancel) {
  http::Call call;
  uint64_t number = 0;
  {
    std::lock_guard lock(version_mutex_);
    if (!version_.empty()) return version_;
    if (!negotiation_) {
      // Not tied to this caller's cancellation: others may wait for it too. The request timeout
      // bounds it.
      http::Request request;
      request.target = "/version";
      request.timeout = options_.request_timeout;
      negotiation_ = client_.start(std::move(request));
      ++negotiation_number_;
    }
    call = *negotiation_;
    number = negotiation_number_;
  }
  while (!call.wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(50))) {
    sdk::throw_if_cancelled(cancel);
  }
  Negotiated chosen;
  try {
    try {
      chosen = choose_version(call.get());
    } catch (const sdk::Error& e) {
      if (e.status() == SBX_STATUS_UNAVAILABLE) throw unreachable(e);
      if (e.status() == SBX_STATUS_TIMEOUT) {
        throw sdk::Error::timeout("the Docker daemon at " + options_.socket +
                                  " did not answer GET /version within " +
                                  seconds_text(options_.request_timeout) + " s");
      }
      throw;
    }
  } catch (...) {
    // Not remembered (the daemon may come up later): the next caller starts a new negotiation.
    std::lock_guard lock(version_mutex_);
    if (negotiation_ && negotiation_number_ == number) negotiation_.reset();
    throw;
  }
  bool first = false;
  {
    std::lock_guard lock(version_mutex_);
    if (version_.empty()) {
      version_ = chosen.api;
      first = true;
    }
    if (negotiation_ && negotiation_number_ == number) negotiation_.reset();
  }
  if (first) {
    log_.info("Docker ", chosen.engine, " at ", options_.socket, ": using Engine API ", chosen.api,
              " (daemon ", chosen.daemon_api, ")");
  }
  return chosen.api;
}

std::string DockerApi::versioned(std::string_view target, const sdk::CancelToken& cancel) {
  return "/v" + version(cancel) + std::string(target);
}

http::Response DockerApi::send(http::Request request, const sdk::CancelToken& cancel) {
  request.target = versioned(request.target, cancel);
  if (request.timeout.count() == 0) request.timeout = options_.request_timeout;
  const std::string described = request.method + " " + request.target;
  const auto timeout = request.timeout;
  try {
    return client_.send(std::move(request), cancel);
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_UNAVAILABLE) throw unreachable(e);
    if (e.status() == SBX_STATUS_TIMEOUT) {
      throw sdk::Error::timeout("the Docker daemon did not answer " + described + " within " +
                                seconds_text(timeout) + " s");
    }
    throw;
  }
}

http::Response DockerApi::call(std::string method, std::string target, std::string body,
                               std::string_view what, const sdk::CancelToken& cancel,
                               std::chrono::milliseconds timeout) {
  http::Request request;
  request.method = std::move(method);
  request.target = std::move(target);
  if (!body.empty()) {
    request.body = std::move(body);
    request.headers.emplace_back("Content-Type", "application/json");
  }
  request.timeout = timeout;
  http::Response response = send(std::move(request), cancel);
  if (response.status >= 400) throw api_error(response.status, response.body, what);
  return response;
}

http::Call DockerApi::start(http::Request request, const sdk::CancelToken& cancel) {
  request.target = versioned(request.target, cancel);
  return client_.start(std::move(request));
}

http::Response DockerApi::finish(const http::Call& call) const {
  try {
    return call.get();
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_UNAVAILABLE) throw unreachable(e);
    throw;
  }
}

void BodyRouter::attach(http::Request& request) {
  request.on_headers = [this](long status, const http::Headers&) { status_ = status; };
  if (request.pull_body_limit == 0) {
    request.on_body = [this](std::string_view bytes) { route(bytes); };
  }
}

void BodyRouter::route(std::string_view bytes) {
  constexpr size_t kMaxErrorBody = 64 * 1024;
  if (status_ == 200) {
    feed_(bytes);
  } else if (error_body_.size() < kMaxErrorBody) {
    error_body_.append(bytes);
  }
}

std::string shorten(std::string_view text, size_t limit) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + "...";
}

std::string docker_message(std::string_view body) {
  boost::system::error_code ec;
  const auto value = boost::json::parse(body, ec);
  if (!ec && value.is_object()) {
    const std::string message = string_member(value.get_object(), "message");
    if (!message.empty()) return shorten(message);
  }
  return body.empty() ? std::string("(empty response)") : shorten(body);
}

sdk::Error api_error(long status, std::string_view body, std::string_view what) {
  const std::string message =
      std::string(what) + ": " + docker_message(body) + " (HTTP " + std::to_string(status) + ")";
  sdk::ErrorDetails details;
  details.http_status = static_cast<int32_t>(status);
  sbx_status code = SBX_STATUS_INTERNAL;
  if (status == 400) {
    code = SBX_STATUS_INVALID_ARGUMENT;
  } else if (status == 401 || status == 403) {
    code = SBX_STATUS_PERMISSION_DENIED;
  } else if (status == 404) {
    code = SBX_STATUS_NOT_FOUND;
    // The container itself is gone (not a file, an image or an exec of it).
    if (docker_message(body).find("No such container") != std::string::npos) {
      details.reason = SBX_REASON_SANDBOX_GONE;
    }
  } else if (status == 409) {
    code = SBX_STATUS_FAILED_PRECONDITION;
  } else if (status >= 502 && status <= 504) {
    code = SBX_STATUS_UNAVAILABLE;
    details.retryable = true;
  } else if (status >= 500) {
    details.retryable = true;  // the daemon hit trouble; the same call may well succeed later
  }
  return sdk::Error(code, message, details);
}

boost::json::object parse_body(std::string_view body, std::string_view what) {
  boost::system::error_code ec;
  auto value = boost::json::parse(body, ec);
  if (ec || !value.is_object()) {
    throw sdk::Error::internal(
        std::string(what) + ": unexpected response from the Docker daemon: " + shorten(body, 200));
  }
  return std::move(value.get_object());
}

}  // namespace sbx::local_docker
