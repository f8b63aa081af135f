// Loading one plugin file: Boost.DLL with RTLD_NOW | RTLD_LOCAL, then the entry symbol, the
// descriptor's size and ABI version are checked before anything else in the plugin is called.

#include "abi_glue.hpp"

#include <sbx/core/errors.hpp>

#include <boost/dll/shared_library_load_mode.hpp>

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

namespace sbx::detail {
namespace {

// RTLD_NOW: unresolved symbols fail the load, not a later call. RTLD_LOCAL: plugins never see each
// other's symbols. Under ThreadSanitizer plugins also stay resident (RTLD_NODELETE): TSan keeps the
// shadow state of an unloaded library's memory, so a plugin loaded again at the same address would
// show races that never happened.
boost::dll::load_mode::type load_flags() {
#if defined(__SANITIZE_THREAD__)
  constexpr unsigned kResident = RTLD_NODELETE;
#else
  constexpr unsigned kResident = 0;
#endif
  return static_cast<boost::dll::load_mode::type>(
      static_cast<unsigned>(boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local) |
      kResident);
}

std::string version_text(const sbx_version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

[[noreturn]] void refuse(const std::filesystem::path& path, const std::string& why) {
  throw PluginLoadError(path.string() + ": " + why);
}

// Every library loaded in this process, by path. dlopen returns the image already loaded for a
// file, so two hosts loading one plugin share one PluginLibrary: init runs once, and deinit after
// the last user is gone. Loading and unloading are serialised, so an image is never initialised
// while its deinit runs. Recursive: a failed load destroys its library while the lock is held.
// Never destroyed: the janitor thread may still unload a library while the process exits.
struct Loaded {
  std::recursive_mutex mutex;
  std::map<std::filesystem::path, std::weak_ptr<PluginLibrary>> libraries;
};
Loaded& loaded() {
  static Loaded* const instance = new Loaded();
  return *instance;
}

}  // namespace

std::shared_ptr<PluginLibrary> PluginLibrary::load(const std::filesystem::path& path) {
  Loaded& registry = loaded();
  std::lock_guard lock(registry.mutex);
  if (auto it = registry.libraries.find(path); it != registry.libraries.end()) {
    if (auto lib = it->second.lock()) return lib;
  }
  std::shared_ptr<PluginLibrary> lib = open(path);
  registry.libraries[path] = lib;
  return lib;
}

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path& path) {
  std::shared_ptr<PluginLibrary> lib = make_deferred_shared(new PluginLibrary());
  lib->path_ = path;

  boost::dll::fs::error_code ec;
  lib->library_.load(path, load_flags(), ec);
  if (ec) {
    // Boost.DLL keeps only a generic code; the loader's own message is still in dlerror().
    const char* why = ::dlerror();
    refuse(path, "cannot load the library: " + std::string(why ? why : ec.message().c_str()));
  }
  if (!lib->library_.has(SBX_PLUGIN_ENTRY_SYMBOL)) {
    refuse(path, "not an sbx plugin: it does not export " SBX_PLUGIN_ENTRY_SYMBOL);
  }
  auto& entry = lib->library_.get<const sbx_plugin*()>(SBX_PLUGIN_ENTRY_SYMBOL);
  const sbx_plugin* plugin = entry();
  if (!plugin) refuse(path, SBX_PLUGIN_ENTRY_SYMBOL " returned no descriptor");
  // Check the version before the size: a plugin of another major may lay its struct out otherwise,
  // but the first two fields are fixed by every version.
  if (plugin->struct_size < offsetof(sbx_plugin, abi_version) + sizeof(sbx_version)) {
    refuse(path, "its plugin descriptor is too small to be an sbx plugin");
  }
  const sbx_version host_abi = SBX_ABI_VERSION_INIT;
  if (!sbx_version_is_compatible(plugin->abi_version)) {
    refuse(path, "plugin ABI version " + version_text(plugin->abi_version) +
                     " is not compatible with this host's ABI version " + version_text(host_abi) +
                     " (major versions differ)");
  }
  // Every struct check below asks for the fields of ABI 1.0: a plugin built against any 1.x works.
  if (!SBX_HAS_FIELD(plugin, sbx_plugin, factories)) {
    refuse(path, "its plugin descriptor has " + std::to_string(plugin->struct_size) +
                     " bytes; ABI 1.0 defines " +
                     std::to_string(offsetof(sbx_plugin, factories) + sizeof(plugin->factories)));
  }
  if (!plugin->init || !plugin->deinit || (plugin->factory_count && !plugin->factories) ||
      !plugin->name) {
    refuse(path, "its plugin descriptor is incomplete");
  }
  for (size_t i = 0; i < plugin->factory_count; ++i) {
    const sbx_provider_factory* f = plugin->factories[i];
    if (!f || !SBX_HAS_FIELD(f, sbx_provider_factory, create) || !f->id || !f->create) {
      refuse(path, "provider factory #" + std::to_string(i) + " is incomplete");
    }
  }
  lib->plugin_ = plugin;
  lib->host_ = std::make_unique<HostBinding>(std::string("plugin.") + plugin->name);

  ErrorCollector errors;
  const sbx_status status = plugin->init(lib->host_->get(), &errors.sink);
  if (status != SBX_STATUS_OK) {
    refuse(path, "init failed: " + (errors.message.empty()
                                        ? std::string("status ") + std::to_string(status)
                                        : errors.message));
  }
  lib->initialised_ = true;
  return lib;
}

PluginLibrary::~PluginLibrary() {
  Loaded& registry = loaded();
  std::lock_guard lock(registry.mutex);
  if (initialised_) plugin_->deinit();
  library_.unload();
  if (auto it = registry.libraries.find(path_);
      it != registry.libraries.end() && it->second.expired()) {
    registry.libraries.erase(it);
  }
}

const sbx_provider_factory* PluginLibrary::factory(std::string_view provider_id) const {
  for (size_t i = 0; i < plugin_->factory_count; ++i) {
    if (provider_id == plugin_->factories[i]->id) return plugin_->factories[i];
  }
  return nullptr;
}

PluginInfo PluginLibrary::info() const {
  PluginInfo info;
  info.path = path_;
  info.name = plugin_->name;
  info.version = plugin_->version ? plugin_->version : "";
  info.description = plugin_->description ? plugin_->description : "";
  info.abi_version = plugin_->abi_version;
  for (size_t i = 0; i < plugin_->factory_count; ++i) {
    const sbx_provider_factory* f = plugin_->factories[i];
    info.providers.push_back(
        {f->id, f->description ? f->description : "", f->config_schema ? f->config_schema : ""});
  }
  return info;
}

}  // namespace sbx::detail
