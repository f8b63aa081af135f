// sbx::Host: finds plugins, reads the configuration, and hands out providers by name.
//
//   sbx::Host host({.config = sbx::Config::load("sbx.json")});
//   sbx::Provider docker = host.provider("docker");
//   sbx::Sandbox box = docker.create({.image = "sbx-busybox:latest"});
//   sbx::ExecResult r = box.exec("echo hi");
//
// Plugins are the *.so files in the plugin directories: $SBX_PLUGIN_PATH (colon-separated), the
// config's plugin_path, and the running program's own: `<program dir>/../lib/sbx/plugins` for an
// installed program (where `cmake --install` and the sbx package put plugins), else
// `<program dir>/../plugins` in a build tree. A program of your own that embeds sbx::core is not
// installed next to them: pass Options::plugin_dirs and probe_program (the CMake package's
// SBX_PLUGIN_DIR and SBX_PLUGIN_PROBE, docs/packaging.md). What each file offers
// is read by a probe process (sbx-plugin-probe), never by loading every file here: a file that is
// not a usable plugin, or that crashes or hangs whoever loads it, is reported (plugins()) and
// skipped, and only the plugin a provider needs is loaded into this process.
//
// THREADING: all members are thread-safe.
#pragma once

#include <sbx/abi/version.h>
#include <sbx/core/config.hpp>
#include <sbx/core/deadlines.hpp>
#include <sbx/core/provider.hpp>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx {

struct PluginInfo {
  struct ProviderKind {
    std::string id;
    std::string description;
    std::string config_schema;
    // When several files offer this id, which one the host uses (Host::provider's rule: the file
    // in the earliest plugin directory; two in that directory make the id unusable). Filled by
    // Host::plugins(): `used` with `others` the files it shadows; `shadowed` with `others` the
    // file used instead; `ambiguous` with `others` the files beside it offering the id too.
    enum class Use { used, shadowed, ambiguous };
    Use use = Use::used;
    std::vector<std::filesystem::path> others;
  };
  std::filesystem::path path;
  std::string name;
  std::string version;
  std::string description;
  sbx_version abi_version{};
  std::vector<ProviderKind> providers;
  std::string error;  // why the host refused this file; empty when usable

  bool ok() const { return error.empty(); }
};

// What a reload did, by provider block name.
struct ReloadReport {
  std::vector<std::string> added;      // new blocks: a generation made and in service
  std::vector<std::string> changed;    // a new generation in service; the old one drains
  std::vector<std::string> removed;    // no longer served by name; their sandboxes drain
  std::vector<std::string> unchanged;  // kept as they were
};

// One provider generation: a provider instance and the plugin image it runs on.
struct GenerationInfo {
  std::string name;         // the provider block's name
  uint64_t serial = 0;      // unique in this process
  std::string provider_id;  // e.g. "local_docker"
  std::string plugin_file;  // the plugin file it was loaded from (before any copy)
  std::string plugin_version;
  bool current = false;    // Host::provider(name) hands out this one
  int64_t sandboxes = 0;   // sandboxes of it this process holds
  int64_t operations = 0;  // operations started on it that the plugin has not completed
};

struct ProviderInfo {
  std::string name;         // block name, or the provider id for unconfigured providers
  std::string plugin;       // as configured
  bool configured = false;  // false: available by provider id with its default config
};

class Host {
 public:
  struct Options {
    Config config;
    std::vector<std::filesystem::path> plugin_dirs;  // searched before the defaults
    bool use_default_plugin_dirs = true;
    StringMap labels;     // added to the config's labels and the automatic ones (sbx.run, sbx.host)
    Deadlines deadlines;  // how long the host waits for a provider (deadlines.hpp)
    // sbx-plugin-probe; empty: $SBX_PLUGIN_PROBE, next to the program, ../libexec/sbx/, or the
    // build tree's. Without one, plugin files are read in this process (a warning says so).
    std::filesystem::path probe_program;
    // Where probe results are cached; empty: $SBX_PLUGIN_CACHE, else
    // $XDG_CACHE_HOME/sbx/plugin-scan.json or ~/.cache/sbx/plugin-scan.json; "off": no disk cache.
    std::filesystem::path plugin_cache;
    // How long the probe may take to read one file before the file counts as broken.
    double probe_timeout_s = 10;
  };

  Host();
  explicit Host(Options options);
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // The config in force: the one given at start, or the last one a reload put in service.
  Config config() const;

  // Every plugin file found, usable or not, as a probe process read it (none is loaded here), in
  // search order (then by path), each provider id with which file the host uses for it.
  std::vector<PluginInfo> plugins();
  // Configured provider blocks, then provider ids not shadowed by a block.
  std::vector<ProviderInfo> providers();

  // The provider named `name`: a config block, or else a provider id offered by a plugin (with an
  // empty config). Throws InvalidArgumentError("Unknown sandbox provider 'x'. Available providers:
  // a, b") for other names, ConfigError (an InvalidArgumentError) for a config the provider
  // refuses, PluginLoadError when the plugin cannot be used. Providers are created once and cached.
  Provider provider(std::string_view name);
  // The default provider: config.default_provider, else the only configured block, else (with no
  // blocks) the project's default provider id, local_docker, when a plugin offers it.
  Provider default_provider();
  static constexpr const char* kDefaultProviderId = "local_docker";

  // Puts `next` in service, all or nothing (docs/hot-swap.md). Blocks added, and blocks whose
  // plugin, config or default metadata changed, or whose plugin file changed on disk (a replaced
  // file, or another file now first in search order), each get a new generation: loaded from a
  // copy of the file under a name of its own (so a replaced file is really loaded again), checked
  // by the probe, initialised, configured, then put through the block's canary when it has one.
  // Only when every one of them is ready are they put in service together: from then on
  // provider(name) hands out the new generation, while every Sandbox and Provider handed out
  // before keeps working on the generation that made it; an old generation's library is unloaded
  // after its last sandbox and operation are gone. Removed blocks stop being served by name.
  // Throws ReloadError ("reload refused, nothing changed: provider 'x' (plugin): load|canary:
  // why") when any step fails: the old generations stay in service and nothing changed. Refuses
  // changes to plugin_path and labels (read at start). Changed deadlines apply to new generations:
  // every loaded block gets one (sandboxes of the old generations keep the old deadlines). One
  // reload runs at a time. Plugin code runs on a thread of its own per step, within a deadline: the
  // load (dlopen, the plugin's init, the provider's creation) within deadlines.call_s, the canary
  // within deadlines.create_s + its timeout_s + deadlines.grace_s + deadlines.call_s. A step past
  // its deadline refuses the reload naming the block, the step and the deadline; its generation is
  // abandoned (never served; it stays loaded while its thread may run in it, and is unloaded by
  // that thread if the plugin code ever returns: abandoned_reload_steps()).
  ReloadReport reload(Config next);

  // Makes a reload in progress stop waiting for plugin code at once (its step is abandoned as at
  // a deadline and the reload refused: "the host is stopping"), and refuses later reloads. For a
  // server that stops while a reload hangs in a plugin. THREADING: thread-safe; does not block.
  void stop_reloads();
  // Steps of reloads that were abandoned (deadline passed, or stop_reloads()) and whose plugin
  // code has not returned yet: each holds a thread and a loaded library. THREADING: thread-safe.
  size_t abandoned_reload_steps() const;

  // Every generation this host made that is still alive: the current ones and those draining.
  std::vector<GenerationInfo> generations();

  // Moves `sandbox` to the current generation of the block that made it, through sbx.connect/1
  // (docs/hot-swap.md, "Moving sandboxes instead of draining them"): the old generation
  // serializes it, the current one connects to it. Returns the new handle, or nullopt when
  // `sandbox` is already on the current generation. The old handle stays usable (operations
  // started on it finish on the old generation) and no longer closes the sandbox when destroyed;
  // closing through either handle closes the sandbox. Throws FailedPreconditionError when the
  // sandbox cannot move: it is empty or closed (also: closed while moving), it was moved already,
  // its block was removed, either generation lacks sbx.connect/1, or their provider ids differ (a
  // descriptor is only read by the provider kind that wrote it); or the error of the serialize or
  // the connect. `sandbox` is then unchanged and drains on its generation.
  // THREADING: thread-safe. Blocking: a serialize and a connect (plugin calls, within the host's
  // deadlines).
  std::optional<Sandbox> move_to_current(Sandbox& sandbox);

  // The labels every sandbox gets: sbx.run (this process's run id), sbx.host, plus configured ones.
  const StringMap& labels() const;

  // The directories searched for plugins, in order.
  std::vector<std::filesystem::path> plugin_dirs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx
