// Request counts and latencies for GET /metrics (Prometheus text format, version 0.0.4): per route
// (the fault plan's route keys, e.g. "GET /sandboxes/{id}", "POST /command"; "other" for the rest)
// and HTTP status. Latency runs from a request's arrival to its answer's head (for an event stream
// or a download, the head, not the end).
//
// THREADING: thread-safe (one mutex; recording is a map lookup and a few additions).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace sbx::serve {

class RequestMetrics {
 public:
  static constexpr std::array<double, 11> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,    2.5,   5,    10};

  // `error_type`: for an answer of 400 or more, its envelope's code ("DOCKER::SANDBOX_NOT_FOUND",
  // "MISSING_API_KEY", "VALIDATION" for FastAPI's 422 detail list, "HTTP_404" for a bare
  // {"detail"}); counted in sbx_serve_errors_total{route,type}.
  void record(const std::string& route, int status, double seconds,
              const std::string& error_type = {});
  // The request families: sbx_serve_requests_total{route,code},
  // sbx_serve_request_duration_seconds{route} (a histogram) and sbx_serve_errors_total{route,type}.
  std::string prometheus() const;

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> buckets{};  // cumulative when printed
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, Histogram> latency_;
  std::map<std::pair<std::string, std::string>, uint64_t> errors_;
};

// `text` as a Prometheus label value ("\\", "\"" and newlines escaped).
std::string prometheus_label(const std::string& text);

}  // namespace sbx::serve
