// Durations that cannot overflow. Configs and specs may carry any non-negative value ("a year",
// 1e300 seconds); arithmetic on std::chrono types with such values is undefined, so every
// conversion in the host, the SDK and its plugins goes through these. Layer-neutral (sbx::base).
// THREADING: pure functions.
#pragma once

#include <chrono>
#include <cmath>

namespace sbx::base {

// Longer than any real timeout; what a larger value is cut down to (about 31 years).
inline constexpr std::chrono::milliseconds kForever{1'000'000'000'000};

// `seconds` rounded up to whole milliseconds, at most kForever; NaN and negatives become zero.
inline std::chrono::milliseconds seconds_to_ms(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  const double ms = std::ceil(seconds * 1000.0);
  if (ms >= static_cast<double>(kForever.count())) return kForever;
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

}  // namespace sbx::base
