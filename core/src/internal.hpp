// Host-core internals shared by the core's source files: loaded plugin libraries, host services,
// provider generations and sandbox state.
#pragma once

#include "descriptor.hpp"

#include <sbx/abi/entry.h>
#include <sbx/core/deadlines.hpp>
#include <sbx/core/host.hpp>
#include <sbx/core/spec.hpp>

#include <spdlog/logger.h>
#include <boost/dll/shared_library.hpp>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace sbx::detail {

// ---- Config (config.cpp) ----------------------------------------------------------------------

// A block's `plugin`: "path/to/x.so#id" -> {"path/to/x.so", "id"}; a bare provider id (no '/', not
// ending in .so) gives an empty path and the id.
std::pair<std::filesystem::path, std::string> split_plugin_ref(const std::string& ref);

// ---- Text (spec.cpp)
// -----------------------------------------------------------------------------

// Text that crosses the ABI must be UTF-8 (docs/abi/strings.md); the host refuses anything else
// before a plugin sees it: InvalidArgumentError("<what> is not valid UTF-8 (byte N)").
void require_utf8(std::string_view text, std::string_view what);

// ---- Host services (host_services.cpp) ----------------------------------------------------------

// The sbx_host given to a plugin (init) or a provider (factory), logging to a named spdlog logger.
// Address-stable: plugins keep the pointer.
class HostBinding {
 public:
  explicit HostBinding(const std::string& logger_name);
  const sbx_host* get() const noexcept { return &host_; }

 private:
  sbx_host host_{};
  std::shared_ptr<spdlog::logger> logger_;
};

// The host's logger for its own messages ("sbx"), or a named child sharing its sinks.
std::shared_ptr<spdlog::logger> logger(const std::string& name = "sbx");

// Deletes objects whose last reference dropped inside a plugin callback on a host thread instead
// (a provider must not be destroyed from inside its own callbacks).
void destroy_later(std::function<void()> destroy);

template <class T>
std::shared_ptr<T> make_deferred_shared(T* object) {
  return std::shared_ptr<T>(object, [](T* p) {
    if (CallbackScope::active()) {
      destroy_later([p] { delete p; });
    } else {
      delete p;
    }
  });
}

// ---- Plugin libraries (plugin_library.cpp)
// -------------------------------------------------------

// One loaded and initialised plugin file. Destroying it calls deinit and unloads the library; every
// provider made from it holds a reference, so that happens after the last one is destroyed.
//
// The file is never mapped itself: every load maps a private copy, unlinked as soon as it is
// mapped, so the plugin file may be overwritten in place (cp writes into the same inode) while it
// runs without a SIGBUS in this process, and nothing is left on disk while it is loaded or after
// it unloads (a crash between the copy and the dlopen may leave one `<name>-XXXXXX.so` in the temp
// directory).
//
// One object per plugin file and identity (its inode, size and times) per process, shared by every
// Host: init and deinit are strictly paired, and a file whose last user is going away is loaded
// again only after its deinit has returned. No host lock is held while the plugin's init or deinit
// runs.
class PluginLibrary {
 public:
  // Makes the private copy of a plugin file to load: a new file of its own, checked as the caller
  // requires. The loader owns the file it returns (it unlinks it in every case). Throws
  // PluginLoadError.
  using CopyMaker = std::function<std::filesystem::path()>;

  // Loads the plugin file `source`, whose identity is `key` (discovery.hpp's FileIdentity as
  // text), from the copy `make_copy` makes, with RTLD_NOW | RTLD_LOCAL; checks the entry symbol
  // and the descriptor (descriptor.hpp), unlinks the copy, then calls init. Throws PluginLoadError
  // naming `source`. The same `source` and `key` already loaded in this process (by any Host)
  // give the same library, without a copy. `expected`: what the probe reported for the file; a
  // descriptor that differs is refused before init (a forged probe answer or cache entry).
  static std::shared_ptr<PluginLibrary> load(const std::filesystem::path& source,
                                             const std::string& key, const CopyMaker& make_copy,
                                             const Descriptor* expected = nullptr);
  // Reads the descriptor of `path` in this process without calling init, for hosts that have no
  // probe program (discovery.cpp): a broken file can crash the process. Throws PluginLoadError.
  static Descriptor describe(const std::filesystem::path& path);
  ~PluginLibrary();

  // The plugin file it was loaded from (not the copy: that is gone).
  const std::filesystem::path& path() const noexcept { return path_; }
  const sbx_plugin& plugin() const noexcept { return *plugin_; }
  const sbx_provider_factory* factory(std::string_view provider_id) const;

 private:
  PluginLibrary() = default;
  static std::shared_ptr<PluginLibrary> open(const std::filesystem::path& source,
                                             const std::filesystem::path& copy,
                                             const Descriptor* expected);
  std::filesystem::path path_;
  std::string key_;  // the registry's key: path_ and the file's identity
  boost::dll::shared_library library_;
  const sbx_plugin* plugin_ = nullptr;
  std::unique_ptr<HostBinding> host_;
  bool initialised_ = false;
  bool registered_ = false;  // load() recorded it in the process-wide registry
};

// ---- Providers (provider.cpp)
// ---------------------------------------------------------------------

// A provider instance with everything it needs to stay valid: its library and its host binding.
// Sandboxes and operations hold a reference; the provider is destroyed after the last one.
struct Generation {
  std::shared_ptr<PluginLibrary> library;
  std::unique_ptr<HostBinding> host;
  sbx_provider* provider = nullptr;
  std::string name;
  std::string provider_id;
  std::string plugin_path;  // the plugin file loaded (through a private copy, unlinked once mapped)
  std::string source_path;  // the plugin file it came from
  StringMap default_metadata;
  StringMap labels;
  Deadlines deadlines;
  uint64_t serial = 0;  // names this generation in reports about callback tokens (calls.cpp)
  // For Host::generations(): sandboxes of this generation the host holds (SandboxState), and
  // operations started on it that the plugin has not completed (calls.cpp).
  std::atomic<int64_t> sandboxes{0};
  std::atomic<int64_t> operations{0};

  ~Generation() {
    if (provider) provider->destroy(provider);
  }
  const void* extension(const char* id) const {
    return provider->get_extension ? provider->get_extension(provider, id) : nullptr;
  }
};

// Creates a provider from a library's factory; throws the plugin's error as an sbx:: exception.
std::shared_ptr<Generation> make_generation(std::shared_ptr<PluginLibrary> library,
                                            const sbx_provider_factory& factory,
                                            const ProviderBlock& block, const StringMap& labels,
                                            const Deadlines& deadlines);

// Registers a generation for reports about its callbacks (calls.cpp); returns its serial.
uint64_t register_generation(const std::shared_ptr<Generation>& generation);

// ---- Sandboxes (sandbox.cpp)
// ------------------------------------------------------------------------

// Made by make_deferred_shared: when its last reference drops inside a plugin callback (a
// completion's context on the plugin's thread), release_sandbox runs on the host's janitor thread,
// never on the plugin's thread inside its own callback (a plugin whose sandbox joins its reader
// threads on release would join itself there).
struct SandboxState {
  std::shared_ptr<Generation> generation;
  sbx_sandbox* handle = nullptr;
  std::string id;
  std::optional<std::string> workdir;
  std::vector<int64_t> ports;
  std::atomic<bool> closed{false};
  // Host::move_to_current gave the sandbox a handle on a newer generation: destroying this one's
  // Sandbox no longer closes it.
  std::atomic<bool> moved{false};

  SandboxState(std::shared_ptr<Generation> of, sbx_sandbox* sandbox)
      : generation(std::move(of)), handle(sandbox) {
    generation->sandboxes.fetch_add(1, std::memory_order_relaxed);
  }
  ~SandboxState() {
    if (handle) generation->provider->release_sandbox(generation->provider, handle);
    generation->sandboxes.fetch_sub(1, std::memory_order_relaxed);
  }
};

}  // namespace sbx::detail
