// A plugin's descriptor (sbx_plugin) as plain data, checked: what the host may learn from a plugin
// file without initialising it. Shared by the in-process loader (plugin_library.cpp) and the
// out-of-process probe (core/probe/), which is how the host reads descriptors (discovery.cpp).
// No spdlog and no sbx::Error here: the probe links this file alone.
#pragma once

#include <sbx/abi/entry.h>

#include <boost/json/value.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sbx::detail {

struct Descriptor {
  struct Provider {
    std::string id;
    std::string description;
    std::string config_schema;
  };
  std::string name;
  std::string version;
  std::string description;
  sbx_version abi_version{};
  std::vector<Provider> providers;

  boost::json::value to_json() const;
  // Throws std::runtime_error for JSON that is not a descriptor (e.g. a damaged cache entry), and
  // DescriptorError for one read_descriptor would refuse (an incompatible ABI major, an invalid
  // or repeated provider id, an empty name, text that is not UTF-8): it came from another process
  // or a file, and may be forged.
  static Descriptor from_json(const boost::json::value& json);
  // "name version (ABI x.y, provider ids: a, b)", for messages.
  std::string summary() const;
  bool operator==(const Descriptor& other) const { return to_json() == other.to_json(); }
};

// Why a descriptor is refused, e.g. "plugin ABI version 2.0 is not compatible with ...".
struct DescriptorError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads and checks what `sbx_plugin_entry` returned: not NULL, large enough, the ABI major of
// this host, init/deinit present, every factory complete with an id of [a-z0-9_.-]+ that appears
// once, every string valid UTF-8. Throws DescriptorError. Reads only the descriptor: nothing of
// the plugin runs.
Descriptor read_descriptor(const sbx_plugin* plugin);

// Whether `id` is a valid provider id: 1 to 64 characters of [a-z0-9_.-].
bool valid_provider_id(std::string_view id) noexcept;

}  // namespace sbx::detail
