// sbx::Host: plugin discovery, provider resolution by name, and the host labels.

#include "abi_glue.hpp"
#include "descriptor.hpp"
#include "discovery.hpp"

#include <sbx/abi/ext/connect.h>
#include <sbx/core/host.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

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

// A copy of the exception being handled, of its class, owned by the caller alone. Waiters on a
// shared load each throw one: an exception object that several threads read and one of them frees
// last is ordered only by libstdc++'s reference count, which ThreadSanitizer cannot see (decision
// 250). The classes Host::provider raises that a status alone does not name are kept by name.
std::exception_ptr own_copy_of_current() {
  try {
    try {
      throw;
    } catch (const PluginLoadError& e) {
      return std::make_exception_ptr(PluginLoadError(e));
    } catch (const ConfigError& e) {
      return std::make_exception_ptr(ConfigError(e));
    } catch (...) {
      throw_error(to_error(std::current_exception()));  // the class its status names
    }
  } catch (...) {
    return std::current_exception();
  }
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

fs::path canonical_or_same(const fs::path& path) {
  std::error_code ec;
  fs::path key = fs::weakly_canonical(path, ec);
  return ec ? path : key;
}

// The plugin directory of an installed program (<program dir>/../lib/sbx/plugins by default,
// SBX_PLUGINS_FROM_BIN) when it exists, else the build tree's (<program dir>/../plugins, next to
// build/bin) when that exists, else the installed one.
fs::path default_plugin_dir() {
  const fs::path bin = boost::dll::program_location().parent_path();
  const fs::path installed = (bin / SBX_PLUGINS_FROM_BIN).lexically_normal();
  const fs::path built = bin.parent_path() / "plugins";
  std::error_code ec;
  if (fs::is_directory(installed, ec) || !fs::is_directory(built, ec)) return installed;
  return built;
}

// Every plugin file of the search directories and what it offers, read without loading any of
// them into this process (discovery.hpp).
struct Catalog {
  struct File {
    PluginInfo info;
    detail::FileIdentity identity;
  };
  std::vector<File> files;
};

}  // namespace

// Where a provider name's current generation came from: the plugin file (before any copy), its
// identity then, and the block it was made from. What a reload compares against.
struct Origin {
  fs::path source;
  detail::FileIdentity identity;
  ProviderBlock block;
};

// A generation just made, with its origin.
struct Made {
  std::shared_ptr<detail::Generation> generation;
  Origin origin;
};

namespace {

// What a reload waits on while plugin code runs on a thread of its own (run_bounded), shared with
// the threads of steps it abandoned, which may outlive the Host.
struct ReloadWaits {
  std::mutex mutex;
  std::condition_variable wake;  // a step finished, or stop_reloads() was called
  bool stopping = false;         // Host::stop_reloads(): no reload waits for plugin code any more
  size_t abandoned = 0;          // steps abandoned whose plugin code has not returned yet
};

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

// Runs `work` (plugin code: a load, init, provider creation or canary) on a thread of its own and
// waits until it returns, `limit` passes or the host stops reloading. On time: its result (or its
// exception). Else the step is abandoned: TimeoutError (`what` says which deadline) or, when
// stopping, CancelledError; the thread is detached and keeps what it made (a library and a
// generation are never unloaded while that thread may still run in them); if the plugin code
// ever returns, the thread drops the result (destroying the provider, unloading the library) and
// ends. `work` must not refer to the Host: the Host may be gone by then.
template <class T>
T run_bounded(const std::shared_ptr<ReloadWaits>& waits, std::chrono::milliseconds limit,
              const std::string& what, std::function<T()> work) {
  struct Step {
    bool done = false;
    bool abandoned = false;
    std::optional<T> result;
    std::exception_ptr error;
  };
  auto step = std::make_shared<Step>();
  std::thread worker([waits, step, work = std::move(work)]() mutable {
    std::optional<T> result;
    std::exception_ptr error;
    try {
      result.emplace(work());
    } catch (...) {
      error = std::current_exception();
    }
    work = nullptr;  // what it captured goes here, before the step counts as finished
    bool abandoned = false;
    {
      std::lock_guard lock(waits->mutex);
      step->done = true;
      abandoned = step->abandoned;
      if (!abandoned) {
        step->result = std::move(result);
        step->error = error;
      }
    }
    if (abandoned) {
      result.reset();  // an abandoned generation: destroyed and unloaded here, on this thread
      error = nullptr;
      std::lock_guard lock(waits->mutex);
      --waits->abandoned;
    }
    waits->wake.notify_all();
  });
  std::unique_lock lock(waits->mutex);
  waits->wake.wait_for(lock, limit, [&] { return step->done || waits->stopping; });
  if (step->done) {
    lock.unlock();
    worker.join();
    if (step->error) std::rethrow_exception(step->error);
    return std::move(*step->result);
  }
  step->abandoned = true;
  ++waits->abandoned;
  const bool stopping = waits->stopping;
  lock.unlock();
  worker.detach();
  const std::string fate =
      "; the new generation is abandoned: never served, and left loaded while its plugin code "
      "runs (unloaded if that code ever returns)";
  if (stopping)
    throw CancelledError("the host is stopping: " + what + " was not waited for" + fate);
  throw TimeoutError(what + fate);
}

}  // namespace

struct Host::Impl {
  Options options;  // options.config is the config the host started with
  // Options::deadlines as given: a config's "deadlines" replace them (Host(), reload()).
  Deadlines base_deadlines;
  StringMap labels;
  detail::ProbeSettings probe;

  std::mutex reload_mutex;  // one reload at a time; held while plugin code runs (not `mutex`)
  std::shared_ptr<ReloadWaits> waits = std::make_shared<ReloadWaits>();
  std::mutex mutex;  // guards the members below; never held while plugin code runs
  std::shared_ptr<const Config> config;  // the config in force (replaced by a reload)
  std::optional<std::shared_future<std::shared_ptr<const Catalog>>> catalog;
  std::map<std::string, std::shared_future<std::shared_ptr<detail::Generation>>, std::less<>>
      providers;
  std::map<std::string, Origin, std::less<>> origins;   // of the names in `providers` that loaded
  std::vector<std::weak_ptr<detail::Generation>> made;  // every generation made, for generations()

  std::shared_ptr<const Config> current_config() {
    std::lock_guard lock(mutex);
    return config;
  }
  // The deadlines a generation made under `c` gets.
  Deadlines deadlines_of(const Config& c) const { return c.deadlines.value_or(base_deadlines); }

  // plugin_path is the start's: a reload refuses to change it.
  std::vector<fs::path> dirs() const {
    std::vector<fs::path> out = options.plugin_dirs;
    for (const auto& p : options.config.plugin_path)
      out.push_back(p);
    if (options.use_default_plugin_dirs) {
      for (const auto& p : split_path_list(std::getenv("SBX_PLUGIN_PATH")))
        out.push_back(p);
      out.push_back(default_plugin_dir());
    }
    return out;
  }

  // What one file offers; a file that cannot be read or probed is listed with the reason.
  Catalog::File examine(const fs::path& path) const {
    Catalog::File file;
    std::string why;
    if (auto identity = detail::identity_of(path, &why)) {
      file.identity = *identity;
      file.info = detail::probe_plugin(path, *identity, probe);
    } else {
      file.info.path = path;
      file.info.error = path.string() + ": cannot read the file: " + why;
    }
    return file;
  }

  static constexpr size_t kParallelProbes = 8;
  std::shared_ptr<const Catalog> scan() const {
    auto catalog = std::make_shared<Catalog>();
    std::set<fs::path> files;
    for (const fs::path& dir : dirs()) {
      std::error_code ec;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().extension() != ".so") continue;
        std::error_code type_error;  // a link to nowhere or a loop is listed as broken below
        if (it->is_directory(type_error)) continue;
        files.insert(canonical_or_same(it->path()));
      }
    }
    // Probed in parallel (a few at a time): hung files cost one probe timeout, not one each.
    const std::vector<fs::path> list(files.begin(), files.end());
    catalog->files.resize(list.size());
    std::atomic<size_t> next{0};
    const auto work = [&] {
      for (size_t i = next++; i < list.size(); i = next++)
        catalog->files[i] = examine(list[i]);
    };
    std::vector<std::thread> workers;
    const size_t count = std::min<size_t>(list.size(), kParallelProbes);
    for (size_t i = 1; i < count; ++i)
      workers.emplace_back(work);
    work();
    for (auto& worker : workers)
      worker.join();
    for (const auto& file : catalog->files) {
      if (!file.info.ok()) detail::logger()->debug("plugin file not usable: {}", file.info.error);
    }
    return catalog;
  }

  // The catalog, scanned once per Host by the first caller; others wait for it without the lock.
  std::shared_ptr<const Catalog> get_catalog() {
    std::unique_lock lock(mutex);
    if (catalog) {
      auto future = *catalog;
      lock.unlock();
      return future.get();
    }
    std::promise<std::shared_ptr<const Catalog>> promise;
    catalog = promise.get_future().share();
    lock.unlock();
    std::shared_ptr<const Catalog> scanned;
    try {
      scanned = scan();
    } catch (...) {  // out of memory: the next call scans again
      promise.set_exception(std::current_exception());
      lock.lock();
      catalog.reset();
      throw;
    }
    promise.set_value(scanned);
    return scanned;
  }

  static std::vector<const Catalog::File*> offering(const Catalog& c, std::string_view id) {
    std::vector<const Catalog::File*> out;
    for (const auto& f : c.files) {
      if (!f.info.ok()) continue;
      for (const auto& kind : f.info.providers) {
        if (kind.id == id) out.push_back(&f);
      }
    }
    return out;
  }

  // The place of `file`'s directory in the search order `search`; search.size() for none.
  static size_t search_rank(const fs::path& file, const std::vector<fs::path>& search) {
    for (size_t i = 0; i < search.size(); ++i) {
      std::error_code ec;
      if (fs::equivalent(search[i], file.parent_path(), ec)) return i;
    }
    return search.size();
  }

  // Like PATH: a plugin in an earlier directory shadows one offering the same id in a later one
  // (so --plugin-dir and $SBX_PLUGIN_PATH can override build/plugins). Two in one directory are
  // ambiguous.
  const Catalog::File& first_in_search_order(const std::vector<const Catalog::File*>& candidates,
                                             const std::string& block_name,
                                             const std::string& id) const {
    const std::vector<fs::path> search = dirs();
    std::vector<std::pair<size_t, const Catalog::File*>> ranked;
    for (const auto* c : candidates)
      ranked.emplace_back(search_rank(c->info.path, search), c);
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    if (ranked.size() > 1 && ranked[0].first == ranked[1].first) {
      std::string paths;
      for (const auto& [r, c] : ranked)
        if (r == ranked[0].first) paths += (paths.empty() ? "" : ", ") + c->info.path.string();
      throw ConfigError("provider '" + block_name + "': provider id '" + id +
                        "' is offered by several plugins in one directory: " + paths);
    }
    for (size_t i = 1; i < ranked.size(); ++i) {
      detail::logger()->warn("provider id '{}': {} shadows {}", id,
                             ranked[0].second->info.path.string(),
                             ranked[i].second->info.path.string());
    }
    return *ranked.front().second;
  }

  std::vector<std::string> available_names(const Catalog& c, const Config& config) const {
    std::set<std::string> names;
    for (const auto& [name, block] : config.providers)
      names.insert(name);
    for (const auto& f : c.files) {
      for (const auto& kind : f.info.providers)
        names.insert(kind.id);
    }
    return {names.begin(), names.end()};
  }

  // The plugin file a block names and the provider id in it: the file given, or the file of the
  // catalog that offers the id first in search order.
  std::pair<Catalog::File, std::string> resolve(const ProviderBlock& block,
                                                const Catalog* catalog) {
    auto [file, id] = detail::split_plugin_ref(block.plugin);
    if (!file.empty()) {
      Catalog::File probed = examine(canonical_or_same(file));
      if (!probed.info.ok()) throw PluginLoadError(probed.info.error);
      if (id.empty()) {
        if (probed.info.providers.size() != 1) {
          throw ConfigError("provider '" + block.name + "': " + file.string() + " offers " +
                            std::to_string(probed.info.providers.size()) +
                            " providers; name one as \"" + file.string() + "#<provider id>\"");
        }
        id = probed.info.providers[0].id;
      }
      return {std::move(probed), id};
    }
    std::shared_ptr<const Catalog> scanned;
    if (!catalog) {
      scanned = get_catalog();
      catalog = scanned.get();
    }
    const auto candidates = offering(*catalog, id);
    if (candidates.empty()) {
      throw ConfigError("provider '" + block.name + "': no plugin offers provider id '" + id +
                        "' (searched: " + dirs_text() + ")");
    }
    return {first_in_search_order(candidates, block.name, id), id};
  }

  // Loads the plugin file `probed` names into this process, from a private copy (never the file
  // itself: a plugin file overwritten in place would change the mapped code under the running
  // host, SIGBUS at best): a copy under a name of its own in the temp directory
  // (`<name>-XXXXXX.so`), mapped, then unlinked (the mapping stays; nothing is left on disk). A
  // file that changed since it was probed is probed again first; the copy is probed itself when
  // the file changed while it was copied. What the probe reported is checked against what this
  // process reads (a forged probe answer or cache entry is refused before the plugin's init
  // runs). An image of the same file and identity already loaded in this process is shared.
  // Static, with the probe settings given: a reload runs it on a thread that may outlive the Host.
  static std::shared_ptr<detail::PluginLibrary> load(const Catalog::File& probed,
                                                     const detail::ProbeSettings& probe) {
    const fs::path& source = probed.info.path;
    std::string why;
    const auto before = detail::identity_of(source, &why);
    if (!before) throw PluginLoadError(source.string() + ": cannot read the file: " + why);
    PluginInfo info = probed.info;
    if (*before != probed.identity) {
      info = detail::probe_plugin(source, *before, probe);
      if (!info.ok()) throw PluginLoadError(info.error);
    }
    detail::Descriptor expected = detail::descriptor_of(info);
    const std::string key = std::to_string(before->device) + ":" + std::to_string(before->inode) +
                            ":" + std::to_string(before->size) + ":" +
                            std::to_string(before->mtime_ns) + ":" +
                            std::to_string(before->ctime_ns);
    return detail::PluginLibrary::load(
        source, key, [&] { return private_copy(source, *before, probe, expected); }, &expected);
  }

  // A copy of `source` (identity `before` when it was probed) in the temp directory. When the file
  // changed while it was copied, the copy is probed and `expected` becomes what that probe read.
  // The caller owns the file returned.
  static fs::path private_copy(const fs::path& source, const detail::FileIdentity& before,
                               const detail::ProbeSettings& probe, detail::Descriptor& expected) {
    const fs::path pattern = fs::temp_directory_path() / (source.stem().string() + "-XXXXXX.so");
    std::string name = pattern.string();
    const int fd = ::mkostemps(name.data(), 3, O_CLOEXEC);
    if (fd < 0) {
      throw PluginLoadError(source.string() +
                            ": cannot make a copy to load: " + std::strerror(errno));
    }
    ::close(fd);
    const fs::path copy = name;
    struct Unlink {
      fs::path path;
      ~Unlink() {
        if (path.empty()) return;
        std::error_code ec;
        fs::remove(path, ec);
      }
    } unlink{copy};
    std::error_code ec;
    fs::copy_file(source, copy, fs::copy_options::overwrite_existing, ec);
    if (ec) throw PluginLoadError(source.string() + ": cannot copy it to load: " + ec.message());
    std::string why;
    const auto after = detail::identity_of(source, &why);
    if (!after || *after != before) {
      // Changed since it was probed, or while it was copied: the copy is read itself.
      const auto identity = detail::identity_of(copy, &why);
      if (!identity) throw PluginLoadError(source.string() + ": cannot read its copy: " + why);
      detail::ProbeSettings uncached = probe;
      uncached.cache_file.clear();  // a copy is read once: nothing to cache
      const PluginInfo info = detail::probe_plugin(copy, *identity, uncached);
      if (!info.ok()) {
        // Errors name the file the operator replaced, not the copy.
        std::string error = info.error;
        for (auto at = error.find(copy.string()); at != std::string::npos;
             at = error.find(copy.string(), at + source.string().size())) {
          error.replace(at, copy.string().size(), source.string());
        }
        throw PluginLoadError(error);
      }
      expected = detail::descriptor_of(info);
    }
    unlink.path.clear();  // the loader's now
    return copy;
  }

  // A generation for `block`. `reuse`: the library of the name's current generation, when the
  // plugin file has not changed; otherwise the file is loaded (from a private copy).
  Made create(const ProviderBlock& block, const Catalog* catalog = nullptr,
              std::shared_ptr<detail::PluginLibrary> reuse = {}) {
    auto [probed, id] = resolve(block, catalog);
    std::shared_ptr<detail::PluginLibrary> lib = reuse;
    if (!lib) lib = load(probed, probe);
    return make(std::move(lib), probed, id, block, labels, deadlines_of(*current_config()));
  }

  // The generation of provider `id` in `lib` for `block` (runs the plugin's factory). Static: a
  // reload runs it on a thread that may outlive the Host.
  static Made make(std::shared_ptr<detail::PluginLibrary> lib, const Catalog::File& probed,
                   const std::string& id, const ProviderBlock& block, const StringMap& labels,
                   const Deadlines& deadlines) {
    const sbx_provider_factory* factory = lib->factory(id);
    if (!factory) {
      throw ConfigError("provider '" + block.name + "': " + probed.info.path.string() +
                        " does not offer provider id '" + id + "'");
    }
    Made made{detail::make_generation(lib, *factory, block, labels, deadlines),
              Origin{probed.info.path, probed.identity, block}};
    made.generation->source_path = probed.info.path.string();
    return made;
  }

  // The block behind a provider name: a configured one, or a provider id with its default config.
  ProviderBlock block_for(std::string_view name) {
    const auto config = current_config();
    if (auto it = config->providers.find(std::string(name)); it != config->providers.end()) {
      return it->second;
    }
    const auto catalog = get_catalog();
    if (name.empty() || offering(*catalog, name).empty()) {
      std::string available;
      for (const auto& n : available_names(*catalog, *config))
        available += (available.empty() ? "" : ", ") + n;
      // A plugin file that did not load may be the one meant: say which and why.
      std::string broken;
      for (const auto& f : catalog->files) {
        if (!f.info.ok()) {
          broken += "; " + f.info.path.string() + " did not load: " + f.info.error;
        }
      }
      throw InvalidArgumentError(
          "Unknown sandbox provider '" + std::string(name) +
          "'. Available providers: " + (available.empty() ? "<none>" : available) + broken);
    }
    ProviderBlock block;
    block.name = std::string(name);
    block.plugin = std::string(name);  // a provider id, with its default (empty) config
    return block;
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
  impl_->base_deadlines = options.deadlines;
  if (options.config.deadlines) options.deadlines = *options.config.deadlines;
  options.deadlines.validate();
  for (const auto& [k, v] : options.labels) {
    detail::require_utf8(k, "a label name");
    detail::require_utf8(v, "the value of label " + k);
  }
  impl_->options = std::move(options);
  impl_->config = std::make_shared<const Config>(impl_->options.config);
  impl_->labels = impl_->options.config.labels;
  for (const auto& [k, v] : impl_->options.labels)
    impl_->labels[k] = v;
  impl_->labels["sbx.run"] = run_id();
  impl_->labels["sbx.host"] = host_name();
  impl_->probe.program = detail::probe_program(impl_->options.probe_program);
  impl_->probe.cache_file = detail::probe_cache_file(impl_->options.plugin_cache);
  impl_->probe.timeout = Deadlines::ms(impl_->options.probe_timeout_s);
  if (impl_->probe.program.empty()) {
    static std::once_flag once;
    std::call_once(once, [] {
      detail::logger()->warn(
          "sbx-plugin-probe was not found (set $SBX_PLUGIN_PROBE): plugin files are read in this "
          "process, where a broken one can crash it");
    });
  }
}

Host::~Host() = default;

Config Host::config() const {
  return *impl_->current_config();
}
const StringMap& Host::labels() const {
  return impl_->labels;
}
std::vector<fs::path> Host::plugin_dirs() const {
  return impl_->dirs();
}

std::vector<PluginInfo> Host::plugins() {
  const std::vector<fs::path> search = impl_->dirs();
  std::vector<std::pair<size_t, PluginInfo>> ranked;
  for (const auto& f : impl_->get_catalog()->files)
    ranked.emplace_back(Impl::search_rank(f.info.path, search), f.info);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.path < b.second.path;
  });
  // Each id's offers, in search order, as first_in_search_order sees them.
  struct Offer {
    size_t rank;
    const fs::path* path;
    PluginInfo::ProviderKind* kind;
  };
  std::map<std::string, std::vector<Offer>> offers;
  for (auto& [rank, info] : ranked) {
    if (!info.ok()) continue;
    for (auto& kind : info.providers) {
      auto& list = offers[kind.id];
      if (list.empty() || list.back().path != &info.path) list.push_back({rank, &info.path, &kind});
    }
  }
  using Use = PluginInfo::ProviderKind::Use;
  for (auto& [id, list] : offers) {
    const size_t first = list.front().rank;
    for (auto& offer : list) {
      for (const auto& other : list) {
        if (other.path == offer.path) continue;
        if (offer.rank != first) {
          if (other.rank == first) offer.kind->others.push_back(*other.path);
        } else if (other.rank == first) {
          offer.kind->use = Use::ambiguous;
          offer.kind->others.push_back(*other.path);
        } else if (offer.kind->use == Use::used) {
          offer.kind->others.push_back(*other.path);
        }
      }
      if (offer.rank != first) offer.kind->use = Use::shadowed;
    }
  }
  std::vector<PluginInfo> out;
  for (auto& entry : ranked)
    out.push_back(std::move(entry.second));
  return out;
}

std::vector<ProviderInfo> Host::providers() {
  const auto catalog = impl_->get_catalog();
  const auto config = impl_->current_config();
  std::vector<ProviderInfo> out;
  for (const auto& [name, block] : config->providers) {
    out.push_back({name, block.plugin, true});
  }
  for (const auto& f : catalog->files) {
    for (const auto& kind : f.info.providers) {
      if (!config->providers.count(kind.id)) {
        out.push_back({kind.id, f.info.path.string() + "#" + kind.id, false});
      }
    }
  }
  return out;
}

// Each name is resolved once: concurrent first calls share one load (no lock held meanwhile),
// and a failed one is forgotten so that a later call can try again.
Provider Host::provider(std::string_view name) {
  std::unique_lock lock(impl_->mutex);
  if (auto it = impl_->providers.find(name); it != impl_->providers.end()) {
    auto future = it->second;
    lock.unlock();
    try {
      return Provider(future.get());
    } catch (...) {
      std::rethrow_exception(own_copy_of_current());
    }
  }
  std::promise<std::shared_ptr<detail::Generation>> promise;
  impl_->providers.emplace(std::string(name), promise.get_future().share());
  lock.unlock();
  try {
    Made made = impl_->create(impl_->block_for(name));
    auto generation = made.generation;
    {
      std::lock_guard record(impl_->mutex);
      impl_->origins.insert_or_assign(std::string(name), std::move(made.origin));
      impl_->made.push_back(generation);
    }
    promise.set_value(generation);
    return Provider(generation);
  } catch (...) {
    promise.set_exception(own_copy_of_current());  // not the object this thread goes on throwing
    lock.lock();
    impl_->providers.erase(impl_->providers.find(name));
    throw;
  }
}

Provider Host::default_provider() {
  const auto current = impl_->current_config();
  const Config& c = *current;
  if (c.default_provider) return provider(*c.default_provider);
  if (c.providers.size() == 1) return provider(c.providers.begin()->first);
  if (c.providers.empty() && !Impl::offering(*impl_->get_catalog(), kDefaultProviderId).empty()) {
    return provider(kDefaultProviderId);
  }
  std::string names;
  for (const auto& [name, block] : c.providers)
    names += (names.empty() ? "" : ", ") + name;
  throw InvalidArgumentError(
      "no provider named: name one (configured: " + (names.empty() ? "none" : names) +
      "), or set \"default_provider\" in the config");
}

// ---- Reload ------------------------------------------------------------------------------------

namespace {

std::string list_text(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// The canary of a new generation: create, run the command, close. Throws what failed, saying at
// which step.
void run_canary(const std::shared_ptr<detail::Generation>& generation, const Canary& canary) {
  Provider provider(generation);
  Sandbox box;
  try {
    box = provider.create(canary.spec);
  } catch (const Error& e) {
    throw_error(Error(e.status(), std::string("canary create: ") + e.what()));
  }
  ExecOptions options;
  options.timeout_s = canary.timeout_s;
  ExecResult result;
  try {
    result = box.exec(canary.command, options);
  } catch (const Error& e) {
    throw_error(Error(e.status(), std::string("canary exec: ") + e.what()));
  }
  try {
    box.close();
  } catch (const Error& e) {
    throw_error(Error(e.status(), std::string("canary close: ") + e.what()));
  }
  if (result.return_code != 0) {
    std::string detail = result.stderr_text.substr(0, 300);
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == '\r'))
      detail.pop_back();
    throw InternalError("canary exec: '" + canary.command + "' exited " +
                        std::to_string(result.return_code) +
                        (result.error_type ? " (" + *result.error_type + ")" : std::string()) +
                        (detail.empty() ? std::string() : ": " + detail));
  }
}

}  // namespace

ReloadReport Host::reload(Config next) {
  std::lock_guard one_at_a_time(impl_->reload_mutex);
  const auto current = impl_->current_config();
  const auto refuse = [](const std::string& why) -> void {
    throw ReloadError("reload refused, nothing changed: " + why);
  };
  {
    std::lock_guard lock(impl_->waits->mutex);
    if (impl_->waits->stopping) refuse("the host is stopping");
  }
  // What the host reads only at start.
  if (next.plugin_path != current->plugin_path) {
    refuse("plugin_path changed; it applies at the next start");
  }
  if (next.labels != current->labels) refuse("labels changed; they apply at the next start");
  // Changed deadlines apply to the new generations; every loaded block gets one (sandboxes and
  // operations of the old generations keep the deadlines they started with).
  const Deadlines deadlines = impl_->deadlines_of(next);
  try {
    deadlines.validate();
  } catch (const Error& e) {
    refuse(std::string("deadlines: ") + e.what());
  }
  const bool deadlines_changed = !(deadlines == impl_->deadlines_of(*current));

  // Plugin files may have been replaced, added or removed since the last scan.
  const auto catalog = impl_->scan();
  std::map<std::string, Origin, std::less<>> origins;
  std::map<std::string, std::shared_ptr<detail::Generation>, std::less<>> loaded;
  {
    std::lock_guard lock(impl_->mutex);
    origins = impl_->origins;
    for (const auto& [name, future] : impl_->providers) {
      if (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        loaded[name] = future.get();
      } catch (...) {  // a failed first load: nothing to compare against
      }
    }
  }

  ReloadReport report;
  std::vector<Made> built;
  for (const auto& [name, block] : next.providers) {
    const auto before = current->providers.find(name);
    const auto origin = origins.find(name);
    const auto generation = loaded.find(name);
    const bool is_loaded = origin != origins.end() && generation != loaded.end();
    // The file the block names now, and whether it is the one the current generation runs.
    bool same_file = false;
    std::string step = "load";
    try {
      if (is_loaded) {
        auto [probed, id] = impl_->resolve(block, catalog.get());
        same_file =
            probed.info.path == origin->second.source && probed.identity == origin->second.identity;
      }
      const bool same_block = before != current->providers.end() &&
                              before->second.same_provider(block) && is_loaded &&
                              origin->second.block.same_provider(block) && !deadlines_changed;
      if (before == current->providers.end()) {
        report.added.push_back(name);
      } else if (same_block && same_file) {
        report.unchanged.push_back(name);
        continue;
      } else if (!is_loaded && before->second.same_provider(block)) {
        report.unchanged.push_back(name);  // never loaded: the next use loads it as configured
        continue;
      } else {
        report.changed.push_back(name);
      }
      // Plugin code runs on threads of their own, each step within a deadline (run_bounded).
      auto resolved = impl_->resolve(block, catalog.get());
      const Catalog::File probed = std::move(resolved.first);
      const std::string id = std::move(resolved.second);
      // Another provider kind cannot read the sandboxes the old one made (no move), and clients
      // see another backend: only when the block says so.
      if (is_loaded && id != generation->second->provider_id && !block.allow_kind_change) {
        step = "provider kind";
        throw FailedPreconditionError(
            "the provider kind would change from '" + generation->second->provider_id + "' to '" +
            id + "' (" + probed.info.path.string() +
            "); set \"allow_kind_change\": true in the block to allow it");
      }
      std::shared_ptr<detail::PluginLibrary> reuse =
          same_file ? generation->second->library : nullptr;
      Made made = run_bounded<Made>(
          impl_->waits, deadlines.call(),
          "loading, initialising and configuring it did not finish within " +
              seconds_text(deadlines.call_s) + " (deadlines.call_s)",
          [probed, id, block, reuse, probe = impl_->probe, labels = impl_->labels, deadlines] {
            return Impl::make(reuse ? reuse : Impl::load(probed, probe), probed, id, block, labels,
                              deadlines);
          });
      step = "canary";
      if (block.canary) {
        const Canary& canary = *block.canary;
        // What the host would wait for its three calls: the create, the exec, the close.
        const double create_s = std::max(
            deadlines.create_s, canary.spec.ready_timeout_s.value_or(0) + deadlines.grace_s);
        const double limit_s = create_s + canary.timeout_s + deadlines.grace_s + deadlines.call_s;
        run_bounded<bool>(impl_->waits, Deadlines::ms(limit_s),
                          "it did not finish within " + seconds_text(limit_s) +
                              " (deadlines.create_s + canary timeout_s + deadlines.grace_s + "
                              "deadlines.call_s)",
                          [generation = made.generation, canary] {
                            run_canary(generation, canary);
                            return true;
                          });
      }
      built.push_back(std::move(made));
    } catch (const Error& e) {
      // The new generations made so far are dropped here, unused: their libraries unload.
      refuse("provider '" + name + "' (" + block.plugin + "): " + step + ": " + e.what());
    } catch (const std::exception& e) {
      refuse("provider '" + name + "' (" + block.plugin + "): " + step + ": " + e.what());
    }
  }
  for (const auto& [name, block] : current->providers) {
    if (!next.providers.count(name)) report.removed.push_back(name);
  }

  // All built: put them in service at once.
  {
    std::lock_guard lock(impl_->mutex);
    for (Made& made : built) {
      std::promise<std::shared_ptr<detail::Generation>> ready;
      ready.set_value(made.generation);
      impl_->providers.insert_or_assign(made.generation->name, ready.get_future().share());
      impl_->origins.insert_or_assign(made.generation->name, std::move(made.origin));
      impl_->made.push_back(made.generation);
    }
    for (const auto& name : report.removed) {
      if (auto it = impl_->providers.find(name); it != impl_->providers.end()) {
        impl_->providers.erase(it);
      }
      if (auto it = impl_->origins.find(name); it != impl_->origins.end()) {
        impl_->origins.erase(it);
      }
    }
    std::promise<std::shared_ptr<const Catalog>> scanned;
    scanned.set_value(catalog);
    impl_->catalog = scanned.get_future().share();
    impl_->config = std::make_shared<const Config>(std::move(next));
  }
  detail::logger()->info("reload: added {}; changed {}; removed {}; unchanged {}",
                         list_text(report.added), list_text(report.changed),
                         list_text(report.removed), list_text(report.unchanged));
  return report;
}

void Host::stop_reloads() {
  {
    std::lock_guard lock(impl_->waits->mutex);
    impl_->waits->stopping = true;
  }
  impl_->waits->wake.notify_all();
}

size_t Host::abandoned_reload_steps() const {
  std::lock_guard lock(impl_->waits->mutex);
  return impl_->waits->abandoned;
}

std::vector<GenerationInfo> Host::generations() {
  std::vector<GenerationInfo> out;
  std::lock_guard lock(impl_->mutex);
  std::erase_if(impl_->made, [](const auto& weak) { return weak.expired(); });
  for (const auto& weak : impl_->made) {
    const auto generation = weak.lock();
    if (!generation) continue;
    GenerationInfo info;
    info.name = generation->name;
    info.serial = generation->serial;
    info.provider_id = generation->provider_id;
    info.plugin_file = generation->source_path;
    info.plugin_version = generation->library->plugin().version;
    info.sandboxes = generation->sandboxes.load(std::memory_order_relaxed);
    info.operations = generation->operations.load(std::memory_order_relaxed);
    if (auto it = impl_->providers.find(generation->name);
        it != impl_->providers.end() &&
        it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      try {
        info.current = it->second.get() == generation;
      } catch (...) {
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::optional<Sandbox> Host::move_to_current(Sandbox& sandbox) {
  const std::shared_ptr<detail::SandboxState> state = sandbox.state_;
  if (!state || state->closed.load()) {
    throw FailedPreconditionError("cannot move a sandbox that is closed or was never started");
  }
  const std::shared_ptr<detail::Generation>& from = state->generation;
  std::shared_future<std::shared_ptr<detail::Generation>> current;
  {
    std::lock_guard lock(impl_->mutex);
    const auto it = impl_->providers.find(from->name);
    if (it == impl_->providers.end()) {
      throw FailedPreconditionError("cannot move sandbox " + state->id + ": provider '" +
                                    from->name + "' is no longer configured");
    }
    current = it->second;
  }
  const std::shared_ptr<detail::Generation> to = current.get();
  if (to == from) return std::nullopt;
  auto generation_text = [](const detail::Generation& g) {
    return "generation " + std::to_string(g.serial) + " (" + g.provider_id + " " +
           g.library->plugin().version + ")";
  };
  const std::string what = "cannot move sandbox " + state->id + " of provider '" + from->name +
                           "' from " + generation_text(*from) + " to " + generation_text(*to);
  if (from->provider_id != to->provider_id) {
    throw FailedPreconditionError(what + ": a descriptor is read only by the provider kind that " +
                                  "wrote it (" + from->provider_id + " and " + to->provider_id +
                                  " differ)");
  }
  for (const auto* g : {from.get(), to.get()}) {
    if (!g->extension(SBX_EXT_CONNECT)) {
      throw FailedPreconditionError(what + ": " + generation_text(*g) + " does not offer " +
                                    SBX_EXT_CONNECT);
    }
  }
  // Claimed first: two moves of one handle would make two handles that each close the sandbox.
  if (state->moved.exchange(true)) {
    throw FailedPreconditionError(what +
                                  ": it was moved already (use the handle the move returned)");
  }
  try {
    Sandbox moved = Provider(to).connect(sandbox.serialize());
    if (state->closed.load()) {  // closed through the old handle meanwhile: nothing to move
      moved.detach();
      throw FailedPreconditionError(what + ": it was closed during the move");
    }
    detail::logger()->info("moved sandbox {} of provider '{}' from generation {} to {}", state->id,
                           from->name, from->serial, to->serial);
    return moved;
  } catch (...) {
    state->moved.store(false);
    throw;
  }
}

}  // namespace sbx
