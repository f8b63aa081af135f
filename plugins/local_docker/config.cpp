#include "config.hpp"

#include "docker_api.hpp"

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/paths.hpp>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace sbx::local_docker {

const char kConfigSchemaText[] = R"json({
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "local_docker provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "socket": {"type": "string", "minLength": 1,
               "description": "daemon socket; default $DOCKER_HOST or /var/run/docker.sock"},
    "api_version": {"type": "string", "pattern": "^1\\.[0-9]+$",
                    "description": "pinned Engine API version; default: negotiated"},
    "request_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 60},
    "image_pull_policy": {"enum": ["IfNotPresent", "Always", "Never"], "default": "IfNotPresent"},
    "create": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "keepalive_shell": {"type": "string", "minLength": 1, "default": "/bin/sh"},
        "keepalive_cmd": {"type": "string", "minLength": 1,
                          "default": "while :; do sleep 2147483647; done"},
        "start_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 600},
        "init": {"type": "boolean", "default": true},
        "network": {"type": "string", "minLength": 1, "default": "none"},
        "read_only": {"type": "boolean", "default": false},
        "cap_drop": {"type": "array", "items": {"type": "string"}, "default": []},
        "security_opt": {"type": "array", "items": {"type": "string"}, "default": []},
        "pids_limit": {"type": ["integer", "null"], "minimum": 1, "default": null},
        "apply_resource_limits": {"type": "boolean", "default": true},
        "publish_host": {"type": "string", "description": "IPv4 or IPv6 literal",
                         "default": "127.0.0.1"},
        "disk_limit": {"enum": ["error", "warn"], "default": "error"},
        "name_prefix": {"type": "string", "pattern": "^([a-zA-Z0-9][a-zA-Z0-9_.-]*)?$",
                        "default": "sbx-"},
        "concurrency": {"type": "integer", "minimum": 1, "default": 32},
        "allowed_host_paths": {"type": "array", "items": {"type": "string", "pattern": "^/"},
                               "default": [],
                               "description": "host path prefixes a request may bind-mount"},
        "allow_named_volumes": {"type": "boolean", "default": false},
        "allow_gpu": {"type": "boolean", "default": false}
      }
    },
    "exec": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "default_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 180},
        "shell": {"type": ["string", "null"], "minLength": 1, "default": null,
                  "description": "null: bash if the image has it, else sh"},
        "concurrency": {"type": "integer", "minimum": 1, "default": 32}
      }
    },
    "agent": {"type": "boolean", "default": true,
              "description": "run commands through sbx-agent inside the sandbox (about 1 ms each); false: Docker exec (about 50 ms)"},
    "agent_dir": {"type": "string", "minLength": 1, "default": "/run/sbx/local_docker",
                  "description": "host directory (made mode 0700) for the agent's binary and the sandboxes' agent sockets"},
    "reaper": {
      "type": "object",
      "additionalProperties": false,
      "description": "the TTL reaper container (removes expired sandboxes when their host died)",
      "properties": {
        "enabled": {"type": "boolean", "default": true},
        "interval_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600, "default": 2}
      }
    },
    "probe": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "command": {"type": ["string", "null"], "default": "printf sbx-sandbox-ready"},
        "expected_stdout": {"type": ["string", "null"], "default": "sbx-sandbox-ready"},
        "timeout_s": {"type": "number", "default": 30},
        "deadline_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": null},
        "stable_count": {"type": "integer", "minimum": 1, "default": 1},
        "stable_delay_s": {"type": "number", "minimum": 0, "default": 0}
      }
    }
  }
})json";

namespace {

using sdk::json::ObjectReader;

std::optional<PullPolicy> pull_policy_named(std::string_view text) {
  if (text == "IfNotPresent") return PullPolicy::if_not_present;
  if (text == "Always") return PullPolicy::always;
  if (text == "Never") return PullPolicy::never;
  return std::nullopt;
}

std::string bad_pull_policy(std::string_view text) {
  return "must be one of IfNotPresent, Always, Never, got '" + std::string(text) + "'";
}

std::optional<PullPolicy> read_pull_policy(ObjectReader& reader, std::string_view key) {
  const auto text = reader.string(key);
  if (!text) return std::nullopt;
  if (auto policy = pull_policy_named(*text)) return policy;
  reader.fail(key, bad_pull_policy(*text));
}

bool is_ip_literal(const std::string& text) {
  unsigned char buffer[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, text.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, text.c_str(), buffer) == 1;
}

// Docker container names are [a-zA-Z0-9][a-zA-Z0-9_.-]*; the prefix is followed by hex digits.
bool is_name_prefix(std::string_view prefix) {
  if (prefix.empty()) return true;
  if (!std::isalnum(static_cast<unsigned char>(prefix.front()))) return false;
  return std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

std::string non_empty_string(ObjectReader& reader, std::string_view key, std::string fallback) {
  std::string value = reader.string(key, std::move(fallback));
  if (value.empty()) reader.fail(key, "must not be empty");
  return value;
}

CreateConfig read_create(ObjectReader& reader) {
  CreateConfig c;
  c.keepalive_shell = non_empty_string(reader, "keepalive_shell", c.keepalive_shell);
  c.keepalive_cmd = non_empty_string(reader, "keepalive_cmd", c.keepalive_cmd);
  c.start_timeout_s = reader.number("start_timeout_s", 0, 1e9, true).value_or(c.start_timeout_s);
  c.init = reader.boolean("init", c.init);
  c.network = non_empty_string(reader, "network", c.network);
  c.read_only = reader.boolean("read_only", c.read_only);
  c.cap_drop = reader.string_list("cap_drop").value_or(c.cap_drop);
  c.security_opt = reader.string_list("security_opt").value_or(c.security_opt);
  c.pids_limit = reader.integer("pids_limit", 1);
  c.apply_resource_limits = reader.boolean("apply_resource_limits", c.apply_resource_limits);
  c.publish_host = reader.string("publish_host", c.publish_host);
  if (!is_ip_literal(c.publish_host)) {
    reader.fail("publish_host", "must be an IPv4 or IPv6 literal (e.g. 127.0.0.1 or ::1), got '" +
                                    c.publish_host + "'");
  }
  if (const auto mode = reader.string("disk_limit")) {
    if (*mode == "error") {
      c.disk_limit = DiskLimitMode::error;
    } else if (*mode == "warn") {
      c.disk_limit = DiskLimitMode::warn;
    } else {
      reader.fail("disk_limit", "must be 'error' or 'warn', got '" + *mode + "'");
    }
  }
  c.name_prefix = reader.string("name_prefix", c.name_prefix);
  c.concurrency = reader.integer("concurrency", 1, 1 << 20).value_or(c.concurrency);
  c.allowed_host_paths = reader.string_list("allowed_host_paths").value_or(c.allowed_host_paths);
  for (const auto& prefix : c.allowed_host_paths) {
    if (!prefix.starts_with('/')) {
      reader.fail("allowed_host_paths", "must hold absolute paths, got '" + prefix + "'");
    }
  }
  c.allow_named_volumes = reader.boolean("allow_named_volumes", c.allow_named_volumes);
  c.allow_gpu = reader.boolean("allow_gpu", c.allow_gpu);
  if (!is_name_prefix(c.name_prefix)) {
    reader.fail("name_prefix",
                "must match [a-zA-Z0-9][a-zA-Z0-9_.-]* (a Docker container name "
                "prefix), got '" +
                    c.name_prefix + "'");
  }
  reader.finish();
  return c;
}

ExecConfig read_exec(ObjectReader& reader) {
  ExecConfig e;
  e.default_timeout_s =
      reader.number("default_timeout_s", 0, 1e9, true).value_or(e.default_timeout_s);
  e.shell = reader.string("shell");
  if (e.shell && e.shell->empty()) {
    reader.fail("shell", "must not be empty (use null to detect the shell per sandbox)");
  }
  e.concurrency = reader.integer("concurrency", 1, 1 << 20).value_or(e.concurrency);
  reader.finish();
  return e;
}

ReaperConfig read_reaper(ObjectReader& reader) {
  ReaperConfig r;
  r.enabled = reader.boolean("enabled", r.enabled);
  r.interval_s = reader.number("interval_s", 0, 3600, true).value_or(r.interval_s);
  reader.finish();
  return r;
}

// The socket named by $DOCKER_HOST; only unix:// endpoints make sense for a local provider.
std::optional<std::string> socket_from_docker_host(const char* docker_host) {
  if (!docker_host || !*docker_host) return std::nullopt;
  const std::string_view value(docker_host);
  constexpr std::string_view kUnix = "unix://";
  if (!value.starts_with(kUnix) || value.size() == kUnix.size()) {
    throw sdk::Error::invalid_argument(
        "DOCKER_HOST='" + std::string(value) +
        "' is not a unix socket (unix:///path); local_docker only talks to a local daemon over "
        "its unix socket. Set $.socket in the provider config or unset DOCKER_HOST.");
  }
  return std::string(value.substr(kUnix.size()));
}

}  // namespace

std::string_view to_string(PullPolicy policy) noexcept {
  switch (policy) {
    case PullPolicy::always:
      return "Always";
    case PullPolicy::never:
      return "Never";
    case PullPolicy::if_not_present:
      break;
  }
  return "IfNotPresent";
}

sdk::ProbeConfig Config::default_probe() {
  sdk::ProbeConfig probe;
  probe.command = "printf sbx-sandbox-ready";
  probe.expected_stdout = "sbx-sandbox-ready";
  probe.timeout_s = 30;
  probe.deadline_s = std::nullopt;
  probe.stable_count = 1;
  probe.stable_delay_s = 0;
  return probe;
}

Config Config::parse(const boost::json::object& json, const char* docker_host) {
  Config config;
  ObjectReader reader(json);
  if (auto socket = reader.string("socket")) {
    if (socket->empty()) reader.fail("socket", "must not be empty");
    config.socket = std::move(*socket);
  } else if (auto from_env = socket_from_docker_host(docker_host)) {
    config.socket = std::move(*from_env);
  }
  if (auto version = reader.string("api_version")) {
    if (!ApiVersion::parse(*version)) {
      reader.fail("api_version", "must look like \"1.41\", got '" + *version + "'");
    }
    const ApiVersion pinned = *ApiVersion::parse(*version);
    if (pinned < kOldestApi || kNewestApi < pinned) {
      reader.fail("api_version", "must be between " + kOldestApi.text() + " and " +
                                     kNewestApi.text() + ", got " + *version);
    }
    config.api_version = std::move(*version);
  }
  config.request_timeout_s =
      reader.number("request_timeout_s", 0, 1e9, true).value_or(config.request_timeout_s);
  config.image_pull_policy =
      read_pull_policy(reader, "image_pull_policy").value_or(config.image_pull_policy);
  config.agent = reader.boolean("agent", config.agent);
  if (auto dir = reader.string("agent_dir")) {
    if (dir->empty() || dir->front() != '/') reader.fail("agent_dir", "must be an absolute path");
    config.agent_dir = std::move(*dir);
  }
  if (auto create = reader.object("create")) config.create = read_create(*create);
  if (auto exec = reader.object("exec")) config.exec = read_exec(*exec);
  if (auto reaper = reader.object("reaper")) config.reaper = read_reaper(*reaper);
  config.probe = default_probe();
  if (auto probe = reader.object("probe")) {
    config.probe_configured = probe->value("command") != nullptr;
    config.probe = sdk::ProbeConfig::read(*probe, config.probe);
    probe->finish();
  }
  reader.finish();
  return config;
}

// ---- provider_options ---------------------------------------------------------------------------

namespace {

bool is_absolute(std::string_view path) {
  return !path.empty() && path.front() == '/';
}

// Whether a mount's target is /.sbx or below it, as the kernel would reach it: local_docker keeps
// /.sbx for the agent, its socket and the expiry (host_dirs.hpp), which no request may cover.
bool under_sbx_dir(std::string_view target) {
  try {
    const std::string path = sdk::resolve_sandbox_path(target, std::nullopt);
    return path == "/.sbx" || path.starts_with("/.sbx/");
  } catch (const sdk::Error&) {
    return true;  // a ".." above "/": not a target to take
  }
}

// "src:dst[:ro|rw]" -> the same text, validated (Docker reports bad binds only at start).
std::string read_bind(std::string_view text, const std::string& path) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  auto bad = [&](std::string_view why) {
    throw sdk::Error::invalid_argument(path + ": '" + std::string(text) + "' " + std::string(why) +
                                       " (expected \"source:target[:ro|rw]\")");
  };
  if (parts.size() < 2 || parts.size() > 3) bad("has the wrong number of ':'-separated parts");
  if (parts[0].empty()) bad("has an empty source");
  if (!is_absolute(parts[1])) bad("needs an absolute target path");
  if (under_sbx_dir(parts[1])) bad("targets /.sbx, which local_docker keeps for itself");
  if (parts.size() == 3 && parts[2] != "ro" && parts[2] != "rw") bad("has a mode other than ro/rw");
  return std::string(text);
}

Mount read_mount(const boost::json::object& object, const std::string& path) {
  ObjectReader reader(object, path);
  Mount mount;
  const auto source = reader.string("source");
  const auto target = reader.string("target");
  if (!source || source->empty()) reader.fail("source", "is required (a host path or volume name)");
  if (!target || !is_absolute(*target)) reader.fail("target", "is required and must be absolute");
  if (under_sbx_dir(*target))
    reader.fail("target", "is /.sbx or below it, which local_docker keeps");
  mount.source = *source;
  mount.target = *target;
  mount.read_only = reader.boolean("read_only", false);
  reader.finish();
  return mount;
}

// OpenSandbox's Volume (sandbox-lifecycle.yml), as `sbx serve` passes a create's `volumes`:
// {name, host: {path} | pvc: {claimName, ...} | ossfs: {...}, mountPath, readOnly?, subPath?}.
// A host path (plus subPath) is a bind mount, a pvc a Docker named volume (Docker makes a missing
// one, as the real server's Docker runtime does with createIfNotExists); ossfs has no Docker
// equivalent here. The create's policy then judges the mount as any other.
Mount read_opensandbox_volume(const boost::json::object& object, const std::string& path) {
  ObjectReader reader(object, path);
  const auto name = reader.string("name");
  const auto mount_path = reader.string("mountPath");
  const bool read_only = reader.boolean("readOnly", false);
  const auto sub_path = reader.string("subPath");
  auto host = reader.object("host");
  auto pvc = reader.object("pvc");
  const bool ossfs = reader.value("ossfs") != nullptr;
  const auto dns_label = [](const std::string& s) {
    if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
  };
  if (!name || !dns_label(*name)) {
    reader.fail("name", "is required: a DNS label (lowercase letters, digits, '-'; at most 63)");
  }
  if (!mount_path || !is_absolute(*mount_path)) {
    reader.fail("mountPath", "is required and must be absolute");
  }
  if (under_sbx_dir(*mount_path)) {
    reader.fail("mountPath", "is /.sbx or below it, which local_docker keeps");
  }
  if (int(host.has_value()) + int(pvc.has_value()) + int(ossfs) != 1) {
    reader.fail("host", "exactly one backend must be given: host, pvc or ossfs");
  }
  if (ossfs) reader.fail("ossfs", "is not supported by local_docker (use host or pvc)");
  if (sub_path) {
    bool dotdot = sub_path->empty() || sub_path->front() == '/';
    for (size_t start = 0; !dotdot && start <= sub_path->size();) {
      const size_t slash = std::min(sub_path->find('/', start), sub_path->size());
      dotdot = sub_path->substr(start, slash - start) == "..";
      start = slash + 1;
    }
    if (dotdot) reader.fail("subPath", "must be a relative path without '..'");
  }
  Mount mount;
  mount.target = *mount_path;
  mount.read_only = read_only;
  if (host) {
    const auto host_path = host->string("path");
    if (!host_path || !is_absolute(*host_path)) {
      host->fail("path", "is required and must be absolute");
    }
    host->finish();
    mount.source = *host_path;
    if (sub_path) mount.source += (mount.source.ends_with('/') ? "" : "/") + *sub_path;
  } else {
    const auto claim = pvc->string("claimName");
    if (!claim || claim->empty() || claim->front() == '/') {
      pvc->fail("claimName", "is required: the name of a Docker volume");
    }
    if (!pvc->boolean("createIfNotExists", true)) {
      pvc->fail("createIfNotExists",
                "false is not supported by local_docker (Docker makes a "
                "missing named volume)");
    }
    if (pvc->boolean("deleteOnSandboxTermination", false)) {
      pvc->fail("deleteOnSandboxTermination", "true is not supported by local_docker");
    }
    // Kubernetes provisioning hints: the spec says Docker volumes ignore them.
    (void)pvc->value("storageClass");
    (void)pvc->value("storage");
    (void)pvc->value("accessModes");
    pvc->finish();
    if (sub_path) reader.fail("subPath", "on a pvc volume is not supported by local_docker");
    mount.source = *claim;
  }
  reader.finish();
  return mount;
}

void read_volumes(const boost::json::value& value, const std::string& path, SandboxOptions& out) {
  if (!value.is_array()) {
    throw sdk::Error::invalid_argument(path +
                                       ": expected an array of \"src:dst[:ro|rw]\" strings, "
                                       "{source, target, read_only} objects or OpenSandbox "
                                       "Volume objects, got " +
                                       std::string(sdk::json::kind_name(value)));
  }
  const auto& items = value.get_array();
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item_path = sdk::json::path_index(path, i);
    if (items[i].is_string()) {
      out.binds.push_back(read_bind(items[i].get_string(), item_path));
    } else if (items[i].is_object() && (items[i].get_object().contains("mountPath") ||
                                        items[i].get_object().contains("name"))) {
      out.mounts.push_back(read_opensandbox_volume(items[i].get_object(), item_path));
    } else if (items[i].is_object()) {
      out.mounts.push_back(read_mount(items[i].get_object(), item_path));
    } else {
      throw sdk::Error::invalid_argument(item_path + ": expected a string or an object, got " +
                                         std::string(sdk::json::kind_name(items[i])));
    }
  }
}

// {"username","password"[,"serveraddress"]} or {"identitytoken"[,"serveraddress"]}.
std::string read_registry_auth(ObjectReader& reader) {
  boost::json::object auth;
  const auto username = reader.string("username");
  const auto password = reader.string("password");
  const auto token = reader.string("identitytoken");
  const auto server = reader.string("serveraddress");
  reader.finish();
  if (token) {
    if (username || password) {
      reader.fail("identitytoken", "cannot be combined with username/password");
    }
    auth["identitytoken"] = *token;
  } else if (username && password) {
    auth["username"] = *username;
    auth["password"] = *password;
  } else {
    throw sdk::Error::invalid_argument(reader.path() +
                                       ": needs either username and password, or identitytoken");
  }
  if (server) auth["serveraddress"] = *server;
  return base64url(boost::json::serialize(auth));
}

}  // namespace

SandboxOptions SandboxOptions::parse(const boost::json::object& options) {
  SandboxOptions out;
  ObjectReader reader(options, "provider_options");
  if (const auto* volumes = reader.value("volumes"); volumes && !volumes->is_null()) {
    read_volumes(*volumes, reader.path_of("volumes"), out);
  }
  if (auto auth = reader.object("registry_auth")) out.registry_auth = read_registry_auth(*auth);
  out.image_pull_policy = read_pull_policy(reader, "image_pull_policy");
  if (auto extensions = reader.string_map("extensions")) {
    // OpenSandbox's opaque create extensions (sbx serve passes them on): the pull policy under
    // either of its two keys is honoured (image_pull_policy wins), poolRef is refused (one machine
    // has no pools), any other key is a hint for another runtime and is ignored, as the real
    // server's Docker runtime ignores it.
    const std::string path = reader.path_of("extensions");
    if (extensions->count("poolRef")) {
      throw sdk::Error::invalid_argument(path +
                                         ".poolRef: is not supported: local_docker has no pools");
    }
    for (const char* key : {"imagePullPolicy", "opensandbox.extensions.image-pull-policy"}) {
      const auto it = extensions->find(key);
      if (it == extensions->end() || out.image_pull_policy) continue;
      out.image_pull_policy = pull_policy_named(it->second);
      if (!out.image_pull_policy) {
        throw sdk::Error::invalid_argument(path + "." + key + ": " + bad_pull_policy(it->second));
      }
    }
  }
  reader.finish();
  return out;
}

std::string base64url(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < 3; ++k) {
      chunk = (chunk << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) {
      out += k <= n ? kAlphabet[(chunk >> (18 - 6 * k)) & 0x3F] : '=';
    }
  }
  return out;
}

}  // namespace sbx::local_docker
