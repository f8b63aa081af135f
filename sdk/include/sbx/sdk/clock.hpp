// The host's clock, as the SDK and plugins measure behaviour with it. sbx_host::now_ns exists so a
// host can test time-dependent behaviour; every deadline that decides what a plugin does (a retry's
// backoff, a readiness probe's deadline, an expiry computed from a TTL) is read from here, not from
// std::chrono::steady_clock. A test host (sbx/sdk/testing/fake_host.hpp) can then advance the
// clock and see the plugin act without sleeping.
//
// OS waits that another party ends (a socket read, a thread's condition variable) stay on
// steady_clock (sbx/sdk/time.hpp deadline_after): a fake clock cannot make a daemon answer sooner.
// Waits whose only purpose is to let time pass go through sleep_until() below.
//
// THREADING: every function is thread-safe.
#pragma once

#include <sbx/sdk/cancel.hpp>

#include <chrono>
#include <cstdint>

namespace sbx::sdk {

// A std::chrono clock over the host's now_ns: the plugin-wide host given to init (plugin_host()),
// or std::chrono::steady_clock when there is none (before init, in code run without a host) or
// the host's now_ns is NULL.
struct HostClock {
  using rep = int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<HostClock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept;
};

// HostClock::now().
inline HostClock::time_point now() noexcept {
  return HostClock::now();
}

// Now plus `timeout` on the host's clock, with `timeout` cut down to kForever (sbx/sdk/time.hpp).
HostClock::time_point host_deadline_after(std::chrono::milliseconds timeout) noexcept;

// Returns once the host's clock reads `until` or later. Throws Error::cancelled() as soon as
// `cancel` is requested, also before `until`. It waits on a condition variable that
// notify_clock_changed() wakes, and otherwise re-reads the clock at least every 100 ms of real
// time (so a fake clock advanced by a host that cannot call notify_clock_changed() of this copy of
// the SDK, a plugin .so's own, is seen within that), never sleeping longer than the time left.
void sleep_until(HostClock::time_point until, const CancelToken& cancel);

// Wakes every sleep_until() of this copy of the SDK to re-read the clock. A host whose clock jumps
// (a test's fake clock) calls it after each change.
void notify_clock_changed() noexcept;

}  // namespace sbx::sdk
