#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/plugin.hpp>
#include <sbx/sdk/time.hpp>

#include "immortal.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace sbx::sdk {
namespace {

// One condition variable for every sleeper: notify_clock_changed() must reach all of them, and
// sleeps are rare (between retries and probe attempts) so sharing costs nothing worth measuring.
struct Sleepers {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t generation = 0;  // bumped by notify_clock_changed() and by every cancellation
};
Sleepers& sleepers() {
  return detail::immortal<Sleepers>();  // a plugin thread may still sleep while the process exits
}

constexpr std::chrono::milliseconds kRecheck{100};

}  // namespace

HostClock::time_point HostClock::now() noexcept {
  const sbx_host* host = plugin_host();
  if (host && SBX_HAS_FIELD(host, sbx_host, now_ns) && host->now_ns) {
    return time_point(duration(host->now_ns(host)));
  }
  return time_point(
      std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch()));
}

HostClock::time_point host_deadline_after(std::chrono::milliseconds timeout) noexcept {
  return HostClock::now() + std::clamp(timeout, std::chrono::milliseconds(0), kForever);
}

void sleep_until(HostClock::time_point until, const CancelToken& cancel) {
  Sleepers& s = sleepers();
  bool cancelled = false;
  // Declared after what it touches: its destructor waits for a callback running on another
  // thread, so nothing it uses goes away under it.
  std::stop_callback on_cancel(cancel, [&] {
    std::lock_guard lock(s.mutex);
    cancelled = true;
    ++s.generation;
    s.changed.notify_all();
  });
  std::unique_lock lock(s.mutex);
  for (;;) {
    if (cancelled) throw Error::cancelled();
    const auto left = until - HostClock::now();
    if (left <= HostClock::duration::zero()) return;
    const uint64_t seen = s.generation;
    const auto wait = std::min<std::chrono::nanoseconds>(left, kRecheck);
    s.changed.wait_for(lock, wait, [&] { return cancelled || s.generation != seen; });
  }
}

void notify_clock_changed() noexcept {
  Sleepers& s = sleepers();
  {
    std::lock_guard lock(s.mutex);
    ++s.generation;
  }
  s.changed.notify_all();
}

}  // namespace sbx::sdk
