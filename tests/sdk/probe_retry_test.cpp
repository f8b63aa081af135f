#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/sdk/probe.hpp>
#include <sbx/sdk/retry.hpp>

#include <algorithm>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using sbx::sdk::Error;
using sbx::sdk::ProbeAttempt;
using sbx::sdk::ProbeConfig;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

template <typename Fn>
Error error_of(Fn&& fn) {
  return sbx::testing::error_of<Error>(std::forward<Fn>(fn));
}

// A config error: sdk::json::Error, which the SDK reports as INVALID_ARGUMENT.
template <typename Fn>
sbx::sdk::json::Error config_error_of(Fn&& fn) {
  auto error = sbx::testing::error_of<sbx::sdk::json::Error>(std::forward<Fn>(fn));
  CHECK(sbx::sdk::detail::exception_to_error(std::make_exception_ptr(error)).status() ==
        SBX_STATUS_INVALID_ARGUMENT);
  return error;
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

ProbeConfig read_probe(std::string_view text, const ProbeConfig& defaults = {}) {
  auto object = sbx::sdk::json::parse_object(text, "probe");
  sbx::sdk::json::ObjectReader reader(object, "$.probe");
  auto config = ProbeConfig::read(reader, defaults);
  reader.finish();
  return config;
}

ProbeConfig probe(std::string command, double timeout_s, int stable_count = 1) {
  ProbeConfig config;
  config.command = std::move(command);
  config.expected_stdout = "ready";
  config.timeout_s = timeout_s;
  config.stable_count = stable_count;
  return config;
}

ProbeAttempt pass() {
  return {0, "ready\n", ""};
}

}  // namespace

// ---- ProbeConfig::read --------------------------------------------------------------------

TEST_CASE("ProbeConfig::read overrides defaults key by key") {
  ProbeConfig defaults;
  defaults.command = "printf docker-sandbox-ready";
  defaults.expected_stdout = "docker-sandbox-ready";
  auto config = read_probe(R"({"timeout_s": 5, "deadline_s": 60, "stable_count": 2,
                               "stable_delay_s": 0.5})",
                           defaults);
  CHECK(config.command == "printf docker-sandbox-ready");
  CHECK(config.expected_stdout == "docker-sandbox-ready");
  CHECK(config.timeout_s == 5);
  CHECK(config.deadline_s == 60);
  CHECK(config.stable_count == 2);
  CHECK(config.stable_delay_s == 0.5);

  auto empty = read_probe("{}", defaults);
  CHECK(empty.command == defaults.command);
  CHECK_FALSE(empty.deadline_s.has_value());

  auto replaced = read_probe(R"({"command": "true", "expected_stdout": "ok"})", defaults);
  CHECK(replaced.command == "true");
  CHECK(replaced.expected_stdout == "ok");
}

TEST_CASE("ProbeConfig::read: explicit null clears optional fields") {
  ProbeConfig defaults = probe("echo ready", 30);
  defaults.deadline_s = 60;
  auto config =
      read_probe(R"({"command": null, "expected_stdout": null, "deadline_s": null})", defaults);
  CHECK_FALSE(config.command.has_value());
  CHECK_FALSE(config.expected_stdout.has_value());
  CHECK_FALSE(config.deadline_s.has_value());
}

TEST_CASE("ProbeConfig::read validates as the seed does, naming the path") {
  ProbeConfig defaults = probe("echo ready", 30);
  CHECK(std::string(config_error_of([&] { read_probe(R"({"timeout_s": 0})", defaults); }).what()) ==
        "$.probe.timeout_s: must be > 0, got 0");
  CHECK(std::string(config_error_of([&] {
                      read_probe(R"({"deadline_s": 0})", defaults);
                    }).what()) == "$.probe.deadline_s: must be > 0, got 0");
  CHECK(std::string(config_error_of([&] {
                      read_probe(R"({"stable_count": 0})", defaults);
                    }).what()) == "$.probe.stable_count: must be >= 1, got 0");
  CHECK(std::string(config_error_of([&] {
                      read_probe(R"({"stable_delay_s": -1})", defaults);
                    }).what()) == "$.probe.stable_delay_s: must be >= 0, got -1");
  CHECK(std::string(config_error_of([&] { read_probe(R"({"command": 3})", defaults); }).what()) ==
        "$.probe.command: expected a string, got number");
  auto unknown = config_error_of([&] { read_probe(R"({"stable_counts": 2})", defaults); });
  CHECK(std::string(unknown.what()) ==
        "$.probe.stable_counts: unknown key; known keys: command, expected_stdout, timeout_s, "
        "deadline_s, stable_count, stable_delay_s");
  // timeout_s is only checked when the probe runs.
  auto disabled = read_probe(R"({"command": null, "timeout_s": 0})", defaults);
  CHECK_FALSE(disabled.command.has_value());
  CHECK(disabled.timeout_s == 0);
}

// ---- run_readiness_probe ------------------------------------------------------------------

TEST_CASE("probe disabled: the attempt is never called") {
  int calls = 0;
  sbx::sdk::run_readiness_probe(ProbeConfig{}, "sb-1",
                                [&](milliseconds) {
                                  ++calls;
                                  return pass();
                                },
                                {});
  CHECK(calls == 0);
}

TEST_CASE("probe needs stable_count consecutive passes; failures reset the count") {
  // pass, fail, pass, error, pass, pass, pass -> done after the 7th attempt with stable_count 3.
  std::vector<std::string> script = {"pass", "fail", "pass", "error",
                                     "pass", "pass", "pass", "pass"};
  size_t calls = 0;
  std::vector<milliseconds> timeouts;
  auto config = probe("echo ready", 10, 3);
  sbx::sdk::run_readiness_probe(
      config, "sb-1",
      [&](milliseconds timeout) -> ProbeAttempt {
        timeouts.push_back(timeout);
        const std::string& step = script.at(calls++);
        if (step == "error") throw Error::unavailable("exec failed");
        if (step == "fail") return {0, "not yet", ""};
        return pass();
      },
      {}, 1ms);
  CHECK(calls == 7);
  for (auto t : timeouts)
    CHECK((t > 9000ms && t <= 10000ms));
}

TEST_CASE("probe: exit code matters, and expected_stdout unset means exit code only") {
  auto config = probe("check", 10, 1);
  config.expected_stdout.reset();
  int calls = 0;
  sbx::sdk::run_readiness_probe(
      config, "sb",
      [&](milliseconds) -> ProbeAttempt {
        return ++calls < 3 ? ProbeAttempt{1, "", "boom"} : ProbeAttempt{0, "anything", ""};
      },
      {}, 1ms);
  CHECK(calls == 3);
}

TEST_CASE("probe sleeps stable_delay_s between consecutive passes only") {
  auto config = probe("echo ready", 10, 3);
  config.stable_delay_s = 0.1;
  std::vector<Clock::time_point> times;
  sbx::sdk::run_readiness_probe(
      config, "sb",
      [&](milliseconds) {
        times.push_back(Clock::now());
        return pass();
      },
      {}, 1ms);
  REQUIRE(times.size() == 3);
  CHECK(times[1] - times[0] >= 100ms);
  CHECK(times[2] - times[1] >= 100ms);
  CHECK(times[2] - times[0] < 1000ms);
}

TEST_CASE("probe deadline expiry: message carries id, command, passes, attempts, excerpt") {
  auto config = probe("cat /ready", 0.05, 2);
  config.deadline_s = 0.3;
  std::string long_stdout = "ready" + std::string(1000, 'x');
  int attempts = 0;
  auto started = Clock::now();
  auto error = error_of([&] {
    sbx::sdk::run_readiness_probe(
        config, "sb-42",
        [&](milliseconds timeout) -> ProbeAttempt {
          ++attempts;
          CHECK(timeout <= 50ms);
          // Alternate pass and failure so the count never reaches 2; the failure has a long stdout.
          if (attempts % 2 == 1) return pass();
          return {3, long_stdout, "not ready yet"};
        },
        {}, 20ms);
  });
  auto elapsed = Clock::now() - started;
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 2000ms);
  CHECK(error.status() == SBX_STATUS_CREATE_VERIFICATION_FAILED);
  CHECK(error.retryable());
  std::string message = error.what();
  CHECK(contains(message, "sandbox_id=sb-42"));
  CHECK(contains(message, "command=cat /ready"));
  CHECK(contains(message, "attempts=" + std::to_string(attempts)));
  CHECK(contains(message, "deadline_s=0.3"));
  CHECK(contains(message, "return_code=3"));
  CHECK(contains(message, "not ready yet"));
  CHECK(attempts >= 4);
  // The last attempt decides the pass count: 1/2 after a pass, 0/2 after a failure.
  CHECK(contains(message, attempts % 2 == 1 ? "successful_probes=1/2" : "successful_probes=0/2"));
  // The 1000-char stdout is cut to a 200-char excerpt.
  size_t start = message.find("stdout='");
  REQUIRE(start != std::string::npos);
  size_t end = message.find('\'', start + 8);
  REQUIRE(end != std::string::npos);
  CHECK(end - (start + 8) <= 200);
  CHECK(end - (start + 8) >= 150);
}

TEST_CASE("probe: without deadline_s the deadline is timeout_s; errors appear in the message") {
  auto config = probe("exec", 0.2, 1);
  int attempts = 0;
  auto started = Clock::now();
  auto error = error_of([&] {
    sbx::sdk::run_readiness_probe(
        config, "sb-7",
        [&](milliseconds timeout) -> ProbeAttempt {
          ++attempts;
          CHECK(timeout <= 200ms);
          throw Error::unavailable("connection refused by daemon");
        },
        {}, 30ms);
  });
  CHECK(Clock::now() - started >= 200ms);
  CHECK(attempts >= 3);
  std::string message = error.what();
  CHECK(contains(message, "deadline_s=0.2"));
  CHECK(contains(message, "successful_probes=0/1"));
  CHECK(contains(message, "connection refused by daemon"));
}

TEST_CASE("probe: cancellation wakes the poll sleep and a cancelled attempt propagates") {
  auto config = probe("x", 30, 1);
  std::stop_source source;
  std::jthread canceller([&] {
    std::this_thread::sleep_for(50ms);
    source.request_stop();
  });
  auto started = Clock::now();
  auto error = error_of([&] {
    sbx::sdk::run_readiness_probe(
        config, "sb",
        [&](milliseconds) -> ProbeAttempt {
          return {1, "", ""};
        },
        source.get_token(), 10s);
  });
  CHECK(error.status() == SBX_STATUS_CANCELLED);
  CHECK(Clock::now() - started < 2s);

  int calls = 0;
  auto cancelled = error_of([&] {
    sbx::sdk::run_readiness_probe(
        config, "sb",
        [&](milliseconds) -> ProbeAttempt {
          ++calls;
          throw Error::cancelled();
        },
        {}, 1ms);
  });
  CHECK(cancelled.status() == SBX_STATUS_CANCELLED);
  CHECK(calls == 1);
}

TEST_CASE("probe: exceptions that are not sdk::Error propagate") {
  auto config = probe("x", 1, 1);
  CHECK_THROWS_AS(
      sbx::sdk::run_readiness_probe(
          config, "sb", [](milliseconds) -> ProbeAttempt { throw std::logic_error("bug"); }, {}),
      std::logic_error);
}

// ---- Retry --------------------------------------------------------------------------------

TEST_CASE("delay_after is full jitter within [0, min(max, initial * 2^(n-1))]") {
  sbx::sdk::RetryPolicy policy{.retries = 5, .initial_delay = 100ms, .max_delay = 1500ms};
  for (int attempt = 1; attempt <= 8; ++attempt) {
    const int64_t ceiling = std::min<int64_t>(1500, 100LL << (attempt - 1));
    std::set<int64_t> seen;
    int64_t highest = 0, lowest = ceiling;
    for (int i = 0; i < 2000; ++i) {
      int64_t d = policy.delay_after(attempt).count();
      REQUIRE(d >= 0);
      REQUIRE(d <= ceiling);
      seen.insert(d);
      highest = std::max(highest, d);
      lowest = std::min(lowest, d);
    }
    CHECK(seen.size() > 50);            // random, not constant
    CHECK(highest > ceiling * 9 / 10);  // the whole range is used
    CHECK(lowest < ceiling / 10);
  }
  // Doubling stops at the cap without overflowing.
  for (int i = 0; i < 100; ++i)
    CHECK(policy.delay_after(1000).count() <= 1500);
  sbx::sdk::RetryPolicy zero{.retries = 1, .initial_delay = 0ms, .max_delay = 0ms};
  CHECK(zero.delay_after(3) == 0ms);
}

TEST_CASE("retry: retryable errors are retried until success") {
  sbx::sdk::RetryPolicy policy{.retries = 3, .initial_delay = 1ms, .max_delay = 2ms};
  int calls = 0;
  std::vector<int> retried;
  sbx::sdk::retry(
      policy,
      [&] {
        if (++calls < 3) throw Error::unavailable("busy");
      },
      {}, {},
      [&](int attempt, const Error& error, milliseconds delay) {
        retried.push_back(attempt);
        CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
        CHECK(delay <= 2ms);
      });
  CHECK(calls == 3);
  CHECK(retried == std::vector<int>{1, 2});
}

TEST_CASE("retry: attempts are bounded and the last error is rethrown") {
  sbx::sdk::RetryPolicy policy{.retries = 2, .initial_delay = 1ms, .max_delay = 1ms};
  int calls = 0;
  auto error = error_of([&] {
    sbx::sdk::retry(policy, [&] { throw Error::unavailable("try " + std::to_string(++calls)); },
                    {});
  });
  CHECK(calls == 3);
  CHECK(std::string(error.what()) == "try 3");
}

TEST_CASE("retry: non-retryable errors and cancellations stop at once") {
  sbx::sdk::RetryPolicy policy{.retries = 5, .initial_delay = 1ms, .max_delay = 1ms};
  int calls = 0;
  auto error = error_of([&] {
    sbx::sdk::retry(policy,
                    [&] {
                      ++calls;
                      throw Error::invalid_argument("bad");
                    },
                    {});
  });
  CHECK(calls == 1);
  CHECK(error.status() == SBX_STATUS_INVALID_ARGUMENT);

  calls = 0;
  auto custom = error_of([&] {
    sbx::sdk::retry(
        policy,
        [&] {
          ++calls;
          throw Error::not_found("gone");
        },
        {}, [](const Error& e) { return e.status() == SBX_STATUS_NOT_FOUND; });
  });
  CHECK(calls == 6);
  CHECK(custom.status() == SBX_STATUS_NOT_FOUND);

  calls = 0;
  auto cancelled = error_of([&] {
    sbx::sdk::retry(
        policy,
        [&] {
          ++calls;
          throw Error::cancelled();
        },
        {}, [](const Error&) { return true; });
  });
  CHECK(calls == 1);
  CHECK(cancelled.status() == SBX_STATUS_CANCELLED);
}

TEST_CASE("retry: cancellation during the backoff sleep throws cancelled quickly") {
  sbx::sdk::RetryPolicy policy{.retries = 3, .initial_delay = 60s, .max_delay = 60s};
  std::stop_source source;
  int calls = 0;
  std::jthread canceller([&] {
    std::this_thread::sleep_for(50ms);
    source.request_stop();
  });
  auto started = Clock::now();
  auto error = error_of([&] {
    sbx::sdk::retry(
        policy,
        [&] {
          ++calls;
          throw Error::unavailable("busy");
        },
        source.get_token(), {}, [](int, const Error&, milliseconds) {});
  });
  CHECK(error.status() == SBX_STATUS_CANCELLED);
  CHECK(calls == 1);
  CHECK(Clock::now() - started < 2s);
}

TEST_CASE("sleep_for sleeps, wakes on cancel, and fails at once when already cancelled") {
  auto started = Clock::now();
  sbx::sdk::sleep_for(50ms, {});
  CHECK(Clock::now() - started >= 50ms);

  std::stop_source source;
  started = Clock::now();
  std::jthread canceller([&] {
    std::this_thread::sleep_for(30ms);
    source.request_stop();
  });
  CHECK(error_of([&] { sbx::sdk::sleep_for(60s, source.get_token()); }).status() ==
        SBX_STATUS_CANCELLED);
  auto woke_after = Clock::now() - started;
  CHECK(woke_after >= 30ms);
  CHECK(woke_after < 1s);

  started = Clock::now();
  CHECK(error_of([&] { sbx::sdk::sleep_for(60s, source.get_token()); }).status() ==
        SBX_STATUS_CANCELLED);
  CHECK(Clock::now() - started < 100ms);
}
