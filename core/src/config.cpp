// Reading the host configuration (see config.hpp for the format).

#include "internal.hpp"

#include <sbx/base/json.hpp>
#include <sbx/core/config.hpp>
#include <sbx/core/errors.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace sbx {
namespace {

constexpr std::string_view kEnvPrefix = "${env:";
// A config file is a few KiB; this bound only stops a wrong file from being read whole.
constexpr size_t kMaxConfigBytes = 16 * 1024 * 1024;

// Replaces "${env:NAME}" strings inside `value` (recursively) by the variable's value.
void substitute_env(boost::json::value& value, const std::string& path) {
  if (value.is_string()) {
    const std::string_view text = value.get_string();
    if (text.starts_with(kEnvPrefix) && text.ends_with("}")) {
      const std::string name(text.substr(kEnvPrefix.size(), text.size() - kEnvPrefix.size() - 1));
      const char* env = std::getenv(name.c_str());
      if (!env) throw ConfigError(path + ": environment variable " + name + " is not set");
      value = env;
    }
  } else if (value.is_object()) {
    for (auto& member : value.get_object()) {
      substitute_env(member.value(), base::json::path_join(path, member.key()));
    }
  } else if (value.is_array()) {
    auto& array = value.get_array();
    for (size_t i = 0; i < array.size(); ++i) {
      substitute_env(array[i], base::json::path_index(path, i));
    }
  }
}

ProviderBlock read_block(base::json::ObjectReader& r, const std::string& name,
                         std::string_view source, const std::filesystem::path& base_dir) {
  ProviderBlock block;
  block.name = name;
  auto plugin = r.string("plugin");
  if (!plugin || plugin->empty()) r.fail("plugin", "required: a provider id or a plugin file");
  block.plugin = *plugin;
  // A plugin file is relative to the config file.
  const auto [file, id] = detail::split_plugin_ref(block.plugin);
  if (!file.empty() && file.is_relative() && !base_dir.empty()) {
    block.plugin = (base_dir / block.plugin).string();
  }
  block.config_path = std::string(source) + ": " + r.path_of("config");
  if (const auto* config = r.value("config")) {
    if (!config->is_object()) r.fail("config", "must be an object");
    boost::json::value copy = *config;
    substitute_env(copy, r.path_of("config"));
    block.config = std::move(copy.get_object());
  }
  block.default_metadata = r.string_map("default_metadata").value_or(StringMap{});
  block.allow_kind_change = r.boolean("allow_kind_change", false);
  if (auto canary = r.object("canary")) {
    Canary c;
    if (const auto* spec = canary->value("spec"); spec && !spec->is_null()) {
      if (!spec->is_object()) canary->fail("spec", "must be an object (a sandbox spec)");
      try {
        c.spec = SandboxSpec::from_json(*spec);
      } catch (const Error& e) {
        throw ConfigError(std::string(source) + ": " + canary->path_of("spec") + ": " + e.what());
      }
    }
    c.command = canary->string("command", c.command);
    if (c.command.empty()) canary->fail("command", "must not be empty");
    c.timeout_s = canary->number("timeout_s", 0, 86400, true).value_or(c.timeout_s);
    canary->finish();
    block.canary = std::move(c);
  }
  r.finish();
  return block;
}

}  // namespace

std::optional<std::filesystem::path> ProviderBlock::plugin_file() const {
  auto [file, id] = detail::split_plugin_ref(plugin);
  if (file.empty()) return std::nullopt;
  return file;
}

namespace detail {

std::pair<std::filesystem::path, std::string> split_plugin_ref(const std::string& ref) {
  const size_t hash = ref.rfind('#');
  const std::string file = hash == std::string::npos ? ref : ref.substr(0, hash);
  const bool is_path = file.find('/') != std::string::npos || file.ends_with(".so");
  if (!is_path) return {{}, ref};
  return {std::filesystem::path(file), hash == std::string::npos ? "" : ref.substr(hash + 1)};
}

}  // namespace detail

Config Config::parse(std::string_view json_text, std::string_view source,
                     const std::filesystem::path& base_dir) {
  const std::string prefix = std::string(source) + ": ";
  try {
    Config config;
    const boost::json::object root = base::json::parse_object(json_text, "JSON");
    base::json::ObjectReader r(root);
    for (const auto& dir : r.string_list("plugin_path").value_or(std::vector<std::string>{})) {
      std::filesystem::path p(dir);
      config.plugin_path.push_back(p.is_relative() && !base_dir.empty() ? base_dir / p : p);
    }
    config.labels = r.string_map("labels").value_or(StringMap{});
    config.default_provider = r.string("default_provider");
    if (auto d = r.object("deadlines")) {
      Deadlines deadlines;
      const std::pair<const char*, double*> keys[] = {
          {"grace_s", &deadlines.grace_s},
          {"cancel_grace_s", &deadlines.cancel_grace_s},
          {"create_s", &deadlines.create_s},
          {"exec_s", &deadlines.exec_s},
          {"transfer_idle_s", &deadlines.transfer_idle_s},
          {"call_s", &deadlines.call_s}};
      for (const auto& [key, value] : keys) {
        if (auto v = d->number(key, 0, 1e9, true)) *value = *v;
      }
      d->finish();
      config.deadlines = deadlines;
    }
    config.source = std::string(source);
    if (const auto* serve = r.value("serve"); serve && !serve->is_null()) {
      if (!serve->is_object()) {
        throw ConfigError("$.serve: expected an object (sbx serve's settings), got " +
                          std::string(base::json::kind_name(*serve)));
      }
      config.serve = serve->get_object();
    }
    if (auto providers = r.object("providers")) {
      for (const auto& member : root.at("providers").get_object()) {
        const std::string name(member.key());
        if (name.empty()) providers->fail(name, "a provider name must not be empty");
        if (!member.value().is_object()) providers->fail(name, "must be an object");
        base::json::ObjectReader block(member.value().get_object(), providers->path_of(name));
        providers->value(name);  // known
        config.providers.emplace(name, read_block(block, name, source, base_dir));
      }
      providers->finish();
    }
    r.finish();
    if (config.default_provider && !config.providers.count(*config.default_provider)) {
      throw ConfigError("$.default_provider: '" + *config.default_provider +
                        "' is not a configured provider");
    }
    return config;
  } catch (const base::json::Error& e) {
    throw ConfigError(prefix + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + e.what());
  }
}

Config Config::load(const std::filesystem::path& file) {
  const std::string name = file.string();
  // O_NONBLOCK: a FIFO put where the config was must not block the open (or a reload) waiting
  // for a writer; it is refused below like any file that is not a regular file.
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw ConfigError(name + ": cannot read the file: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw ConfigError(name + ": cannot read the file: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw ConfigError(name + ": is a directory, not a config file");
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a special file";
    throw ConfigError(name + ": is " + what + ", not a config file (a config is a regular file)");
  }
  // Read with a bound: a file that is not a config given by mistake must not eat the memory.
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(name + ": cannot read the file: " + std::strerror(errno));
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > kMaxConfigBytes) {
      throw ConfigError(name + ": larger than " + std::to_string(kMaxConfigBytes / (1024 * 1024)) +
                        " MiB; is it a config file?");
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw ConfigError(name +
                      ": the file is empty; a config is a JSON object, e.g. {\"providers\": {}}");
  }
  return parse(text, name, file.parent_path());
}

}  // namespace sbx
