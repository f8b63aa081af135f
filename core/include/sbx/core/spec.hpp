// Values of the sbx:: host API: NeMo Gym's SandboxSpec, SandboxResources, SandboxExecResult and
// SandboxStatus, as C++ types. Validation follows the seed, with the seed's messages.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx {

using StringMap = std::map<std::string, std::string>;

// NeMo Gym's SandboxStatus: these six values (paused since NeMo Gym 0.7 and sbx ABI 1.1).
enum class SandboxStatus { starting, running, stopped, error, unknown, paused };
std::string_view to_string(SandboxStatus status) noexcept;

// NeMo Gym's SandboxResources.
struct Resources {
  std::optional<double> cpu;
  std::optional<int64_t> memory_mib;
  std::optional<int64_t> disk_gib;
  std::optional<int64_t> gpu;
  std::optional<std::string> gpu_type;

  // SandboxResources.from_mapping: null gives no request; unknown keys are an error
  // ("Unknown sandbox resource keys: [...]. Expected keys: [...]"); numbers given as strings are
  // parsed ("0.5" -> 0.5); memory_mib/disk_gib/gpu must be integers.
  static Resources from_json(const boost::json::value& value);
};

// NeMo Gym's SandboxSpec.
struct SandboxSpec {
  std::optional<std::string> image;
  std::optional<double> ttl_s;
  std::optional<double> ready_timeout_s;
  std::optional<std::string> workdir;
  StringMap env;
  StringMap files;  // remote path -> text contents, written before create returns
  StringMap metadata;
  Resources resources;
  std::optional<std::vector<std::string>> entrypoint;
  boost::json::object provider_options;
  std::vector<int64_t> ports;

  // Throws InvalidArgumentError: "Sandbox TCP port must be between 1 and 65535, got N",
  // "Duplicate sandbox TCP port: N", "Sandbox ttl_s must be > 0, got X" (also ready_timeout_s),
  // negative resources, empty entrypoint.
  void validate() const;

  // Reads a spec from JSON with the seed's field names; unknown keys are errors naming the path.
  // Ports may be numbers or numeric strings ("Invalid sandbox TCP port: ..." otherwise).
  static SandboxSpec from_json(const boost::json::value& value);
};

enum class OutputStream { out, err };

struct ExecOptions {
  std::optional<std::string> cwd;   // default: the spec's workdir
  StringMap env;                    // merged over the sandbox env; these win
  std::optional<double> timeout_s;  // default: the provider's configured default
  std::optional<std::string> user;  // name or uid as text
  // Receives output as it arrives (on a plugin thread). When set, ExecResult's output is empty.
  std::function<void(OutputStream, std::string_view)> on_output;

  void validate() const;  // "exec timeout_s must be > 0, got X"
};

// Where a download's bytes go when they are streamed (Sandbox::download_to_async) rather than
// written to a file. Both run on a plugin thread, one call at a time, in order, and must not block
// for long; a slow consumer holds the download instead (Operation::hold_output).
struct DownloadSink {
  // Optional. At most once, before the first bytes, when the provider knows the file's size
  // (ABI 1.3): the download then writes exactly that many bytes, or fails.
  std::function<void(uint64_t size)> on_size;
  // The file's bytes, in order. Returning false aborts the download (CancelledError).
  std::function<bool(std::string_view bytes)> on_data;
};

// NeMo Gym's SandboxExecResult. A non-zero exit is a result, not an exception: a command that ran
// has its exit status; one stopped by its timeout has return_code 125 and error_type "timeout";
// one the sandbox could not start has 125 and "sandbox".
struct ExecResult {
  std::string stdout_text;
  std::string stderr_text;
  int32_t return_code = 0;
  std::optional<std::string> error_type;

  bool timed_out() const { return error_type && *error_type == "timeout"; }
};

// A route to a service on a declared port (NeMo Gym's SandboxEndpoint).
struct Endpoint {
  std::string url;
  StringMap headers;
};

// A sandbox found by listing or reaping.
struct SandboxInfo {
  std::string id;
  SandboxStatus status = SandboxStatus::unknown;
  StringMap labels;
  int64_t created_unix_ms = 0;
};

}  // namespace sbx
