// The readiness probe NeMo Gym's providers share: run a command in a new sandbox until it passes
// `stable_count` times in a row, or give up at a deadline.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/json.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace sbx::sdk {

// The seed's six fields. `command` unset disables the probe.
struct ProbeConfig {
  std::optional<std::string> command;
  std::optional<std::string> expected_stdout;  // substring of stdout; unset = exit code only
  double timeout_s = 30;                       // per attempt, > 0
  std::optional<double> deadline_s;            // total; unset = timeout_s; > 0
  int stable_count = 1;                        // consecutive passes required, >= 1
  double stable_delay_s = 0;                   // pause between passes, >= 0

  // Reads the six keys from `reader` (a JSON object such as a provider's "probe" config block),
  // starting from `defaults`; validates them as the seed does and throws json::Error (reported
  // as INVALID_ARGUMENT) naming the path. An explicit JSON null clears an optional field's default:
  // for "command" that disables the probe, for "expected_stdout" only the exit code counts, for
  // "deadline_s" the deadline becomes timeout_s. The caller calls reader.finish().
  static ProbeConfig read(json::ObjectReader& reader, const ProbeConfig& defaults);
};

struct ProbeAttempt {
  int return_code = 0;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `attempt(per_attempt_timeout)` until `stable_count` consecutive passes (exit code 0 and the
// expected substring in stdout). The deadline is deadline_s (or timeout_s when unset) from the
// call; each attempt gets min(timeout_s, time left). Between two passes it sleeps stable_delay_s
// when that is > 0. A failed attempt or one that throws sdk::Error (other than CANCELLED) resets
// the count; the loop sleeps `poll_interval` (bounded by the time left) and tries again until the
// deadline, then throws Error::create_verification_failed with the sandbox id, the command,
// passes/needed, attempts, deadline_s and a 200-character excerpt of the last failure. Other
// exceptions propagate. Does nothing when the probe is disabled. Cancellation throws
// Error::cancelled().
void run_readiness_probe(const ProbeConfig& config, std::string_view sandbox_id,
                         const std::function<ProbeAttempt(std::chrono::milliseconds)>& attempt,
                         const CancelToken& cancel,
                         std::chrono::milliseconds poll_interval = std::chrono::milliseconds(250));

}  // namespace sbx::sdk
