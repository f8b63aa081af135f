// Helpers of the route files: responses, the error envelopes, times, request ids (state.hpp).

#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <boost/json/serialize.hpp>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cctype>
#include <cstdio>
#include <ctime>
#include <random>
#include <stdexcept>

namespace sbx::serve {

Response json_response(const Request& request, http::status status,
                       const boost::json::value& body) {
  Response response{status, request.version()};
  response.set(http::field::content_type, "application/json");
  response.body() = boost::json::serialize(body);
  response.prepare_payload();
  return response;
}

Response empty_response(const Request& request, http::status status) {
  Response response{status, request.version()};
  // 204 carries no Content-Length, as the real server's; others say 0.
  if (status != http::status::no_content) response.prepare_payload();
  return response;
}

Response error_response(const Request& request, http::status status, const std::string& code,
                        const std::string& message) {
  return json_response(request, status, boost::json::object{{"code", code}, {"message", message}});
}

Response provider_error_response(const Request& request, std::exception_ptr error,
                                 const std::string& sandbox_id) {
  const sbx::Error e = sbx::to_error(error);
  switch (e.status()) {
    case SBX_STATUS_NOT_FOUND:
      if (!e.create_failure()) {
        return error_response(request, http::status::not_found, "DOCKER::SANDBOX_NOT_FOUND",
                              "Sandbox " + sandbox_id + " not found.");
      }
      break;
    case SBX_STATUS_INVALID_ARGUMENT:
      return error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                            e.what());
    case SBX_STATUS_FAILED_PRECONDITION:
      return error_response(request, http::status::conflict, "SANDBOX::INVALID_STATE", e.what());
    case SBX_STATUS_UNIMPLEMENTED:
      return error_response(request, http::status::not_implemented, "SANDBOX::API_NOT_SUPPORTED",
                            e.what());
    case SBX_STATUS_CANCELLED:
      return error_response(request, http::status::service_unavailable, "SANDBOX::SERVER_STOPPING",
                            e.what());
    case SBX_STATUS_UNAVAILABLE:
    case SBX_STATUS_RESOURCE_EXHAUSTED:
      return error_response(request, http::status::service_unavailable,
                            "SANDBOX::PROVIDER_UNAVAILABLE", e.what());
    default:
      break;
  }
  if (e.create_failure()) {
    return error_response(request, http::status::internal_server_error,
                          "DOCKER::SANDBOX_START_FAILED", e.what());
  }
  return error_response(request, http::status::internal_server_error, "GENERAL::UNKNOWN_ERROR",
                        e.what());
}

std::string format_time(std::chrono::system_clock::time_point t) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(us % 1000000));
  return buf;
}

std::string new_request_id() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(engine()),
                static_cast<unsigned long long>(engine()));
  return buf;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer string is looked at whatever the contents: the time depends on the
  // lengths only.
  const std::size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

std::string route_path(const Request& request) {
  const std::string_view target = request.target();
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/v1" || path.substr(0, 4) == "/v1/") path = path.substr(3);
  return path.empty() ? std::string("/") : std::string(path);
}

std::string execd_access_token(const Options& options, const std::string& sandbox_id) {
  if (!options.api_key) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  const auto& key = *options.api_key;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(sandbox_id.data()), sandbox_id.size(), digest,
           &size) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * size);
  for (unsigned int i = 0; i < size; ++i) {
    token += hex[digest[i] >> 4];
    token += hex[digest[i] & 0xf];
  }
  return token;
}

std::optional<ExecdTarget> execd_target(const Request& request) {
  const std::string_view target = request.target();
  std::string_view path = target.substr(0, target.find('?'));
  ExecdTarget out;
  if (path.substr(0, 4) == "/v1/") {
    out.server_proxy = true;
    path = path.substr(3);
  }
  constexpr std::string_view prefix = "/sandboxes/";
  if (path.substr(0, prefix.size()) != prefix) return std::nullopt;
  path = path.substr(prefix.size());
  const auto slash = path.find('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  out.sandbox_id = std::string(path.substr(0, slash));
  path = path.substr(slash);
  constexpr std::string_view proxy = "/proxy/";
  if (path.substr(0, proxy.size()) != proxy) return std::nullopt;
  path = path.substr(proxy.size());
  const auto end = path.find('/');
  out.port = std::string(path.substr(0, end));
  if (out.port.empty()) return std::nullopt;
  out.rest = end == std::string_view::npos ? std::string("/") : std::string(path.substr(end));
  return out;
}

namespace {

std::string percent_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '+') {
      out += ' ';
    } else if (c == '%' && i + 2 < in.size() + 0 &&
               std::isxdigit(static_cast<unsigned char>(in[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> query_values(const Request& request, const std::string& name) {
  std::vector<std::string> out;
  const std::string_view target = request.target();
  const auto q = target.find('?');
  if (q == std::string_view::npos) return out;
  std::string_view query = target.substr(q + 1);
  while (true) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const auto eq = pair.find('=');
    if (percent_decode(pair.substr(0, eq)) == name) {
      out.push_back(eq == std::string_view::npos ? std::string()
                                                 : percent_decode(pair.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
  return out;
}

Response execd_error(const Request& request, http::status status, const std::string& code,
                     const std::string& message) {
  Response r =
      json_response(request, status, boost::json::object{{"code", code}, {"message", message}});
  r.set(http::field::content_type, "application/json; charset=utf-8");
  return r;
}

}  // namespace sbx::serve
