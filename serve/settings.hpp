// The config file's `serve` section: sbx serve's settings (docs/serve.md, "Limits and settings").
// The host keeps the section as written (sbx::Config::serve); sbx serve reads it here when it
// starts. Every field is optional: an absent one keeps the server's default, and a command-line
// flag given to `sbx serve` wins over the file. Plain values only: cli/cmd_serve.cpp maps them
// onto sbx::serve::Options.
//
// THREADING: a value type; read_settings is a pure function of its arguments.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace sbx::serve {

struct Settings {
  std::optional<std::string> listen;         // "HOST:PORT" or "unix:PATH" (checked by sbx serve)
  std::optional<std::size_t> max_sandboxes;  // 0: unlimited
  std::optional<std::size_t> max_streams;    // 0: unlimited
  std::optional<std::size_t> header_limit;   // bytes of a request's start line and headers
  std::optional<std::size_t> body_limit;     // bytes of a request body
  std::optional<double> read_timeout_s;      // > 0
  std::optional<double> grace_s;             // >= 0
  std::optional<int> threads;                // 1..64
  std::optional<double> keepalive_ping_s;    // > 0: the event streams' ping interval
  // Per sandbox and per transfer (docs/serve.md, "Limits").
  std::optional<std::size_t> max_commands;         // commands running per sandbox, >= 1
  std::optional<std::size_t> max_queued_commands;  // waiting for a slot per sandbox
  std::optional<std::size_t> kept_commands;        // finished records kept per sandbox
  std::optional<std::uint64_t> command_log_limit;  // bytes of a background command's log
  std::optional<std::size_t> stream_buffer;        // bytes queued per stream before a cut
  std::optional<std::uint64_t> temp_limit;         // bytes of staged transfers, server-wide
  // The fault-injection plan as written (a JSON array), validated by Faults::parse (faults.hpp);
  // absent: no faults. `faults_path` is where it sits, e.g. "sbx.json: $.serve.faults", so that
  // errors name the file and the JSON path.
  std::optional<boost::json::value> faults;
  std::string faults_path;
};

// Reads the `serve` section of the config file `source` (e.g. "sbx.json"). Throws
// sbx::ConfigError("<source>: $.serve.<key>: <problem>") for an unknown key or a value out of
// range.
Settings read_settings(const boost::json::object& section, const std::string& source);

}  // namespace sbx::serve
