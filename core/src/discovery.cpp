// Reading plugin descriptors out of process, with a cache (see discovery.hpp).

#include "discovery.hpp"

#include "descriptor.hpp"
#include "internal.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

extern char** environ;

namespace sbx::detail {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

// The probe prints one line of JSON; anything much larger is not a descriptor.
constexpr size_t kMaxProbeOutput = 16 * 1024 * 1024;
constexpr size_t kMaxCacheFile = 64 * 1024 * 1024;
constexpr int kCacheFormat = 1;

std::string cache_host_key() {
  return "sbx " SBX_VERSION " ABI " + std::to_string(SBX_ABI_VERSION_MAJOR) + "." +
         std::to_string(SBX_ABI_VERSION_MINOR);
}

PluginInfo info_of(const fs::path& file, const Descriptor& d) {
  PluginInfo info;
  info.path = file;
  info.name = d.name;
  info.version = d.version;
  info.description = d.description;
  info.abi_version = d.abi_version;
  for (const auto& p : d.providers)
    info.providers.push_back({p.id, p.description, p.config_schema});
  return info;
}

}  // namespace

Descriptor descriptor_of(const PluginInfo& info) {
  Descriptor d;
  d.name = info.name;
  d.version = info.version;
  d.description = info.description;
  d.abi_version = info.abi_version;
  for (const auto& p : info.providers)
    d.providers.push_back({p.id, p.description, p.config_schema});
  return d;
}

namespace {

PluginInfo broken(const fs::path& file, const std::string& why) {
  PluginInfo info;
  info.path = file;
  info.error = file.string() + ": " + why;
  return info;
}

json::array identity_json(const FileIdentity& id) {
  return {id.device, id.inode, id.size, id.mtime_ns, id.ctime_ns};
}

// ---- Running the probe ------------------------------------------------------------------------

struct ProbeRun {
  std::string out;
  std::string err;
  int status = 0;  // from waitpid
  bool timed_out = false;
};

// Reads both pipes until they close or the deadline passes.
void drain(int out_fd, int err_fd, ProbeRun& run, Clock::time_point deadline) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_count = 2;
  char buffer[65536];
  while (open_count > 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      return;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        fds[i].fd = -1;  // poll ignores negative descriptors
        --open_count;
        continue;
      }
      if (sinks[i]->size() < kMaxProbeOutput) sinks[i]->append(buffer, static_cast<size_t>(n));
    }
  }
}

// Spawns `program file` with stdout and stderr on pipes, a clean signal state (the caller may
// block or ignore signals) and stdin from /dev/null.
ProbeRun run_probe(const fs::path& program, const fs::path& file,
                   std::chrono::milliseconds timeout) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw std::system_error(e, std::generic_category(), "pipe");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  sigdelset(&defaults, SIGKILL);
  sigdelset(&defaults, SIGSTOP);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // A process group of its own: whatever the plugin's code starts in it is killed with it.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::string program_text = program.string();
  std::string file_text = file.string();
  char* argv[] = {program_text.data(), file_text.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program_text.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  ProbeRun run;
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::system_error(rc, std::generic_category(), "starting " + program_text);
  }
  drain(out[0], err[0], run, Clock::now() + timeout);
  ::close(out[0]);
  ::close(err[0]);
  // The group goes (a hung probe, anything it started); its id is still the unreaped probe's, so
  // no other process can have it.
  if (run.timed_out) ::kill(-pid, SIGKILL);
  while (::waitpid(pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  return run;
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

// The probe's verdict on `file`; `cacheable` is false for a verdict that may change with no change
// to the file (a probe that could not start, an unreadable answer). A timeout is remembered for
// the file's version (its identity): a hung file costs one probe timeout, not one per command;
// a changed file is probed again.
PluginInfo probe_out_of_process(const fs::path& file, const ProbeSettings& settings,
                                bool& cacheable) {
  cacheable = false;
  ProbeRun run;
  try {
    run = run_probe(settings.program, file, settings.timeout);
  } catch (const std::exception& e) {
    return broken(file, std::string("cannot run the plugin probe: ") + e.what());
  }
  if (run.timed_out) {
    cacheable = true;
    return broken(file, "broken plugin file: loading it did not finish within " +
                            std::to_string(settings.timeout.count() / 1000) + " s");
  }
  if (WIFSIGNALED(run.status)) {
    cacheable = true;
    const int sig = WTERMSIG(run.status);
    const char* abbrev = ::sigabbrev_np(sig);
    return broken(
        file, "broken plugin file: loading it crashed the plugin probe (" +
                  (abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig)) + ": " +
                  ::strsignal(sig) + ")");
  }
  boost::system::error_code ec;
  const json::value out = json::parse(run.out, ec);
  if (ec || !out.is_object() || WEXITSTATUS(run.status) != 0) {
    cacheable = WIFEXITED(run.status);
    return broken(file, "broken plugin file: the plugin probe failed (exit " +
                            std::to_string(WEXITSTATUS(run.status)) + ")" +
                            (run.err.empty() ? std::string() : ": " + first_line(run.err)));
  }
  cacheable = true;
  const json::object& o = out.get_object();
  if (const auto* error = o.if_contains("error"); error && error->is_string()) {
    return broken(file, std::string(error->get_string()));
  }
  try {
    return info_of(file, Descriptor::from_json(o.at("descriptor")));
  } catch (const std::exception& e) {
    cacheable = false;
    return broken(file, std::string("the plugin probe gave an unreadable answer: ") + e.what());
  }
}

// ---- The caches -------------------------------------------------------------------------------

struct Cached {
  FileIdentity identity;
  PluginInfo info;
};

class ProbeCache {
 public:
  static bool exists(const fs::path& file) {
    std::error_code ec;
    return fs::exists(file, ec) || ec;  // an error (e.g. no permission): keep the entry
  }

  std::optional<PluginInfo> find(const fs::path& file, const FileIdentity& id,
                                 const fs::path& cache_file) {
    std::lock_guard lock(mutex_);
    if (auto it = memory_.find(file); it != memory_.end() && it->second.identity == id) {
      return it->second.info;
    }
    if (cache_file.empty()) return std::nullopt;
    const json::object& disk = disk_locked(cache_file);
    const auto* entry = disk.if_contains(file.string());
    if (!entry || !entry->is_object()) return std::nullopt;
    try {
      const json::object& e = entry->get_object();
      if (e.at("identity") != json::value(identity_json(id))) return std::nullopt;
      PluginInfo info = e.contains("error")
                            ? broken(file, "")
                            : info_of(file, Descriptor::from_json(e.at("descriptor")));
      if (e.contains("error")) info.error = std::string(e.at("error").as_string());
      memory_[file] = {id, info};
      return info;
    } catch (const std::exception&) {  // a damaged entry: probe again
      return std::nullopt;
    }
  }

  void store(const fs::path& file, const FileIdentity& id, const PluginInfo& info, bool to_disk,
             const fs::path& cache_file) {
    std::lock_guard lock(mutex_);
    // Files gone are forgotten (a reload's copies are unlinked once loaded; test directories
    // come and go): neither cache grows with every file ever read.
    std::erase_if(memory_, [](const auto& entry) { return !exists(entry.first); });
    memory_[file] = {id, info};
    if (!to_disk || cache_file.empty()) return;
    json::object entry{{"identity", identity_json(id)}};
    if (info.ok()) {
      entry["descriptor"] = descriptor_of(info).to_json();
    } else {
      entry["error"] = info.error;
    }
    // Merged with what other processes wrote meanwhile; the last writer of an entry wins.
    json::object disk = read_disk(cache_file);
    for (auto it = disk.begin(); it != disk.end();) {
      it = exists(std::string(it->key())) ? std::next(it) : disk.erase(it);
    }
    disk[file.string()] = std::move(entry);
    write_disk(cache_file, disk);
    disk_[cache_file] = std::move(disk);
  }

 private:
  const json::object& disk_locked(const fs::path& cache_file) {
    auto it = disk_.find(cache_file);
    if (it == disk_.end()) it = disk_.emplace(cache_file, read_disk(cache_file)).first;
    return it->second;
  }

  // The entries of the cache file, or none when it is missing, damaged or from another sbx.
  static json::object read_disk(const fs::path& cache_file) {
    std::error_code ec;
    const auto size = fs::file_size(cache_file, ec);
    if (ec || size > kMaxCacheFile) return {};
    std::ifstream in(cache_file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    boost::system::error_code parse_error;
    const json::value root = json::parse(text.str(), parse_error);
    if (parse_error || !root.is_object()) return {};
    const json::object& o = root.get_object();
    const auto* format = o.if_contains("format");
    const auto* host = o.if_contains("host");
    const auto* entries = o.if_contains("entries");
    if (!format || *format != kCacheFormat || !host || *host != cache_host_key().c_str() ||
        !entries || !entries->is_object()) {
      return {};
    }
    return entries->get_object();
  }

  // Best effort: a cache that cannot be written only costs a probe next time.
  static void write_disk(const fs::path& cache_file, const json::object& entries) {
    std::error_code ec;
    fs::create_directories(cache_file.parent_path(), ec);
    const std::string temp = cache_file.string() + ".tmp-" + std::to_string(::getpid());
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out << json::serialize(
          json::object{{"format", kCacheFormat}, {"host", cache_host_key()}, {"entries", entries}});
      if (!out.flush()) {
        ::unlink(temp.c_str());
        return;
      }
    }
    if (::rename(temp.c_str(), cache_file.c_str()) != 0) ::unlink(temp.c_str());
  }

  std::mutex mutex_;
  std::map<fs::path, Cached> memory_;
  std::map<fs::path, json::object> disk_;
};

ProbeCache& cache() {
  static ProbeCache* const instance = new ProbeCache();
  return *instance;
}

bool executable(const fs::path& p) {
  std::error_code ec;
  return !p.empty() && fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

std::optional<FileIdentity> identity_of(const fs::path& path, std::string* error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (error) *error = std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    if (error) *error = "not a regular file";
    return std::nullopt;
  }
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<int64_t>(st.st_size),
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                      static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

fs::path probe_program(const fs::path& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("SBX_PLUGIN_PROBE"); env && *env) return env;
  const fs::path dir = boost::dll::program_location().parent_path();
  for (const fs::path& candidate :
       {dir / "sbx-plugin-probe", (dir / SBX_PROBE_FROM_BIN).lexically_normal(),
        fs::path(SBX_PROBE_BUILD_PATH)}) {
    if (executable(candidate)) return candidate;
  }
  return {};
}

fs::path probe_cache_file(const fs::path& configured) {
  if (!configured.empty()) return configured == "off" ? fs::path() : configured;
  if (const char* env = std::getenv("SBX_PLUGIN_CACHE"); env && *env) {
    return std::string_view(env) == "off" ? fs::path() : fs::path(env);
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return fs::path(xdg) / "sbx" / "plugin-scan.json";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return fs::path(home) / ".cache" / "sbx" / "plugin-scan.json";
  }
  return {};
}

PluginInfo probe_plugin(const fs::path& file, const FileIdentity& identity,
                        const ProbeSettings& settings) {
  if (auto hit = cache().find(file, identity, settings.cache_file)) return *hit;
  PluginInfo info;
  bool cacheable = false;
  if (settings.program.empty()) {
    // No probe program: read the descriptor in this process (logged once by the caller).
    try {
      info = info_of(file, PluginLibrary::describe(file));
      cacheable = true;
    } catch (const Error& e) {
      info.path = file;
      info.error = e.what();
    }
  } else {
    info = probe_out_of_process(file, settings, cacheable);
  }
  cache().store(file, identity, info, cacheable, settings.cache_file);
  return info;
}

}  // namespace sbx::detail
