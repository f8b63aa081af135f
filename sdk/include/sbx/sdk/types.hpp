// The C ABI's requests and results as owning C++ values, as provider code sees them.
// The SDK converts (and copies) the borrowed C structs into these before calling a provider.
#pragma once

#include <sbx/abi/ext/pty.h>
#include <sbx/abi/ext/session.h>
#include <sbx/abi/provider.h>
#include <sbx/abi/spec.h>
#include <sbx/base/abi_views.hpp>

#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::sdk {

using KeyValues = std::map<std::string, std::string>;

struct Resources {
  std::optional<double> cpu;
  std::optional<int64_t> memory_mib;
  std::optional<int64_t> disk_gib;
  std::optional<int64_t> gpu;
  std::optional<std::string> gpu_type;

  bool empty() const { return !cpu && !memory_mib && !disk_gib && !gpu && !gpu_type; }
};

struct StartupFile {
  std::string path;
  std::string contents;
};

// sbx_spec. The host has validated it (see spec.h).
struct Spec {
  std::optional<std::string> image;
  std::optional<std::chrono::milliseconds> ttl;
  std::optional<std::chrono::milliseconds> ready_timeout;
  std::optional<std::string> workdir;
  KeyValues env;
  std::vector<StartupFile> files;
  KeyValues metadata;
  Resources resources;
  std::optional<std::vector<std::string>> entrypoint;
  std::vector<uint16_t> ports;
  boost::json::object provider_options;  // parsed; not yet validated (the provider does that)
  KeyValues labels;
};

// sbx_exec_request.
struct ExecRequest {
  std::string command;
  std::optional<std::string> cwd;
  KeyValues env;
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<std::string> user;
  // ABI 1.3: when not empty, the program and its arguments to run without a shell; `command` is
  // then the same argv as a quoted command line (a provider may run that through its shell).
  std::vector<std::string> argv;
};

// How a command ended; its output travels separately (OutputSink). See sbx_exec_result.
struct ExitStatus {
  int32_t return_code = 0;
  std::optional<std::string> error_type;

  static ExitStatus exited(int32_t code) { return {code, std::nullopt}; }
  static ExitStatus timed_out() {
    return {SBX_EXEC_RETURN_CODE_NO_PROCESS, std::string(SBX_EXEC_ERROR_TIMEOUT)};
  }
  static ExitStatus sandbox_failure() {
    return {SBX_EXEC_RETURN_CODE_NO_PROCESS, std::string(SBX_EXEC_ERROR_SANDBOX)};
  }
};

enum class StdStream : int32_t { out = SBX_STREAM_STDOUT, err = SBX_STREAM_STDERR };

enum class SandboxStatus : int32_t {
  unknown = SBX_SANDBOX_UNKNOWN,
  starting = SBX_SANDBOX_STARTING,
  running = SBX_SANDBOX_RUNNING,
  stopped = SBX_SANDBOX_STOPPED,
  error = SBX_SANDBOX_ERROR,
  paused = SBX_SANDBOX_PAUSED,  // ABI 1.1; the SDK reports `running` to a 1.0 host
};

struct UploadRequest {
  std::string remote_path;
  uint32_t mode = 0644;
};

// ext/endpoint.h
struct Endpoint {
  std::string url;
  KeyValues headers;
};

// ext/list_reap.h
struct SandboxInfo {
  std::string id;
  SandboxStatus status = SandboxStatus::unknown;
  KeyValues labels;
  int64_t created_unix_ms = 0;
};

// ext/session.h: a persistent shell.
struct SessionRequest {
  std::optional<std::string> cwd;
  KeyValues env;
  std::optional<std::string> user;
};

// ext/pty.h: a terminal. rows and cols are never 0 (the SDK applies the ABI's 24 x 80).
struct PtyRequest {
  std::optional<std::string> command;  // none: the user's login shell
  std::optional<std::string> cwd;
  KeyValues env;
  std::optional<std::string> user;
  uint16_t rows = 24;
  uint16_t cols = 80;
  bool tty = true;  // false: pipe mode
};

// ---- Conversions between the ABI's views and these values -------------------------------------

// The layer-neutral views of <sbx/base/abi_views.hpp>.
using ::sbx::base::optional_string;
using ::sbx::base::to_bytes;
using ::sbx::base::to_sbx;
using ::sbx::base::view;
KeyValues to_key_values(sbx_kv_list list);
// A copy of text the ABI says is UTF-8; Error::invalid_argument("<what> is not valid UTF-8 (byte
// N)") when it is not.
std::string text(sbx_str s, std::string_view what);

// Copies a borrowed sbx_spec. Throws Error::invalid_argument for a struct too small for this ABI
// version, provider_options that are not a JSON object, or text that is not UTF-8.
Spec to_spec(const sbx_spec& spec);
ExecRequest to_exec_request(const sbx_exec_request& request);
SessionRequest to_session_request(const sbx_session_request& request);
PtyRequest to_pty_request(const sbx_pty_request& request);
// A session or terminal id from the host: Error::invalid_argument unless it is 1..128 bytes of
// [A-Za-z0-9_.:-] (ext/session.h).
std::string session_id_of(sbx_str id);

// Keeps sbx_kv entries pointing into a KeyValues alive for handing out a sbx_kv_list.
using ::sbx::base::KvListView;

}  // namespace sbx::sdk
