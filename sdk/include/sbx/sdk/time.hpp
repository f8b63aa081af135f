// Durations and deadlines that cannot overflow. Configs and specs may carry any non-negative value
// ("a year", 1e300 seconds); arithmetic on std::chrono types with such values is undefined, so
// every conversion and deadline in the SDK and its plugins goes through these. The conversions are
// the layer-neutral ones of <sbx/base/time.hpp>. THREADING: pure functions.
//
// deadline_after() is on std::chrono::steady_clock, for bounding OS waits (a socket, a condition
// variable another thread signals) that no test clock can shorten. Deadlines that decide
// behaviour (retries, probes) are measured on the host's clock instead: see <sbx/sdk/clock.hpp>.
#pragma once

#include <sbx/base/time.hpp>

#include <algorithm>
#include <chrono>

namespace sbx::sdk {

using ::sbx::base::kForever;
using ::sbx::base::seconds_to_ms;

// Now plus `timeout` on steady_clock, with `timeout` cut down to kForever.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + std::min(timeout, kForever);
}

}  // namespace sbx::sdk
