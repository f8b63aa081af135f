#include "metrics.hpp"

#include <fmt/format.h>

namespace sbx::serve {

void RequestMetrics::record(const std::string& route, int status, double seconds,
                            const std::string& error_type) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
  if (!error_type.empty()) ++errors_[{route, error_type}];
  Histogram& h = latency_[route];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++h.buckets[i];
      break;
    }
  }
  ++h.count;
  h.sum += seconds;
}

std::string RequestMetrics::prometheus() const {
  std::lock_guard lock(mutex_);
  std::string out =
      "# HELP sbx_serve_requests_total Requests answered, by route and HTTP status.\n"
      "# TYPE sbx_serve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("sbx_serve_requests_total{{route=\"{}\",code=\"{}\"}} {}\n",
                       prometheus_label(key.first), key.second, n);
  }
  out +=
      "# HELP sbx_serve_request_duration_seconds From a request's arrival to its answer's head.\n"
      "# TYPE sbx_serve_request_duration_seconds histogram\n";
  for (const auto& [route, h] : latency_) {
    const std::string label = prometheus_label(route);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      out += fmt::format("sbx_serve_request_duration_seconds_bucket{{route=\"{}\",le=\"{}\"}} {}\n",
                         label, kBuckets[i], cumulative);
    }
    out += fmt::format("sbx_serve_request_duration_seconds_bucket{{route=\"{}\",le=\"+Inf\"}} {}\n",
                       label, h.count);
    out += fmt::format("sbx_serve_request_duration_seconds_sum{{route=\"{}\"}} {}\n", label, h.sum);
    out += fmt::format("sbx_serve_request_duration_seconds_count{{route=\"{}\"}} {}\n", label,
                       h.count);
  }
  out +=
      "# HELP sbx_serve_errors_total Answers of 400 or more, by route and the envelope's code.\n"
      "# TYPE sbx_serve_errors_total counter\n";
  for (const auto& [key, n] : errors_) {
    out += fmt::format("sbx_serve_errors_total{{route=\"{}\",type=\"{}\"}} {}\n",
                       prometheus_label(key.first), prometheus_label(key.second), n);
  }
  return out;
}

std::string prometheus_label(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace sbx::serve
