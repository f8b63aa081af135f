#include <sbx/sdk/probe.hpp>

#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/retry.hpp>
#include <sbx/sdk/time.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>

namespace sbx::sdk {
namespace {

using Clock = HostClock;  // deadlines that decide behaviour: on the host's clock
using std::chrono::milliseconds;

constexpr size_t kExcerptChars = 200;

std::string format_seconds(double seconds) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, seconds);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

milliseconds to_ms(double seconds) {
  return seconds_to_ms(seconds);
}

// At most kExcerptChars bytes of `text`, cut on a UTF-8 character boundary, trailing whitespace
// dropped; "..." marks a cut.
std::string excerpt(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  if (text.size() <= kExcerptChars) return std::string(text);
  size_t cut = kExcerptChars - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return std::string(text.substr(0, cut)) + "...";
}

std::string describe(const ProbeAttempt& result) {
  return "return_code=" + std::to_string(result.return_code) + ", stdout='" +
         excerpt(result.stdout_text) + "', stderr='" + excerpt(result.stderr_text) + "'";
}

bool passed(const ProbeConfig& config, const ProbeAttempt& result) {
  return result.return_code == 0 &&
         (!config.expected_stdout ||
          result.stdout_text.find(*config.expected_stdout) != std::string::npos);
}

// Reads an optional field where an explicit JSON null clears the default.
template <typename T, typename Read>
void read_optional(json::ObjectReader& reader, std::string_view key, std::optional<T>& field,
                   Read read) {
  const boost::json::value* raw = reader.value(key);
  if (!raw) return;
  if (raw->is_null()) {
    field.reset();
  } else {
    field = read();
  }
}

}  // namespace

ProbeConfig ProbeConfig::read(json::ObjectReader& reader, const ProbeConfig& defaults) {
  ProbeConfig config = defaults;
  read_optional(reader, "command", config.command, [&] { return *reader.string("command"); });
  read_optional(reader, "expected_stdout", config.expected_stdout,
                [&] { return *reader.string("expected_stdout"); });
  config.timeout_s = reader.number("timeout_s").value_or(config.timeout_s);
  read_optional(reader, "deadline_s", config.deadline_s,
                [&] { return *reader.number("deadline_s", 0, 1e308, true); });
  if (auto count = reader.integer("stable_count", 1)) {
    if (*count > INT_MAX) {
      reader.fail("stable_count",
                  "must be <= " + std::to_string(INT_MAX) + ", got " + std::to_string(*count));
    }
    config.stable_count = static_cast<int>(*count);
  }
  config.stable_delay_s = reader.number("stable_delay_s", 0).value_or(config.stable_delay_s);

  // Validate the merged result, so a bad default is caught too. timeout_s only matters (and is
  // only checked) when the probe runs.
  if (config.command && !(config.timeout_s > 0)) {
    reader.fail("timeout_s", "must be > 0, got " + format_seconds(config.timeout_s));
  }
  if (config.deadline_s && !(*config.deadline_s > 0)) {
    reader.fail("deadline_s", "must be > 0, got " + format_seconds(*config.deadline_s));
  }
  if (config.stable_count < 1) {
    reader.fail("stable_count", "must be >= 1, got " + std::to_string(config.stable_count));
  }
  if (!(config.stable_delay_s >= 0)) {
    reader.fail("stable_delay_s", "must be >= 0, got " + format_seconds(config.stable_delay_s));
  }
  return config;
}

void run_readiness_probe(const ProbeConfig& config, std::string_view sandbox_id,
                         const std::function<ProbeAttempt(milliseconds)>& attempt,
                         const CancelToken& cancel, milliseconds poll_interval) {
  if (!config.command) return;
  const double deadline_s = config.deadline_s.value_or(config.timeout_s);
  const auto deadline = host_deadline_after(to_ms(deadline_s));
  int passes = 0, attempts = 0;
  std::string last_failure;

  auto remaining = [&] {
    return std::max(std::chrono::ceil<milliseconds>(deadline - Clock::now()), milliseconds(0));
  };
  // Sleeps, but never past the deadline: the loop then reports the expiry without another try.
  auto pause = [&](milliseconds duration) {
    sleep_until(std::min(deadline, Clock::now() + duration), cancel);
  };

  for (;;) {
    throw_if_cancelled(cancel);
    milliseconds left = remaining();
    if (left <= milliseconds(0)) break;
    ++attempts;
    try {
      ProbeAttempt result = attempt(std::min(to_ms(config.timeout_s), left));
      if (passed(config, result)) {
        if (++passes >= config.stable_count) return;
        if (config.stable_delay_s > 0) pause(to_ms(config.stable_delay_s));
        continue;
      }
      last_failure = describe(result);
    } catch (const Error& error) {
      if (error.status() == SBX_STATUS_CANCELLED) throw;
      last_failure = "error: " + excerpt(error.what());
    }
    passes = 0;
    pause(poll_interval);
  }

  std::string message =
      "sandbox '" + std::string(sandbox_id) +
      "' failed create probe command before the startup deadline; sandbox_id=" +
      std::string(sandbox_id) + ", command=" + *config.command +
      ", successful_probes=" + std::to_string(passes) + "/" + std::to_string(config.stable_count) +
      ", attempts=" + std::to_string(attempts) + ", deadline_s=" + format_seconds(deadline_s);
  if (!last_failure.empty()) message += "; last failure: " + last_failure;
  throw Error::create_verification_failed(message);
}

}  // namespace sbx::sdk
