// What a plugin file offers, found out without loading it into this process: a child process
// (sbx-plugin-probe) loads it and prints its descriptor, so a file that crashes or hangs whoever
// loads it is reported as broken instead of taking the host down. Results are cached in memory
// and on disk, keyed by the file's identity (device, inode, size, modification and change times).
#pragma once

#include <sbx/core/host.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

namespace sbx::detail {

// A file's identity: equal identities mean the file has not changed.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// The identity of the file `path` names (following links), or the reason it has none.
std::optional<FileIdentity> identity_of(const std::filesystem::path& path, std::string* error);

struct ProbeSettings {
  std::filesystem::path program;     // sbx-plugin-probe; empty: not found (see probe_program())
  std::filesystem::path cache_file;  // empty: no disk cache
  std::chrono::milliseconds timeout{10'000};
};

// Where sbx-plugin-probe is: `configured` if set, else $SBX_PLUGIN_PROBE, next to the running
// program, where an install puts it relative to the program (<program dir>/../libexec/sbx/ by
// default, SBX_PROBE_FROM_BIN), or in this build's tree. Empty when none exists.
std::filesystem::path probe_program(const std::filesystem::path& configured);

// The disk cache: `configured` if set, else $SBX_PLUGIN_CACHE ("off" for none), else
// $XDG_CACHE_HOME/sbx/plugin-scan.json or ~/.cache/sbx/plugin-scan.json.
std::filesystem::path probe_cache_file(const std::filesystem::path& configured);

// The descriptor a probe reported (`info` must be ok()), for the in-process load to compare with
// what it reads itself (PluginLibrary::load).
struct Descriptor;
Descriptor descriptor_of(const PluginInfo& info);

// What `file` offers, or why it is unusable (PluginInfo::error). `identity` is the file's, as
// read by the caller. Thread-safe; never throws for a bad file.
PluginInfo probe_plugin(const std::filesystem::path& file, const FileIdentity& identity,
                        const ProbeSettings& settings);

}  // namespace sbx::detail
