// Retry with randomized exponential backoff ("full jitter"): the wait after attempt n (1-based) is
// uniform in [0, min(max_delay, initial_delay * 2^(n-1))]. Plugins classify errors (retryable or
// not); the policy comes from configuration.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>

#include <chrono>
#include <functional>

namespace sbx::sdk {

struct RetryPolicy {
  int retries = 0;  // extra attempts after the first; attempts = retries + 1
  std::chrono::milliseconds initial_delay{1000};
  std::chrono::milliseconds max_delay{15000};

  // The random wait after attempt `attempt` (1-based).
  std::chrono::milliseconds delay_after(int attempt) const;
};

// Calls `fn` until it returns, or throws an error that is not retryable by `is_retryable`
// (default: Error::retryable()), or attempts are exhausted (the last error is rethrown). Sleeps
// between attempts on the host's clock (sbx/sdk/clock.hpp), waking early and throwing
// Error::cancelled() when `cancel` fires. `on_retry(attempt, error, delay)` is called before each
// sleep (for logging).
void retry(const RetryPolicy& policy, const std::function<void()>& fn, const CancelToken& cancel,
           const std::function<bool(const Error&)>& is_retryable = {},
           const std::function<void(int, const Error&, std::chrono::milliseconds)>& on_retry = {});

// Sleeps for `duration` of the host's clock (sbx/sdk/clock.hpp) unless cancellation is requested
// first (then throws Error::cancelled()).
void sleep_for(std::chrono::milliseconds duration, const CancelToken& cancel);

}  // namespace sbx::sdk
