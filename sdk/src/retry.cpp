#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/retry.hpp>

#include <algorithm>
#include <random>

namespace sbx::sdk {
namespace {

std::mt19937_64& random_engine() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return engine;
}

}  // namespace

std::chrono::milliseconds RetryPolicy::delay_after(int attempt) const {
  int64_t initial = std::max<int64_t>(initial_delay.count(), 0);
  int64_t cap = std::max<int64_t>(max_delay.count(), 0);
  // initial * 2^(attempt-1), stopping the doubling once it reaches the cap (and before overflow).
  int64_t ceiling = std::min(initial, cap);
  for (int i = 1; i < attempt && ceiling < cap; ++i)
    ceiling = std::min(ceiling * 2, cap);
  std::uniform_int_distribution<int64_t> uniform(0, ceiling);
  return std::chrono::milliseconds(uniform(random_engine()));
}

void retry(const RetryPolicy& policy, const std::function<void()>& fn, const CancelToken& cancel,
           const std::function<bool(const Error&)>& is_retryable,
           const std::function<void(int, const Error&, std::chrono::milliseconds)>& on_retry) {
  const int attempts = std::max(policy.retries, 0) + 1;
  for (int attempt = 1;; ++attempt) {
    throw_if_cancelled(cancel);
    try {
      fn();
      return;
    } catch (const Error& error) {
      // A cancellation is never retried, whatever the classifier says.
      bool retryable = error.status() != SBX_STATUS_CANCELLED &&
                       (is_retryable ? is_retryable(error) : error.retryable());
      if (!retryable || attempt >= attempts) throw;
      const auto delay = policy.delay_after(attempt);
      // The deadline is taken before on_retry, so that a test that advances the host's clock
      // when it hears of the retry cannot advance it before the sleep began.
      const auto until = host_deadline_after(delay);
      if (on_retry) on_retry(attempt, error, delay);
      sleep_until(until, cancel);
    }
  }
}

void sleep_for(std::chrono::milliseconds duration, const CancelToken& cancel) {
  sleep_until(host_deadline_after(duration), cancel);
}

}  // namespace sbx::sdk
