// Durations that cannot overflow. Configs and specs may carry any non-negative value ("a year",
// 1e300 seconds); arithmetic on std::chrono types with such values is undefined, so every
// conversion in the host, the SDK and its plugins goes through these. Layer-neutral (sbx::base).
// THREADING: pure functions.
#pragma once

#include <chrono>
#include <cmath>
#include <optional>

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

// `seconds` rounded up to whole milliseconds, or nullopt when it is NaN, negative or longer than
// kForever: for inputs that are refused when out of range rather than cut down (flags, requests).
inline std::optional<std::chrono::milliseconds> seconds_to_ms_checked(double seconds) {
  if (!(seconds >= 0)) return std::nullopt;
  const double ms = std::ceil(seconds * 1000.0);
  if (!(ms <= static_cast<double>(kForever.count()))) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

// `t + d`, or nullopt when the sum would leave the range of `t`'s type (either way) or `d` is
// NaN. Exact when it fits (a floating `d` is truncated to `t`'s unit); a sum within a millionth
// of the range's ends counts as outside (the check is made on doubles).
template <class Clock, class Duration, class Rep, class Period>
std::optional<std::chrono::time_point<Clock, Duration>> add_checked(
    std::chrono::time_point<Clock, Duration> t, std::chrono::duration<Rep, Period> d) {
  using Point = std::chrono::time_point<Clock, Duration>;
  const double want = std::chrono::duration<double, typename Duration::period>(d).count();
  const double sum = static_cast<double>(t.time_since_epoch().count()) + want;
  const double top = static_cast<double>(Point::max().time_since_epoch().count()) * (1 - 1e-6);
  const double bottom = static_cast<double>(Point::min().time_since_epoch().count()) * (1 - 1e-6);
  if (!(sum <= top && sum >= bottom)) return std::nullopt;
  return t + std::chrono::duration_cast<Duration>(d);
}

}  // namespace sbx::base
