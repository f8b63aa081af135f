// The host's JSON configuration: named provider blocks, the same idea as NeMo Gym's named
// `sandbox:` blocks.
//
//   {
//     "plugin_path": ["./plugins"],                 // optional: extra plugin directories
//     "labels": {"team": "infra"},                  // optional: stamped on every sandbox
//     "default_provider": "docker",                 // optional: used when none is named
//     "deadlines": {"grace_s": 30},                 // optional: sbx::Deadlines, in seconds
//     "serve": {"listen": "127.0.0.1:8080", "body_limit": 1048576, "faults": [...]},
//                                                   // optional: sbx serve's settings,
//                                                   // kept as written (serve/settings.hpp)
//     "providers": {
//       "docker": {
//         "plugin": "local_docker",                 // provider id, or "path/x.so[#id]"
//         "config": {"exec": {"default_timeout_s": 60}},
//         "default_metadata": {"team": "infra"},
//         "canary": {"spec": {"image": "x"}, "command": "true"},  // optional: checked on reload
//         "allow_kind_change": false                // a reload may change the provider id
//       }
//     }
//   }
//
// Unknown keys are errors naming their JSON path. A string value "${env:NAME}" anywhere inside a
// block's "config" is replaced by that environment variable (for secrets); an unset variable is an
// error naming the path.
#pragma once

#include <sbx/core/deadlines.hpp>
#include <sbx/core/spec.hpp>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx {

// A check a new generation of a provider must pass before a reload puts it in service
// (Host::reload): create a sandbox from `spec`, run `command` (exit 0 within `timeout_s`), close.
struct Canary {
  SandboxSpec spec;
  std::string command = "true";
  double timeout_s = 60;
};

struct ProviderBlock {
  std::string name;
  // A provider id, or a plugin file path (relative: to the config file's directory) with an
  // optional "#provider_id".
  std::string plugin;
  boost::json::object config;
  StringMap default_metadata;
  // Where `config` sits, e.g. "sbx.json: $.providers.a.config", so that a plugin's complaint about
  // "$.root" reads "sbx.json: $.providers.a.config.root". Empty for a block made from a bare id.
  std::string config_path;
  // "canary": {"spec": {...}, "command": "true", "timeout_s": 60}; only reloads run it.
  std::optional<Canary> canary;
  // "allow_kind_change": true lets a reload give this block a generation of another provider id
  // than its current one (e.g. opensandbox after local_docker); refused otherwise. Read by
  // reloads only; not part of the provider (same_provider).
  bool allow_kind_change = false;

  // The plugin file `plugin` names (absolute when the config came from a file), or nullopt when
  // it names a provider id.
  std::optional<std::filesystem::path> plugin_file() const;

  // Whether a provider made from `other` would be the same one (plugin, config, default
  // metadata; the canary and the config path are not part of the provider).
  bool same_provider(const ProviderBlock& other) const {
    return plugin == other.plugin && config == other.config &&
           default_metadata == other.default_metadata;
  }
};

struct Config {
  std::vector<std::filesystem::path> plugin_path;  // resolved against the file's directory
  StringMap labels;
  std::optional<std::string> default_provider;
  std::map<std::string, ProviderBlock> providers;
  // When set, replaces Host::Options::deadlines (only the keys given; the others keep defaults).
  std::optional<Deadlines> deadlines;
  // The `serve` section as written, when present: sbx serve's settings, read and checked by sbx
  // serve (serve/settings.hpp); the host only requires an object. `source` names where the config
  // came from ("sbx.json"), for errors about sections read elsewhere.
  std::optional<boost::json::object> serve;
  std::string source;

  // Throws ConfigError("<source>: <JSON path>: <problem>").
  static Config parse(std::string_view json_text, std::string_view source = "config",
                      const std::filesystem::path& base_dir = {});
  // Reads and parses `file`, which must be a regular file (a directory, FIFO, device or socket is
  // a ConfigError naming it, at once: a FIFO is not waited on), at most 16 MiB.
  static Config load(const std::filesystem::path& file);
};

}  // namespace sbx
