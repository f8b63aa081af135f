// Helpers of the route files: responses, the error envelopes, times, request ids (state.hpp).

#include "state.hpp"

#include <sbx/base/time.hpp>
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

std::optional<int64_t> integer_of(const boost::json::value& v) {
  if (v.is_int64()) return v.as_int64();
  if (v.is_uint64() && v.as_uint64() <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(v.as_uint64());
  }
  return std::nullopt;
}

Response error_response(const Request& request, http::status status, const std::string& code,
                        const std::string& message) {
  return json_response(request, status, boost::json::object{{"code", code}, {"message", message}});
}

bool sandbox_gone(const sbx::Error& error) {
  return error.status() == SBX_STATUS_NOT_FOUND && error.reason() == SBX_REASON_SANDBOX_GONE;
}

bool sandbox_gone(const sbx::Error& error, Entry& entry) {
  if (!sandbox_gone(error)) return false;
  entry.not_running = true;
  return true;
}

Response sandbox_gone_response(const Request& request, const sbx::Error& error,
                               const std::string& sandbox_id) {
  return error_response(request, http::status::conflict, "DOCKER::SANDBOX_NOT_RUNNING",
                        "Sandbox " + sandbox_id + " is not running: " + error.what());
}

Response provider_error_response(const Request& request, std::exception_ptr error,
                                 const std::string& sandbox_id) {
  const sbx::Error e = sbx::to_error(error);
  if (sandbox_gone(e)) return sandbox_gone_response(request, e, sandbox_id);
  if (e.create_failure() && e.reason() == SBX_REASON_IMAGE_PULL_FAILED) {
    return error_response(request, http::status::internal_server_error,
                          "DOCKER::SANDBOX_IMAGE_PULL_FAILED", e.what());
  }
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
    case SBX_STATUS_PERMISSION_DENIED:
      // A create asking for what the operator did not allow (a host path, a named volume, a
      // GPU): the real server's envelope for a host path outside its allowed_host_paths, else
      // a plain refusal.
      if (!e.create_failure()) break;
      if (std::string_view(e.what()).find("host path") != std::string_view::npos) {
        return error_response(request, http::status::bad_request, "VOLUME::HOST_PATH_NOT_ALLOWED",
                              e.what());
      }
      return error_response(request, http::status::forbidden, "SANDBOX::PERMISSION_DENIED",
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
  const long long fraction = static_cast<long long>(((us % 1000000) + 1000000) % 1000000);
  // pydantic leaves the fraction out when it is zero ("2026-12-01T01:00:00Z").
  if (fraction == 0) {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  } else {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, fraction);
  }
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

std::optional<std::string> percent_decode(std::string_view text, bool form) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+' && form) {
      out += ' ';
    } else if (c == '%') {
      if (i + 2 >= text.size() || hex(text[i + 1]) < 0 || hex(text[i + 2]) < 0) {
        return std::nullopt;
      }
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> query_params(const Request& request) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string_view target = request.target();
  const auto q = target.find('?');
  if (q == std::string_view::npos) return out;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view field = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    if (field.empty()) continue;
    const auto eq = field.find('=');
    // As Starlette: a malformed escape is kept as it is; a field without '=' has an empty value.
    const std::string_view name = field.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : field.substr(eq + 1);
    out.emplace_back(percent_decode(name, true).value_or(std::string(name)),
                     percent_decode(value, true).value_or(std::string(value)));
  }
  return out;
}

ParsedTime parse_time(std::string_view t) {
  // The checks and messages of speedate, the parser pydantic uses, for the common mistakes.
  auto digits = [&](std::size_t at, std::size_t n, int& value) {
    value = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (i >= t.size() || t[i] < '0' || t[i] > '9') return false;
      value = value * 10 + (t[i] - '0');
    }
    return true;
  };
  auto fail = [](std::string error) { return ParsedTime{std::nullopt, std::move(error)}; };
  if (t.size() < 10) return fail("input is too short");
  int year = 0, month = 0, day = 0;
  if (!digits(0, 4, year)) return fail("invalid character in year");
  if (t[4] != '-') return fail("invalid date separator, expected `-`");
  if (!digits(5, 2, month)) return fail("invalid character in month");
  if (t[7] != '-') return fail("invalid date separator, expected `-`");
  if (!digits(8, 2, day)) return fail("invalid character in day");
  if (month < 1 || month > 12) return fail("month value is outside expected range of 1-12");
  const std::chrono::year_month_day date{std::chrono::year{year},
                                         std::chrono::month{static_cast<unsigned>(month)},
                                         std::chrono::day{static_cast<unsigned>(day)}};
  if (!date.ok()) return fail("day value is outside expected range");
  // Microseconds hold years 0001-9999 without overflow; system_clock (nanoseconds) does not.
  std::chrono::sys_time<std::chrono::microseconds> at = std::chrono::sys_days{date};
  auto done = [](std::chrono::sys_time<std::chrono::microseconds> us) {
    const auto time =
        sbx::base::add_checked(std::chrono::system_clock::time_point{}, us.time_since_epoch());
    if (!time) return ParsedTime{std::nullopt, "", us.time_since_epoch().count() < 0 ? -1 : 1};
    return ParsedTime{*time, ""};
  };
  if (t.size() == 10) return done(at);  // a date alone: midnight UTC
  const char sep = t[10];
  if (sep != 'T' && sep != 't' && sep != '_' && sep != ' ') {
    return fail("invalid datetime separator, expected `T`, `t`, `_` or space");
  }
  std::size_t i = 11;
  int hour = 0, minute = 0, second = 0;
  if (t.size() < i + 5) return fail("input is too short");
  if (!digits(i, 2, hour)) return fail("invalid character in hour");
  if (t[i + 2] != ':') return fail("invalid time separator, expected `:`");
  if (!digits(i + 3, 2, minute)) return fail("invalid character in minute");
  i += 5;
  long long micros = 0;
  if (i < t.size() && t[i] == ':') {
    if (!digits(i + 1, 2, second)) return fail("invalid character in second");
    i += 3;
    if (i < t.size() && (t[i] == '.' || t[i] == ',')) {
      ++i;
      int n = 0;
      while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
        if (n < 6) micros = micros * 10 + (t[i] - '0');
        ++n, ++i;
      }
      if (n == 0) return fail("invalid character in second fraction");
      for (int k = n; k < 6; ++k)
        micros *= 10;
    }
  }
  if (hour > 23) return fail("hour value is outside expected range of 0-23");
  if (minute > 59) return fail("minute value is outside expected range of 0-59");
  if (second > 59) return fail("second value is outside expected range of 0-59");
  at += std::chrono::hours(hour) + std::chrono::minutes(minute) + std::chrono::seconds(second) +
        std::chrono::microseconds(micros);
  if (i < t.size()) {  // a zone; none means UTC (the real server treats naive times as UTC)
    if (t[i] == 'Z' || t[i] == 'z') {
      ++i;
    } else if (t[i] == '+' || t[i] == '-') {
      const int sign = t[i] == '+' ? 1 : -1;
      int oh = 0, om = 0;
      if (!digits(i + 1, 2, oh)) return fail("invalid timezone hour");
      i += 3;
      if (i < t.size() && t[i] == ':') ++i;
      if (i < t.size()) {
        if (!digits(i, 2, om)) return fail("invalid timezone minute");
        i += 2;
      }
      if (oh > 23 || om > 59) return fail("timezone offset must be less than 24 hours");
      at -= sign * (std::chrono::hours(oh) + std::chrono::minutes(om));
    } else {
      return fail("invalid timezone sign");
    }
  }
  if (i != t.size()) return fail("unexpected extra characters at the end of the input");
  return done(at);
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

std::vector<std::string> query_values(const Request& request, const std::string& name) {
  std::vector<std::string> out;
  for (auto& [key, value] : query_params(request)) {
    if (key == name) out.push_back(std::move(value));
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
