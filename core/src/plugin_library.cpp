// Loading one plugin file: Boost.DLL with RTLD_NOW | RTLD_LOCAL, then the entry symbol and the
// descriptor are checked before anything else in the plugin is called.

#include "abi_glue.hpp"
#include "descriptor.hpp"

#include <sbx/core/errors.hpp>

#include <boost/dll/shared_library_load_mode.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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

[[noreturn]] void refuse(const std::filesystem::path& path, const std::string& why) {
  throw PluginLoadError(path.string() + ": " + why);
}

// Every library loaded in this process, by plugin file and identity, with where it stands. Two
// hosts loading one unchanged plugin file share one PluginLibrary: init runs once, and deinit after
// the last user is gone. A load that finds the file opening or closing waits until that has
// finished, so an image of one file is never initialised again before its deinit has returned.
// The lock is never held while plugin code runs.
// Never destroyed: the janitor thread may still unload a library while the process exits.
struct Registry {
  enum class State { opening, open, closing };
  struct Entry {
    State state = State::opening;
    std::weak_ptr<PluginLibrary> library;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Entry> entries;
};
Registry& registry() {
  static Registry* const instance = new Registry();
  return *instance;
}

// Refuses a loaded descriptor that is not what the probe reported for the file.
void check_expected(const std::filesystem::path& path, const Descriptor& loaded,
                    const Descriptor* expected) {
  if (!expected || loaded == *expected) return;
  refuse(path, "its descriptor, read in this process, is not what the plugin probe reported (" +
                   expected->summary() + " reported, " + loaded.summary() +
                   " loaded): a forged probe answer or probe cache entry; not initialised");
}

// `text` with every occurrence of `from` replaced by `to` (the loader's messages name the copy).
std::string renamed(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// Loads the file and reads its descriptor; nothing of the plugin but its loading and
// sbx_plugin_entry has run when this returns. Errors name `shown` (the plugin file a copy was
// made of).
const sbx_plugin* open_library(const std::filesystem::path& path,
                               boost::dll::shared_library& library,
                               const std::filesystem::path& shown,
                               const Descriptor* expected = nullptr) {
  boost::dll::fs::error_code ec;
  library.load(path, load_flags(), ec);
  if (ec) {
    // Boost.DLL keeps only a generic code; the loader's own message is still in dlerror().
    const char* why = ::dlerror();
    refuse(shown, "cannot load the library: " +
                      renamed(why ? why : ec.message(), path.string(), shown.string()));
  }
  if (!library.has(SBX_PLUGIN_ENTRY_SYMBOL)) {
    refuse(shown, "not an sbx plugin: it does not export " SBX_PLUGIN_ENTRY_SYMBOL);
  }
  auto& entry = library.get<const sbx_plugin*()>(SBX_PLUGIN_ENTRY_SYMBOL);
  const sbx_plugin* plugin = entry();
  Descriptor loaded;
  try {
    loaded = read_descriptor(plugin);
  } catch (const DescriptorError& e) {
    refuse(shown, e.what());
  }
  check_expected(shown, loaded, expected);
  return plugin;
}

}  // namespace

std::shared_ptr<PluginLibrary> PluginLibrary::load(const std::filesystem::path& source,
                                                   const std::string& key,
                                                   const CopyMaker& make_copy,
                                                   const Descriptor* expected) {
  const std::string id = source.string() + '\n' + key;
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  for (;;) {
    auto it = r.entries.find(id);
    if (it == r.entries.end()) {
      r.entries.emplace(id, Registry::Entry{});
      break;
    }
    if (it->second.state == Registry::State::open) {
      if (auto lib = it->second.library.lock()) {
        lock.unlock();
        check_expected(source, read_descriptor(lib->plugin_), expected);
        return lib;
      }
    }
    // Opening elsewhere, closing, or open with its last reference going away: wait until settled.
    r.changed.wait(lock);
  }
  lock.unlock();
  std::shared_ptr<PluginLibrary> lib;
  try {
    lib = open(source, make_copy(), expected);
  } catch (...) {
    lock.lock();
    r.entries.erase(id);
    r.changed.notify_all();
    throw;
  }
  lock.lock();
  lib->key_ = id;
  lib->registered_ = true;
  r.entries[id] = {Registry::State::open, lib};
  r.changed.notify_all();
  return lib;
}

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path& source,
                                                   const std::filesystem::path& copy,
                                                   const Descriptor* expected) {
  std::shared_ptr<PluginLibrary> lib = make_deferred_shared(new PluginLibrary());
  lib->path_ = source;
  const sbx_plugin* plugin = nullptr;
  try {
    plugin = open_library(copy, lib->library_, source, expected);
  } catch (...) {
    ::unlink(copy.c_str());
    throw;
  }
  // Mapped: the copy's name is no longer needed (the mapping keeps the inode), and nothing is
  // left on disk from here on, whatever happens to this process.
  ::unlink(copy.c_str());
  lib->plugin_ = plugin;
  lib->host_ = std::make_unique<HostBinding>(std::string("plugin.") + plugin->name);

  ErrorCollector errors;
  const sbx_status status = plugin->init(lib->host_->get(), &errors.sink);
  if (status != SBX_STATUS_OK) {
    refuse(source, "init failed: " + (errors.message.empty()
                                          ? std::string("status ") + sbx_status_name(status)
                                          : errors.message));
  }
  lib->initialised_ = true;
  return lib;
}

Descriptor PluginLibrary::describe(const std::filesystem::path& path) {
  boost::dll::shared_library library;
  return read_descriptor(open_library(path, library, path));
}

PluginLibrary::~PluginLibrary() {
  Registry& r = registry();
  if (registered_) {
    std::lock_guard lock(r.mutex);
    r.entries[key_].state = Registry::State::closing;
  }
  if (initialised_) plugin_->deinit();
  library_.unload();
  if (registered_) {
    std::lock_guard lock(r.mutex);
    if (auto it = r.entries.find(key_);
        it != r.entries.end() && it->second.state == Registry::State::closing) {
      r.entries.erase(it);
    }
    r.changed.notify_all();
  }
}

const sbx_provider_factory* PluginLibrary::factory(std::string_view provider_id) const {
  for (size_t i = 0; i < plugin_->factory_count; ++i) {
    if (provider_id == plugin_->factories[i]->id) return plugin_->factories[i];
  }
  return nullptr;
}

}  // namespace sbx::detail
