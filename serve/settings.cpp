#include "settings.hpp"

#include <sbx/base/json.hpp>
#include <sbx/core/errors.hpp>

namespace sbx::serve {

Settings read_settings(const boost::json::object& section, const std::string& source) {
  try {
    base::json::ObjectReader r(section, "$.serve");
    Settings s;
    s.listen = r.string("listen");
    if (s.listen && s.listen->empty()) r.fail("listen", "must be HOST:PORT, got an empty string");
    auto size = [&](const char* key, int64_t min, int64_t max) -> std::optional<std::size_t> {
      if (auto v = r.integer(key, min, max)) return static_cast<std::size_t>(*v);
      return std::nullopt;
    };
    constexpr int64_t kGiB = int64_t{1} << 30;
    constexpr int64_t kTiB = kGiB << 10;
    s.max_sandboxes = size("max_sandboxes", 0, 1000000);
    s.max_streams = size("max_streams", 0, 1000000);
    s.header_limit = size("header_limit", 1024, 1024 * 1024);
    s.body_limit = size("body_limit", 1, 64 * kGiB);
    s.read_timeout_s = r.number("read_timeout_s", 0, 86400, true);
    s.grace_s = r.number("grace_s", 0, 86400);
    if (auto t = r.integer("threads", 1, 64)) s.threads = static_cast<int>(*t);
    s.keepalive_ping_s = r.number("keepalive_ping_s", 0, 3600, true);
    // The same ranges as the flags of the same names (cli/cmd_serve.cpp).
    s.max_commands = size("max_commands", 1, 100000);
    s.max_queued_commands = size("max_queued_commands", 0, 1000000);
    s.kept_commands = size("kept_commands", 0, 1000000);
    if (auto v = r.integer("command_log_limit", 0, kTiB)) s.command_log_limit = *v;
    s.stream_buffer = size("stream_buffer", 4096, 4 * kGiB);
    if (auto v = r.integer("temp_limit", 0, 1024 * kTiB)) s.temp_limit = *v;
    if (const auto* faults = r.value("faults"); faults && !faults->is_null()) {
      if (!faults->is_array()) {
        r.fail("faults", "expected an array of fault rules, got " +
                             std::string(base::json::kind_name(*faults)));
      }
      s.faults = *faults;
      s.faults_path = source + ": " + r.path_of("faults");
    }
    r.finish();
    return s;
  } catch (const base::json::Error& e) {
    throw ConfigError(source + ": " + e.what());
  }
}

}  // namespace sbx::serve
