// sbx::Host: plugin discovery, provider resolution by name, and the host labels.

#include "abi_glue.hpp"

#include <sbx/core/host.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

namespace sbx {
namespace {

namespace fs = std::filesystem;

// This process's run id: $SBX_RUN_ID, else 12 random hex digits chosen once.
const std::string& run_id() {
  static const std::string id = [] {
    if (const char* env = std::getenv("SBX_RUN_ID"); env && *env) return std::string(env);
    std::random_device rd;
    std::uniform_int_distribution<int> digit(0, 15);
    std::string out;
    for (int i = 0; i < 12; ++i)
      out += "0123456789abcdef"[digit(rd)];
    return out;
  }();
  return id;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::vector<fs::path> split_path_list(const char* text) {
  std::vector<fs::path> out;
  if (!text) return out;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string_view item = rest.substr(0, colon);
    if (!item.empty()) out.emplace_back(item);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return out;
}

}  // namespace

struct Host::Impl {
  Options options;
  StringMap labels;
  std::mutex mutex;
  bool scanned = false;
  std::map<fs::path, std::shared_ptr<detail::PluginLibrary>> libraries;  // loaded, by path
  std::vector<PluginInfo> infos;                                         // every file found
  std::map<std::string, std::shared_ptr<detail::Generation>, std::less<>> providers;

  std::vector<fs::path> dirs() const {
    std::vector<fs::path> out = options.plugin_dirs;
    for (const auto& p : options.config.plugin_path)
      out.push_back(p);
    if (options.use_default_plugin_dirs) {
      for (const auto& p : split_path_list(std::getenv("SBX_PLUGIN_PATH")))
        out.push_back(p);
      out.push_back(boost::dll::program_location().parent_path().parent_path() / "plugins");
    }
    return out;
  }

  // Loads a plugin file (once per path). Failures are recorded, then rethrown.
  std::shared_ptr<detail::PluginLibrary> load_locked(const fs::path& path) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(path, ec);
    if (ec) key = path;
    if (auto it = libraries.find(key); it != libraries.end()) return it->second;
    try {
      auto lib = detail::PluginLibrary::load(key);
      libraries.emplace(key, lib);
      infos.push_back(lib->info());
      return lib;
    } catch (const Error& e) {
      PluginInfo failed;
      failed.path = key;
      failed.error = e.what();
      infos.push_back(failed);
      detail::logger()->warn("skipping plugin: {}", e.what());
      throw;
    }
  }

  void scan_locked() {
    if (scanned) return;
    scanned = true;
    std::set<fs::path> files;
    for (const fs::path& dir : dirs()) {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        if (entry.path().extension() == ".so" && entry.is_regular_file()) {
          files.insert(entry.path());
        }
      }
    }
    for (const fs::path& file : files) {
      try {
        load_locked(file);
      } catch (const Error&) {
        // recorded in infos; the other plugins keep working
      }
    }
  }

  // Libraries offering `provider_id`, among the scanned ones.
  std::vector<std::shared_ptr<detail::PluginLibrary>> offering(std::string_view provider_id) {
    std::vector<std::shared_ptr<detail::PluginLibrary>> out;
    for (const auto& [path, lib] : libraries) {
      if (lib->factory(provider_id)) out.push_back(lib);
    }
    return out;
  }

  // Like PATH: a plugin in an earlier directory shadows one offering the same id in a later one
  // (so --plugin-dir and $SBX_PLUGIN_PATH can override build/plugins). Two in one directory are
  // ambiguous.
  std::shared_ptr<detail::PluginLibrary> first_in_search_order(
      const std::vector<std::shared_ptr<detail::PluginLibrary>>& candidates,
      const std::string& block_name, const std::string& id) const {
    const std::vector<fs::path> search = dirs();
    auto rank = [&](const detail::PluginLibrary& lib) {
      for (size_t i = 0; i < search.size(); ++i) {
        std::error_code ec;
        if (fs::equivalent(search[i], lib.path().parent_path(), ec)) return i;
      }
      return search.size();
    };
    std::vector<std::pair<size_t, std::shared_ptr<detail::PluginLibrary>>> ranked;
    for (const auto& c : candidates)
      ranked.emplace_back(rank(*c), c);
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    if (ranked.size() > 1 && ranked[0].first == ranked[1].first) {
      std::string paths;
      for (const auto& [r, c] : ranked)
        if (r == ranked[0].first) paths += (paths.empty() ? "" : ", ") + c->path().string();
      throw ConfigError("provider '" + block_name + "': provider id '" + id +
                        "' is offered by several plugins in one directory: " + paths);
    }
    for (size_t i = 1; i < ranked.size(); ++i) {
      detail::logger()->info("provider id '{}': {} shadows {}", id,
                             ranked[0].second->path().string(), ranked[i].second->path().string());
    }
    return ranked.front().second;
  }

  std::vector<std::string> available_names() {
    std::set<std::string> names;
    for (const auto& [name, block] : options.config.providers)
      names.insert(name);
    for (const auto& [path, lib] : libraries) {
      for (const auto& kind : lib->info().providers)
        names.insert(kind.id);
    }
    return {names.begin(), names.end()};
  }

  std::shared_ptr<detail::Generation> create_locked(const ProviderBlock& block) {
    auto [file, id] = detail::split_plugin_ref(block.plugin);
    std::shared_ptr<detail::PluginLibrary> lib;
    if (!file.empty()) {
      lib = load_locked(file);
      if (id.empty()) {
        if (lib->plugin().factory_count != 1) {
          throw ConfigError("provider '" + block.name + "': " + file.string() + " offers " +
                            std::to_string(lib->plugin().factory_count) +
                            " providers; name one as \"" + file.string() + "#<provider id>\"");
        }
        id = lib->plugin().factories[0]->id;
      }
    } else {
      scan_locked();
      auto candidates = offering(id);
      if (candidates.empty()) {
        throw ConfigError("provider '" + block.name + "': no plugin offers provider id '" + id +
                          "' (searched: " + dirs_text() + ")");
      }
      lib = first_in_search_order(candidates, block.name, id);
    }
    const sbx_provider_factory* factory = lib->factory(id);
    if (!factory) {
      throw ConfigError("provider '" + block.name + "': " + lib->path().string() +
                        " does not offer provider id '" + id + "'");
    }
    return detail::make_generation(lib, *factory, block, labels, options.deadlines);
  }

  std::string dirs_text() const {
    std::string out;
    for (const auto& d : dirs())
      out += (out.empty() ? "" : ", ") + d.string();
    return out.empty() ? "no plugin directories" : out;
  }
};

Host::Host() : Host(Options{}) {}

Host::Host(Options options) : impl_(std::make_unique<Impl>()) {
  options.deadlines.validate();
  impl_->options = std::move(options);
  impl_->labels = impl_->options.config.labels;
  for (const auto& [k, v] : impl_->options.labels)
    impl_->labels[k] = v;
  impl_->labels["sbx.run"] = run_id();
  impl_->labels["sbx.host"] = host_name();
}

Host::~Host() = default;

const Config& Host::config() const {
  return impl_->options.config;
}
const StringMap& Host::labels() const {
  return impl_->labels;
}
std::vector<fs::path> Host::plugin_dirs() const {
  return impl_->dirs();
}

std::vector<PluginInfo> Host::plugins() {
  std::lock_guard lock(impl_->mutex);
  impl_->scan_locked();
  return impl_->infos;
}

std::vector<ProviderInfo> Host::providers() {
  std::lock_guard lock(impl_->mutex);
  impl_->scan_locked();
  std::vector<ProviderInfo> out;
  for (const auto& [name, block] : impl_->options.config.providers) {
    out.push_back({name, block.plugin, true});
  }
  for (const auto& [path, lib] : impl_->libraries) {
    for (const auto& kind : lib->info().providers) {
      if (!impl_->options.config.providers.count(kind.id)) {
        out.push_back({kind.id, path.string() + "#" + kind.id, false});
      }
    }
  }
  return out;
}

Provider Host::provider(std::string_view name) {
  std::lock_guard lock(impl_->mutex);
  if (auto it = impl_->providers.find(name); it != impl_->providers.end()) {
    return Provider(it->second);
  }
  ProviderBlock block;
  if (auto it = impl_->options.config.providers.find(std::string(name));
      it != impl_->options.config.providers.end()) {
    block = it->second;
  } else {
    impl_->scan_locked();
    if (name.empty() || impl_->offering(name).empty()) {
      std::string available;
      for (const auto& n : impl_->available_names())
        available += (available.empty() ? "" : ", ") + n;
      throw InvalidArgumentError(
          "Unknown sandbox provider '" + std::string(name) +
          "'. Available providers: " + (available.empty() ? "<none>" : available));
    }
    block.name = std::string(name);
    block.plugin = std::string(name);  // a provider id, with its default (empty) config
  }
  auto generation = impl_->create_locked(block);
  impl_->providers.emplace(std::string(name), generation);
  return Provider(generation);
}

Provider Host::default_provider() {
  const Config& c = impl_->options.config;
  if (c.default_provider) return provider(*c.default_provider);
  if (c.providers.size() == 1) return provider(c.providers.begin()->first);
  if (c.providers.empty()) {
    bool offered;
    {
      std::lock_guard lock(impl_->mutex);
      impl_->scan_locked();
      offered = !impl_->offering(kDefaultProviderId).empty();
    }
    if (offered) return provider(kDefaultProviderId);
  }
  std::string names;
  for (const auto& [name, block] : c.providers)
    names += (names.empty() ? "" : ", ") + name;
  throw InvalidArgumentError(
      "no provider named: name one (configured: " + (names.empty() ? "none" : names) +
      "), or set \"default_provider\" in the config");
}

}  // namespace sbx
