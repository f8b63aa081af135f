// The checking mode: reports a host that breaks the ABI's contract (a sandbox released twice or
// used after release_sandbox, calls without usable callbacks, an operation handle used after its
// release) instead of passing it on silently. See internal.hpp for the modes.

#include "internal.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sbx::sdk::detail::checks {
namespace {

Mode mode_from_environment() noexcept {
  const char* value = std::getenv("SBX_SDK_CHECKS");
  if (value && std::strcmp(value, "off") == 0) return Mode::off;
  if (value && std::strcmp(value, "strict") == 0) return Mode::strict;
  return Mode::report;
}

std::atomic<Mode>& current() noexcept {
  static std::atomic<Mode> mode{mode_from_environment()};
  return mode;
}

}  // namespace

Mode mode() noexcept {
  return current().load(std::memory_order_relaxed);
}

void set_mode(Mode mode) noexcept {
  current().store(mode, std::memory_order_relaxed);
}

void violation(const sbx_host* host, std::string_view what) noexcept {
  const Mode m = mode();
  if (m == Mode::off) return;
  static constexpr std::string_view kPrefix = "sbx sdk: the host broke the ABI contract: ";
  try {
    const std::string line = std::string(kPrefix) + std::string(what);
    if (host && SBX_HAS_FIELD(host, sbx_host, log) && host->log) {
      host->log(host, SBX_LOG_ERROR, to_sbx(line));
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  } catch (...) {  // out of memory for the line: the fixed part still says what happened
    std::fprintf(stderr, "%.*s(no memory for the details)\n", static_cast<int>(kPrefix.size()),
                 kPrefix.data());
  }
  if (m == Mode::strict) std::abort();
}

}  // namespace sbx::sdk::detail::checks

namespace sbx::sdk::detail {

void report_unusable_callbacks(const sbx_provider* p, const char* what) noexcept {
  if (checks::mode() == checks::Mode::off) return;
  try {
    checks::violation(log_of(p).host(),
                      std::string(what) +
                          ": called without usable callbacks (NULL, too small, or a NULL "
                          "on_complete); nothing was started");
  } catch (...) {  // out of memory for the message
    checks::violation(log_of(p).host(), "a call without usable callbacks");
  }
}

}  // namespace sbx::sdk::detail
