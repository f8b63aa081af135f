#include "descriptor.hpp"

#include <sbx/base/utf8.hpp>

#include <boost/json.hpp>

#include <set>

namespace sbx::detail {
namespace {

namespace json = boost::json;

std::string version_text(const sbx_version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

[[noreturn]] void refuse(const std::string& why) {
  throw DescriptorError(why);
}

// A descriptor string: NULL allowed where `optional`, else required; always UTF-8.
std::string text(const char* value, const std::string& what, bool optional) {
  if (!value) {
    if (optional) return {};
    refuse("its descriptor has no " + what);
  }
  std::string out(value);
  if (!base::utf8::valid(out)) refuse("its " + what + " is not valid UTF-8");
  return out;
}

std::string string_at(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (!v || !v->is_string())
    throw std::runtime_error("descriptor JSON: no string " + std::string(key));
  return std::string(v->get_string());
}

}  // namespace

bool valid_provider_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Descriptor read_descriptor(const sbx_plugin* plugin) {
  if (!plugin) refuse(SBX_PLUGIN_ENTRY_SYMBOL " returned no descriptor");
  // The version comes before the size check: a plugin of another major may lay its struct out
  // otherwise, but the first two fields are fixed by every version.
  if (plugin->struct_size < offsetof(sbx_plugin, abi_version) + sizeof(sbx_version)) {
    refuse("its plugin descriptor is too small to be an sbx plugin");
  }
  const sbx_version host_abi = SBX_ABI_VERSION_INIT;
  if (!sbx_version_is_compatible(plugin->abi_version)) {
    refuse("plugin ABI version " + version_text(plugin->abi_version) +
           " is not compatible with this host's ABI version " + version_text(host_abi) +
           " (major versions differ)");
  }
  // Every check below asks for the fields of ABI 1.0: a plugin built against any 1.x works.
  if (!SBX_HAS_FIELD(plugin, sbx_plugin, factories)) {
    refuse("its plugin descriptor has " + std::to_string(plugin->struct_size) +
           " bytes; ABI 1.0 defines " +
           std::to_string(offsetof(sbx_plugin, factories) + sizeof(plugin->factories)));
  }
  if (!plugin->init || !plugin->deinit || (plugin->factory_count && !plugin->factories)) {
    refuse("its plugin descriptor is incomplete (init, deinit or factories missing)");
  }
  if (plugin->factory_count > 1024) refuse("its plugin descriptor lists over 1024 factories");
  Descriptor d;
  d.name = text(plugin->name, "name", false);
  if (d.name.empty()) refuse("its plugin name is empty");
  d.version = text(plugin->version, "version", true);
  d.description = text(plugin->description, "description", true);
  d.abi_version = plugin->abi_version;
  std::set<std::string> ids;
  for (size_t i = 0; i < plugin->factory_count; ++i) {
    const sbx_provider_factory* f = plugin->factories[i];
    const std::string which = "provider factory #" + std::to_string(i);
    if (!f || !SBX_HAS_FIELD(f, sbx_provider_factory, create) || !f->id || !f->create) {
      refuse(which + " is incomplete");
    }
    Descriptor::Provider p;
    p.id = text(f->id, which + "'s id", false);
    if (!valid_provider_id(p.id)) {
      refuse(which + " has the id '" + p.id +
             "'; a provider id is 1 to 64 characters of a-z, 0-9, '_', '.' and '-'");
    }
    if (!ids.insert(p.id).second) refuse("it offers provider id '" + p.id + "' twice");
    p.description = text(f->description, which + "'s description", true);
    p.config_schema = text(f->config_schema, which + "'s config schema", true);
    d.providers.push_back(std::move(p));
  }
  return d;
}

json::value Descriptor::to_json() const {
  json::array list;
  for (const auto& p : providers) {
    list.push_back(json::object{
        {"id", p.id}, {"description", p.description}, {"config_schema", p.config_schema}});
  }
  return json::object{
      {"name", name},
      {"version", version},
      {"description", description},
      {"abi_version", json::array{abi_version.major, abi_version.minor, abi_version.patch}},
      {"providers", std::move(list)}};
}

Descriptor Descriptor::from_json(const json::value& value) {
  if (!value.is_object()) throw std::runtime_error("descriptor JSON: not an object");
  const json::object& o = value.get_object();
  Descriptor d;
  d.name = string_at(o, "name");
  d.version = string_at(o, "version");
  d.description = string_at(o, "description");
  const auto* abi = o.if_contains("abi_version");
  if (!abi || !abi->is_array() || abi->get_array().size() != 3) {
    throw std::runtime_error("descriptor JSON: no abi_version");
  }
  const auto& a = abi->get_array();
  d.abi_version = {static_cast<uint32_t>(a[0].to_number<uint64_t>()),
                   static_cast<uint32_t>(a[1].to_number<uint64_t>()),
                   static_cast<uint32_t>(a[2].to_number<uint64_t>())};
  const auto* providers = o.if_contains("providers");
  if (!providers || !providers->is_array())
    throw std::runtime_error("descriptor JSON: no providers");
  for (const auto& item : providers->get_array()) {
    if (!item.is_object()) throw std::runtime_error("descriptor JSON: a provider is not an object");
    const auto& p = item.get_object();
    d.providers.push_back(
        {string_at(p, "id"), string_at(p, "description"), string_at(p, "config_schema")});
  }
  // The rules read_descriptor applies to a plugin: this JSON came from another process or a file
  // (a probe's answer, the probe cache), which a plugin or a user may have forged.
  const sbx_version host_abi = SBX_ABI_VERSION_INIT;
  if (!sbx_version_is_compatible(d.abi_version)) {
    refuse("descriptor JSON: plugin ABI version " + version_text(d.abi_version) +
           " is not compatible with this host's ABI version " + version_text(host_abi));
  }
  if (d.name.empty()) refuse("descriptor JSON: the plugin name is empty");
  for (const std::string* text : {&d.name, &d.version, &d.description}) {
    if (!base::utf8::valid(*text)) refuse("descriptor JSON: a string is not valid UTF-8");
  }
  std::set<std::string> ids;
  for (const auto& p : d.providers) {
    if (!valid_provider_id(p.id)) {
      refuse("descriptor JSON: the provider id '" + p.id +
             "' is not 1 to 64 characters of a-z, 0-9, '_', '.' and '-'");
    }
    if (!ids.insert(p.id).second) refuse("descriptor JSON: provider id '" + p.id + "' twice");
    if (!base::utf8::valid(p.description) || !base::utf8::valid(p.config_schema)) {
      refuse("descriptor JSON: a string of provider '" + p.id + "' is not valid UTF-8");
    }
  }
  return d;
}

std::string Descriptor::summary() const {
  std::string ids;
  for (const auto& p : providers)
    ids += (ids.empty() ? "" : ", ") + p.id;
  return name + " " + version + " (ABI " + version_text(abi_version) +
         ", provider ids: " + (ids.empty() ? "none" : ids) + ")";
}

}  // namespace sbx::detail
