// Durations and deadlines that cannot overflow. Configs and specs may carry any non-negative value
// ("a year", 1e300 seconds); arithmetic on std::chrono types with such values is undefined, so
// every conversion and deadline in the SDK and its plugins goes through these. THREADING: pure
// functions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

namespace sbx::sdk {

// Longer than any real timeout; what a larger value is cut down to (about 31 years).
inline constexpr std::chrono::milliseconds kForever{1'000'000'000'000};

// `seconds` rounded up to whole milliseconds, at most kForever; NaN and negatives become zero.
inline std::chrono::milliseconds seconds_to_ms(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  const double ms = std::ceil(seconds * 1000.0);
  if (ms >= static_cast<double>(kForever.count())) return kForever;
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

// Now plus `timeout`, with `timeout` cut down to kForever.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + std::min(timeout, kForever);
}

}  // namespace sbx::sdk
