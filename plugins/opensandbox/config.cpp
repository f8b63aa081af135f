#include "config.hpp"

#include <sbx/sdk/error.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <string>

namespace sbx::opensandbox {

const char kConfigSchemaText[] = R"json({
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "opensandbox provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "connection": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "domain": {"type": "string", "minLength": 1,
                   "description": "server host[:port][/prefix] or URL; default $OPEN_SANDBOX_DOMAIN or localhost:8080"},
        "api_key": {"type": ["string", "null"], "description": "default $OPEN_SANDBOX_API_KEY; a secret"},
        "protocol": {"enum": ["http", "https"], "default": "http"},
        "request_timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 30},
        "use_server_proxy": {"type": "boolean", "default": false},
        "keepalive_expiry_s": {"type": ["number", "null"], "minimum": 0, "default": 3},
        "max_connections": {"type": "integer", "minimum": 1, "default": 100},
        "max_keepalive_connections": {"type": "integer", "minimum": 0, "default": 20},
        "transport_backend": {"enum": ["httpx", "aiohttp"], "default": "httpx",
                              "description": "accepted for the seed's configs; the transport is always libcurl"},
        "disable_connection_pooling": {"type": "boolean", "default": false},
        "connect_retries": {"type": "integer", "minimum": 0, "default": 2},
        "connect_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 10},
        "verify_tls": {"type": "boolean", "default": true},
        "ca_bundle": {"type": ["string", "null"], "default": null}
      }
    },
    "create": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "request_timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": null},
        "timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": null},
        "retries": {"type": "integer", "minimum": 0, "default": 2},
        "retry_delay_s": {"type": "number", "minimum": 0, "default": 5},
        "retry_max_delay_s": {"type": "number", "minimum": 0, "default": 60},
        "image_pull_policy": {"enum": ["Always", "IfNotPresent", "Never", null], "default": "IfNotPresent"},
        "skip_health_check": {"type": "boolean", "default": false},
        "connect_attempt_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
        "connect_poll_s": {"type": "number", "exclusiveMinimum": 0, "default": 2},
        "default_entrypoint": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                               "default": ["tail", "-f", "/dev/null"]}
      }
    },
    "probe": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "command": {"type": ["string", "null"], "default": "printf nemo-gym-sandbox-ready"},
        "expected_stdout": {"type": ["string", "null"], "default": "nemo-gym-sandbox-ready"},
        "timeout_s": {"type": "number", "default": 30},
        "deadline_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": null},
        "stable_count": {"type": "integer", "minimum": 1, "default": 1},
        "stable_delay_s": {"type": "number", "minimum": 0, "default": 0}
      }
    },
    "operations": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "retries": {"type": "integer", "minimum": 0, "default": 3},
        "retry_delay_s": {"type": "number", "minimum": 0, "default": 1},
        "retry_max_delay_s": {"type": "number", "minimum": 0, "default": 15},
        "command_retries": {"type": "integer", "minimum": 0, "default": 0},
        "close_timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 30},
        "stream_idle_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 60},
        "background_exec": {"type": "boolean", "default": false},
        "background_poll_initial_s": {"type": "number", "exclusiveMinimum": 0, "default": 0.25},
        "background_poll_interval_s": {"type": "number", "exclusiveMinimum": 0, "default": 2},
        "status_poll_timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 10}
      }
    },
    "attribution": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "enabled": {"type": "boolean", "default": true},
        "key_prefix": {"type": "string", "default": "nemo-gym.nvidia.com/"},
        "team": {"type": ["string", "null"]},
        "user": {"type": ["string", "null"]},
        "workload": {"type": ["string", "null"]},
        "run": {"type": ["string", "null"]}
      }
    }
  }
})json";

namespace {

using sdk::json::ObjectReader;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

// The seed's "must be >= 0" / "must be > 0" checks, with its wording.
double non_negative(ObjectReader& reader, std::string_view key, double fallback) {
  const auto value = reader.number(key);
  if (!value) return fallback;
  if (*value < 0) reader.fail(key, std::string(key) + " must be >= 0");
  return *value;
}

std::optional<double> positive(ObjectReader& reader, std::string_view key,
                               std::optional<double> fallback) {
  const auto* raw = reader.value(key);
  if (!raw) return fallback;
  if (raw->is_null()) return std::nullopt;
  const auto value = reader.number(key);
  if (value && *value <= 0) reader.fail(key, std::string(key) + " must be > 0");
  return value;
}

int64_t non_negative_int(ObjectReader& reader, std::string_view key, int64_t fallback) {
  const auto* raw = reader.value(key);
  if (!raw || raw->is_null()) return fallback;
  if (!raw->is_int64() && !raw->is_uint64()) {
    reader.fail(key, "expected an integer, got " + std::string(sdk::json::kind_name(*raw)));
  }
  const auto value = reader.integer(key);
  if (value && *value < 0) reader.fail(key, std::string(key) + " must be >= 0");
  return value.value_or(fallback);
}

ConnectionConfig read_connection(ObjectReader& reader, const char* env_domain,
                                 const char* env_api_key) {
  ConnectionConfig c;
  if (auto domain = reader.string("domain")) {
    c.domain = std::move(*domain);
  } else if (env_domain && *env_domain) {
    c.domain = env_domain;
  }
  while (!c.domain.empty() && c.domain.back() == '/')
    c.domain.pop_back();
  if (c.domain.empty()) reader.fail("domain", "must not be empty");
  if (const auto* key = reader.value("api_key"); key && !key->is_null()) {
    c.api_key = reader.string("api_key");
  } else if (!key && env_api_key && *env_api_key) {
    c.api_key = env_api_key;
  }
  if (c.api_key && c.api_key->empty()) c.api_key.reset();
  if (auto protocol = reader.string("protocol")) {
    if (*protocol != "http" && *protocol != "https") {
      reader.fail("protocol", "must be 'http' or 'https', got '" + *protocol + "'");
    }
    c.protocol = std::move(*protocol);
  }
  c.request_timeout_s = positive(reader, "request_timeout_s", c.request_timeout_s);
  c.use_server_proxy = reader.boolean("use_server_proxy", c.use_server_proxy);
  if (const auto* raw = reader.value("keepalive_expiry_s"); raw) {
    if (raw->is_null()) {
      c.keepalive_expiry_s.reset();
    } else {
      c.keepalive_expiry_s = non_negative(reader, "keepalive_expiry_s", 3.0);
    }
  }
  c.max_connections = reader.integer("max_connections", 1, 1 << 20).value_or(c.max_connections);
  c.max_keepalive_connections =
      reader.integer("max_keepalive_connections", 0, 1 << 20).value_or(c.max_keepalive_connections);
  c.transport_backend = reader.string("transport_backend");
  if (c.transport_backend && *c.transport_backend != "httpx" && *c.transport_backend != "aiohttp") {
    reader.fail("transport_backend",
                "must be 'httpx' or 'aiohttp' (either way the transport is "
                "libcurl), got '" +
                    *c.transport_backend + "'");
  }
  c.disable_connection_pooling =
      reader.boolean("disable_connection_pooling", c.disable_connection_pooling);
  c.connect_retries = non_negative_int(reader, "connect_retries", c.connect_retries);
  c.connect_timeout_s =
      reader.number("connect_timeout_s", 0, 1e6, true).value_or(c.connect_timeout_s);
  c.verify_tls = reader.boolean("verify_tls", c.verify_tls);
  c.ca_bundle = reader.string("ca_bundle");
  reader.finish();
  return c;
}

CreateConfig read_create(ObjectReader& reader) {
  CreateConfig c;
  c.request_timeout_s = positive(reader, "request_timeout_s", c.request_timeout_s);
  c.timeout_s = positive(reader, "timeout_s", c.timeout_s);
  c.retries = non_negative_int(reader, "retries", c.retries);
  c.retry_delay_s = non_negative(reader, "retry_delay_s", c.retry_delay_s);
  c.retry_max_delay_s = non_negative(reader, "retry_max_delay_s", c.retry_max_delay_s);
  if (const auto* raw = reader.value("image_pull_policy"); raw) {
    if (raw->is_null()) {
      c.image_pull_policy.reset();
    } else {
      const auto text = reader.string("image_pull_policy");
      c.image_pull_policy = parse_pull_policy(*text);
      if (!c.image_pull_policy) {
        reader.fail("image_pull_policy",
                    "image_pull_policy must be one of: Always, IfNotPresent, Never");
      }
    }
  }
  c.skip_health_check = reader.boolean("skip_health_check", c.skip_health_check);
  c.connect_attempt_timeout_s =
      positive(reader, "connect_attempt_timeout_s", c.connect_attempt_timeout_s)
          .value_or(c.connect_attempt_timeout_s);
  c.connect_poll_s =
      positive(reader, "connect_poll_s", c.connect_poll_s).value_or(c.connect_poll_s);
  if (auto entrypoint = reader.string_list("default_entrypoint")) {
    if (entrypoint->empty()) reader.fail("default_entrypoint", "must not be empty");
    c.default_entrypoint = std::move(*entrypoint);
  }
  reader.finish();
  return c;
}

OperationConfig read_operations(ObjectReader& reader) {
  OperationConfig o;
  o.retries = non_negative_int(reader, "retries", o.retries);
  o.retry_delay_s = non_negative(reader, "retry_delay_s", o.retry_delay_s);
  o.retry_max_delay_s = non_negative(reader, "retry_max_delay_s", o.retry_max_delay_s);
  o.command_retries = non_negative_int(reader, "command_retries", o.command_retries);
  o.close_timeout_s = positive(reader, "close_timeout_s", o.close_timeout_s);
  o.stream_idle_timeout_s = positive(reader, "stream_idle_timeout_s", o.stream_idle_timeout_s)
                                .value_or(o.stream_idle_timeout_s);
  o.background_exec = reader.boolean("background_exec", o.background_exec);
  o.background_poll_initial_s =
      positive(reader, "background_poll_initial_s", o.background_poll_initial_s)
          .value_or(o.background_poll_initial_s);
  o.background_poll_interval_s =
      positive(reader, "background_poll_interval_s", o.background_poll_interval_s)
          .value_or(o.background_poll_interval_s);
  o.status_poll_timeout_s = positive(reader, "status_poll_timeout_s", o.status_poll_timeout_s);
  reader.finish();
  return o;
}

AttributionConfig read_attribution(ObjectReader& reader) {
  AttributionConfig a;
  a.enabled = reader.boolean("enabled", a.enabled);
  if (auto prefix = reader.string("key_prefix")) {
    a.key_prefix = normalize_key_prefix(*prefix, reader.path_of("key_prefix"));
  }
  a.team = reader.string("team");
  a.user = reader.string("user");
  a.workload = reader.string("workload");
  a.run = reader.string("run");
  reader.finish();
  return a;
}

bool is_dns_label(std::string_view label) {
  if (label.empty() || label.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(label.front()) || !alnum(label.back())) return false;
  return std::all_of(label.begin(), label.end(), [&](char c) { return alnum(c) || c == '-'; });
}

bool is_dns_subdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    if (!is_dns_label(name.substr(start, dot - start))) return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n\f\v");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n\f\v");
  return std::string(text.substr(first, last - first + 1));
}

}  // namespace

std::string ConnectionConfig::base_url() const {
  if (domain.find("://") != std::string::npos) return domain;
  return protocol + "://" + domain;
}

std::string ConnectionConfig::scheme() const {
  const auto at = domain.find("://");
  return at == std::string::npos ? protocol : domain.substr(0, at);
}

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

std::optional<PullPolicy> parse_pull_policy(std::string_view text) noexcept {
  if (text == "Always") return PullPolicy::always;
  if (text == "IfNotPresent") return PullPolicy::if_not_present;
  if (text == "Never") return PullPolicy::never;
  return std::nullopt;
}

sdk::RetryPolicy CreateConfig::retry_policy() const {
  return {static_cast<int>(retries), to_ms(retry_delay_s), to_ms(retry_max_delay_s)};
}

sdk::RetryPolicy OperationConfig::retry_policy() const {
  return {static_cast<int>(retries), to_ms(retry_delay_s), to_ms(retry_max_delay_s)};
}

sdk::ProbeConfig Config::default_probe() {
  sdk::ProbeConfig probe;
  probe.command = "printf nemo-gym-sandbox-ready";
  probe.expected_stdout = "nemo-gym-sandbox-ready";
  probe.timeout_s = 30;
  probe.deadline_s = std::nullopt;
  probe.stable_count = 1;
  probe.stable_delay_s = 0;
  return probe;
}

Config Config::parse(const boost::json::object& json, const char* env_domain,
                     const char* env_api_key) {
  Config config;
  ObjectReader reader(json);
  if (auto connection = reader.object("connection")) {
    config.connection = read_connection(*connection, env_domain, env_api_key);
  } else {
    const boost::json::object empty;
    ObjectReader defaults(empty, reader.path_of("connection"));
    config.connection = read_connection(defaults, env_domain, env_api_key);
  }
  if (auto create = reader.object("create")) config.create = read_create(*create);
  config.probe = default_probe();
  if (auto probe = reader.object("probe")) {
    config.probe = sdk::ProbeConfig::read(*probe, config.probe);
    probe->finish();
  }
  if (auto operations = reader.object("operations")) {
    config.operations = read_operations(*operations);
  }
  if (auto attribution = reader.object("attribution")) {
    config.attribution = read_attribution(*attribution);
  }
  reader.finish();
  return config;
}

std::string normalize_key_prefix(std::string_view prefix, std::string_view path) {
  std::string p = trim(prefix);
  if (p.empty()) return p;
  if (p.back() != '/') p += '/';
  const std::string_view domain(p.data(), p.size() - 1);
  if (!is_dns_subdomain(domain)) {
    throw sdk::Error::invalid_argument(
        std::string(path) + ": attribution key_prefix '" + std::string(prefix) +
        "' must be a lowercase DNS subdomain (dot-separated labels of [a-z0-9-], each starting "
        "and ending with a letter or digit, 253 characters at most) followed by '/'");
  }
  return p;
}

std::string sanitize_metadata_value(std::string_view value) {
  auto allowed = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  };
  std::string out;
  bool in_run = false;
  for (const char c : value) {
    if (allowed(c) && static_cast<unsigned char>(c) < 0x80) {
      out += c;
      in_run = false;
    } else if (!in_run) {
      out += '_';
      in_run = true;
    }
  }
  auto strip = [](std::string& s) {
    const auto first = s.find_first_not_of("._-");
    if (first == std::string::npos) {
      s.clear();
      return;
    }
    s = s.substr(first, s.find_last_not_of("._-") - first + 1);
  };
  strip(out);
  if (out.size() > 63) out.resize(63);
  strip(out);
  return out.empty() ? "metadata" : out;
}

std::string resource_quantity(double value) {
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 1e18) {
    return std::to_string(static_cast<int64_t>(value));
  }
  // Python's repr(float): the shortest round-trip digits; exponent form when the decimal exponent
  // is below -4 or at least 16, with a sign and at least two exponent digits.
  char digits[64];
  const auto sci =
      std::to_chars(digits, digits + sizeof digits, value, std::chars_format::scientific);
  const std::string text(digits, sci.ptr);
  const auto e = text.find('e');
  const int exponent = std::stoi(text.substr(e + 1));
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = text.substr(0, e);
    std::string exp = text.substr(e + 2);
    while (exp.size() > 2 && exp.front() == '0')
      exp.erase(0, 1);
    return mantissa + "e" + text[e + 1] + exp;
  }
  const auto fixed = std::to_chars(digits, digits + sizeof digits, value, std::chars_format::fixed);
  return std::string(digits, fixed.ptr);
}

boost::json::object resource_map(const sdk::Resources& r) {
  boost::json::object out;
  if (r.cpu) out["cpu"] = resource_quantity(*r.cpu);
  if (r.memory_mib) out["memory"] = std::to_string(*r.memory_mib) + "Mi";
  if (r.disk_gib) out["ephemeral-storage"] = std::to_string(*r.disk_gib) + "Gi";
  if (r.gpu) out["gpu"] = std::to_string(*r.gpu);
  if (r.gpu_type) out["gpu_type"] = *r.gpu_type;
  return out;
}

// ---- provider_options ---------------------------------------------------------------------------

namespace {

const std::set<std::string> kOptionKeys = {
    "extensions",        "image_auth",        "network_policy", "platform",
    "resource_requests", "skip_health_check", "snapshot_id",    "volumes"};

std::string join(const std::set<std::string>& keys) {
  std::string out;
  for (const auto& key : keys)
    out += (out.empty() ? "" : ", ") + key;
  return out;
}

// A number, or a string holding one (the seed coerces with float() and int()); `integral` refuses
// fractions.
std::optional<double> resource_number(const boost::json::value& value, bool integral) {
  double out = 0;
  if (value.is_number()) {
    out = value.to_number<double>();
  } else if (value.is_string()) {
    const std::string_view text = value.get_string();
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!std::isfinite(out) || out < 0 || (integral && std::trunc(out) != out)) return std::nullopt;
  return out;
}

// provider_options.resource_requests: SandboxResources' keys, validated as the seed's
// SandboxResources.from_mapping (its unknown-keys message), formatted as resourceLimits are.
sdk::Resources read_resource_requests(const boost::json::object& m) {
  static const std::set<std::string> kKeys = {"cpu", "disk_gib", "gpu", "gpu_type", "memory_mib"};
  std::set<std::string> unknown;
  for (const auto& item : m) {
    if (!kKeys.contains(std::string(item.key()))) unknown.insert(std::string(item.key()));
  }
  if (!unknown.empty()) {
    throw sdk::Error::invalid_argument("Unknown sandbox resource keys: " + join(unknown) +
                                       ". Expected keys: " + join(kKeys));
  }
  sdk::Resources r;
  for (const auto& item : m) {
    const std::string key(item.key());
    const auto& value = item.value();
    if (value.is_null()) continue;
    if (key == "gpu_type") {
      if (!value.is_string()) {
        throw sdk::Error::invalid_argument(
            "provider_options.resource_requests.gpu_type must be a "
            "string");
      }
      r.gpu_type = std::string(value.get_string());
      continue;
    }
    const auto number = resource_number(value, key != "cpu");
    if (!number) {
      throw sdk::Error::invalid_argument("Invalid sandbox resource " + key + ": " +
                                         boost::json::serialize(value) +
                                         " (provider_options.resource_requests)");
    }
    if (key == "cpu") r.cpu = *number;
    if (key == "memory_mib") r.memory_mib = static_cast<int64_t>(*number);
    if (key == "disk_gib") r.disk_gib = static_cast<int64_t>(*number);
    if (key == "gpu") r.gpu = static_cast<int64_t>(*number);
  }
  return r;
}

const boost::json::object& mapping(const boost::json::value& value, std::string_view key) {
  if (!value.is_object()) {
    throw sdk::Error::invalid_argument("provider_options." + std::string(key) +
                                       " must be a mapping, got " +
                                       std::string(sdk::json::kind_name(value)));
  }
  return value.get_object();
}

std::string string_field(const boost::json::object& object, std::string_view key,
                         const std::string& path, bool required) {
  const auto* value = object.if_contains(key);
  if (!value || value->is_null()) {
    if (required)
      throw sdk::Error::invalid_argument(path + "." + std::string(key) + " is required");
    return {};
  }
  if (!value->is_string()) {
    throw sdk::Error::invalid_argument(path + "." + std::string(key) + " must be a string, got " +
                                       std::string(sdk::json::kind_name(*value)));
  }
  return std::string(value->get_string());
}

boost::json::object read_platform(const boost::json::object& in) {
  const std::string path = "provider_options.platform";
  for (const auto& item : in) {
    if (item.key() != "os" && item.key() != "arch") {
      throw sdk::Error::invalid_argument(path + ": unknown key '" + std::string(item.key()) +
                                         "' (supported: arch, os)");
    }
  }
  const std::string os = string_field(in, "os", path, true);
  const std::string arch = string_field(in, "arch", path, true);
  if (os != "linux" && os != "windows") {
    throw sdk::Error::invalid_argument(path + ".os must be 'linux' or 'windows', got '" + os + "'");
  }
  if (arch != "amd64" && arch != "arm64") {
    throw sdk::Error::invalid_argument(path + ".arch must be 'amd64' or 'arm64', got '" + arch +
                                       "'");
  }
  return boost::json::object{{"os", os}, {"arch", arch}};
}

// One Volume of the lifecycle spec, in its wire form (camelCase).
boost::json::object read_volume(const boost::json::value& value, size_t index) {
  const std::string path = "provider_options.volumes[" + std::to_string(index) + "]";
  if (!value.is_object()) {
    throw sdk::Error::invalid_argument(path + " must be a mapping, got " +
                                       std::string(sdk::json::kind_name(value)));
  }
  const auto& in = value.get_object();
  static const std::set<std::string> kKeys = {"host",     "mount_path", "mountPath", "name",
                                              "ossfs",    "pvc",        "read_only", "readOnly",
                                              "sub_path", "subPath"};
  for (const auto& item : in) {
    if (!kKeys.contains(std::string(item.key()))) {
      throw sdk::Error::invalid_argument(path + ": unknown key '" + std::string(item.key()) +
                                         "' (supported: host, mountPath, name, ossfs, pvc, "
                                         "readOnly, subPath)");
    }
  }
  boost::json::object out;
  const std::string name = string_field(in, "name", path, true);
  if (!is_dns_label(name)) {
    throw sdk::Error::invalid_argument(path + ".name '" + name +
                                       "' must be a DNS label (lowercase letters, digits and '-', "
                                       "63 characters at most)");
  }
  out["name"] = name;
  std::string mount =
      string_field(in, in.contains("mountPath") ? "mountPath" : "mount_path", path, true);
  if (mount.empty() || mount.front() != '/') {
    throw sdk::Error::invalid_argument(path + ".mountPath must be an absolute path, got '" + mount +
                                       "'");
  }
  out["mountPath"] = mount;
  for (const char* key : {"readOnly", "read_only"}) {
    if (const auto* ro = in.if_contains(key); ro && !ro->is_null()) {
      if (!ro->is_bool()) {
        throw sdk::Error::invalid_argument(path + "." + key + " must be a boolean");
      }
      out["readOnly"] = ro->get_bool();
    }
  }
  const std::string sub =
      string_field(in, in.contains("subPath") ? "subPath" : "sub_path", path, false);
  if (!sub.empty()) out["subPath"] = sub;
  int backends = 0;
  for (const char* kind : {"host", "pvc", "ossfs"}) {
    const auto* backend = in.if_contains(kind);
    if (!backend || backend->is_null()) continue;
    ++backends;
    if (!backend->is_object()) {
      throw sdk::Error::invalid_argument(path + "." + kind + " must be a mapping");
    }
    const auto& b = backend->get_object();
    const std::string bpath = path + "." + kind;
    if (std::string_view(kind) == "host") {
      const std::string host_path = string_field(b, "path", bpath, true);
      if (host_path.empty() || host_path.front() != '/') {
        throw sdk::Error::invalid_argument(bpath + ".path must be an absolute path");
      }
    } else if (std::string_view(kind) == "pvc") {
      string_field(b, b.contains("claimName") ? "claimName" : "claim_name", bpath, true);
    } else {
      for (const char* field : {"bucket", "endpoint"})
        string_field(b, field, bpath, true);
    }
    out[kind] = b;
  }
  if (backends != 1) {
    throw sdk::Error::invalid_argument(path + " must have exactly one of host, pvc or ossfs, got " +
                                       std::to_string(backends));
  }
  return out;
}

}  // namespace

SandboxOptions SandboxOptions::parse(const boost::json::object& options) {
  std::set<std::string> unknown;
  for (const auto& item : options) {
    if (!kOptionKeys.contains(std::string(item.key()))) unknown.insert(std::string(item.key()));
  }
  if (!unknown.empty()) {
    throw sdk::Error::invalid_argument("Unknown OpenSandbox provider option(s): " + join(unknown) +
                                       ". Supported: " + join(kOptionKeys));
  }
  SandboxOptions out;
  for (const auto& item : options) {
    const std::string key(item.key());
    const auto& value = item.value();
    if (value.is_null()) continue;
    if (key == "image_auth") {
      out.image_auth = mapping(value, key);
    } else if (key == "network_policy") {
      out.network_policy = mapping(value, key);
    } else if (key == "resource_requests") {
      out.resource_requests = read_resource_requests(mapping(value, key));
    } else if (key == "platform") {
      out.platform = read_platform(mapping(value, key));
    } else if (key == "snapshot_id") {
      if (!value.is_string()) {
        throw sdk::Error::invalid_argument("provider_options.snapshot_id must be a string");
      }
      out.snapshot_id = std::string(value.get_string());
    } else if (key == "volumes") {
      if (!value.is_array()) {
        throw sdk::Error::invalid_argument(
            "provider_options.volumes must be a list of mappings, got " +
            std::string(sdk::json::kind_name(value)));
      }
      const auto& items = value.get_array();
      for (size_t i = 0; i < items.size(); ++i)
        out.volumes.push_back(read_volume(items[i], i));
    } else if (key == "skip_health_check") {
      if (!value.is_bool()) {
        throw sdk::Error::invalid_argument(
            "provider_options.skip_health_check must be a boolean, got " +
            std::string(sdk::json::kind_name(value)));
      }
      out.skip_health_check = value.get_bool();
    } else if (key == "extensions") {
      for (const auto& ext : mapping(value, key)) {
        const auto& v = ext.value();
        out.extensions[std::string(ext.key())] =
            v.is_string() ? std::string(v.get_string()) : boost::json::serialize(v);
      }
    }
  }
  return out;
}

KeyValues resolve_extensions(KeyValues extensions, std::optional<PullPolicy> config_policy) {
  if (!config_policy) return extensions;
  std::string policy(to_string(*config_policy));
  std::string_view from;  // the extensions key the policy came from
  for (const auto key : {kPullPolicyKey, kPullPolicyAnnotationKey}) {
    if (const auto it = extensions.find(std::string(key));
        it != extensions.end() && !it->second.empty()) {
      policy = it->second;
      from = key;
      break;
    }
  }
  if (!parse_pull_policy(policy)) {
    // The seed's message, with the key and the value given (only an extension can be wrong here:
    // the config's policy was validated when the config was read).
    throw sdk::Error::invalid_argument(
        "provider_options.extensions." + std::string(from) +
        ": image_pull_policy must be one of: Always, IfNotPresent, Never; got '" + policy + "'");
  }
  extensions.try_emplace(std::string(kPullPolicyKey), policy);
  extensions.try_emplace(std::string(kPullPolicyAnnotationKey), policy);
  return extensions;
}

int64_t ttl_seconds(std::chrono::milliseconds ttl) {
  const int64_t seconds = (ttl.count() + 999) / 1000;
  return std::max(seconds, kMinTtlSeconds);
}

}  // namespace sbx::opensandbox
