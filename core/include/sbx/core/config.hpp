// The host's JSON configuration: named provider blocks, the same idea as NeMo Gym's named
// `sandbox:` blocks.
//
//   {
//     "plugin_path": ["./plugins"],                 // optional: extra plugin directories
//     "labels": {"team": "infra"},                  // optional: stamped on every sandbox
//     "default_provider": "docker",                 // optional: used when none is named
//     "deadlines": {"grace_s": 30},                 // optional: sbx::Deadlines, in seconds
//     "providers": {
//       "docker": {
//         "plugin": "local_docker",                 // provider id, or "path/x.so[#id]"
//         "config": {"exec": {"default_timeout_s": 60}},
//         "default_metadata": {"team": "infra"}
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

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx {

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
};

struct Config {
  std::vector<std::filesystem::path> plugin_path;  // resolved against the file's directory
  StringMap labels;
  std::optional<std::string> default_provider;
  std::map<std::string, ProviderBlock> providers;
  // When set, replaces Host::Options::deadlines (only the keys given; the others keep defaults).
  std::optional<Deadlines> deadlines;

  // Throws ConfigError("<source>: <JSON path>: <problem>").
  static Config parse(std::string_view json_text, std::string_view source = "config",
                      const std::filesystem::path& base_dir = {});
  static Config load(const std::filesystem::path& file);
};

}  // namespace sbx
