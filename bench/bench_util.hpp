// What the benchmarks share: a steady clock, medians and percentiles, and a fixed-time
// throughput run over client threads. Header-only; each benchmark is one program.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace sbx::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// `threads` threads, each running `one(i)` in a loop until `seconds` are up; returns the runs per
// second. A run that returns false or throws stops every thread, and the whole call throws
// std::runtime_error.
inline double throughput(int threads, double seconds, const std::function<bool(int)>& one) {
  std::atomic<long> done{0};
  std::atomic<bool> failed{false};
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        while (Clock::now() < deadline && !failed) {
          if (!one(t)) {
            failed = true;
            return;
          }
          ++done;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "a run failed: %s\n", e.what());
        failed = true;
      }
    });
  }
  for (auto& th : pool)
    th.join();
  if (failed) throw std::runtime_error("a run failed during the throughput measurement");
  return static_cast<double>(done.load()) / (ms_since(start) / 1000.0);
}

}  // namespace sbx::bench
