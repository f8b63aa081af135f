// The config file's `serve` section as sbx serve reads it (serve/settings.hpp): every key, and
// errors that name the file and the JSON path.

#include <settings.hpp>

#include <sbx/core/config.hpp>
#include <sbx/core/errors.hpp>

#include <doctest/doctest.h>

#include <string>

namespace {

sbx::serve::Settings settings_of(const std::string& json) {
  const auto config = sbx::Config::parse(json, "test.json");
  REQUIRE(config.serve);
  return sbx::serve::read_settings(*config.serve, config.source);
}

std::string settings_error(const std::string& json) {
  try {
    settings_of(json);
  } catch (const sbx::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("the serve section: sbx serve's limits, and its faults plan kept for Faults::parse") {
  const auto s = settings_of(R"({"serve": {
      "listen": "127.0.0.1:8080", "max_sandboxes": 10, "max_streams": 0, "header_limit": 8192,
      "body_limit": 2048, "read_timeout_s": 2.5, "grace_s": 0, "threads": 4,
      "keepalive_ping_s": 0.5, "max_commands": 3, "max_queued_commands": 0, "kept_commands": 7,
      "command_log_limit": 65536, "stream_buffer": 8192, "temp_limit": 1048576,
      "faults": [{"route": "GET /ping", "fail_for_s": 5, "status": 502}]
    }})");
  CHECK(*s.listen == "127.0.0.1:8080");
  CHECK(*s.max_sandboxes == 10);
  CHECK(*s.max_streams == 0);
  CHECK(*s.header_limit == 8192);
  CHECK(*s.body_limit == 2048);
  CHECK(*s.read_timeout_s == 2.5);
  CHECK(*s.grace_s == 0);
  CHECK(*s.threads == 4);
  CHECK(*s.keepalive_ping_s == 0.5);
  CHECK(*s.max_commands == 3);
  CHECK(*s.max_queued_commands == 0);
  CHECK(*s.kept_commands == 7);
  CHECK(*s.command_log_limit == 65536);
  CHECK(*s.stream_buffer == 8192);
  CHECK(*s.temp_limit == 1048576);
  REQUIRE(s.faults);
  CHECK(s.faults->as_array().size() == 1);
  CHECK(s.faults_path == "test.json: $.serve.faults");

  const auto empty = settings_of(R"({"serve": {}})");
  CHECK_FALSE(empty.listen);
  CHECK_FALSE(empty.body_limit);
  CHECK_FALSE(empty.max_commands);
  CHECK_FALSE(empty.faults);
}

TEST_CASE("the serve section's errors name the file and the JSON path") {
  CHECK(settings_error(R"({"serve": {"max_sandbox": 3}})")
            .starts_with("test.json: $.serve.max_sandbox: unknown key"));
  CHECK(settings_error(R"({"serve": {"threads": 0}})") ==
        "test.json: $.serve.threads: must be between 1 and 64, got 0");
  CHECK(settings_error(R"({"serve": {"body_limit": "1M"}})") ==
        "test.json: $.serve.body_limit: expected an integer, got string");
  CHECK(settings_error(R"({"serve": {"read_timeout_s": 0}})") ==
        "test.json: $.serve.read_timeout_s: must be > 0, got 0");
  CHECK(settings_error(R"({"serve": {"max_streams": -1}})")
            .starts_with("test.json: $.serve.max_streams: must be between 0"));
  CHECK(settings_error(R"({"serve": {"max_commands": 0}})")
            .starts_with("test.json: $.serve.max_commands: must be between 1"));
  CHECK(settings_error(R"({"serve": {"stream_buffer": 10}})")
            .starts_with("test.json: $.serve.stream_buffer: must be between 4096"));
  CHECK(settings_error(R"({"serve": {"listen": ""}})")
            .starts_with("test.json: $.serve.listen: must be HOST:PORT"));
  CHECK(settings_error(R"({"serve": {"faults": {"route": "GET /ping"}}})") ==
        "test.json: $.serve.faults: expected an array of fault rules, got object");
}
