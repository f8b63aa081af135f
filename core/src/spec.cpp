#include "internal.hpp"

#include <sbx/base/json.hpp>
#include <sbx/base/utf8.hpp>
#include <sbx/core/errors.hpp>
#include <sbx/core/spec.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>

namespace sbx {

std::string_view to_string(SandboxStatus status) noexcept {
  switch (status) {
    case SandboxStatus::starting:
      return "starting";
    case SandboxStatus::running:
      return "running";
    case SandboxStatus::stopped:
      return "stopped";
    case SandboxStatus::error:
      return "error";
    case SandboxStatus::paused:
      return "paused";
    case SandboxStatus::unknown:
      return "unknown";
  }
  return "unknown";
}

namespace {

// Python's repr of a short string list: ['a', 'b'].
std::string python_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i)
    out += (i ? ", '" : "'") + items[i] + "'";
  return out + "]";
}

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// A JSON value as a user wrote it (Boost.JSON would print 8000.5 as 8.0005E3).
std::string value_text(const boost::json::value& v) {
  return v.is_double() ? number_text(v.get_double()) : boost::json::serialize(v);
}

std::optional<double> parse_double(std::string_view text) {
  double v = 0;
  while (!text.empty() && text.front() == ' ')
    text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ')
    text.remove_suffix(1);
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

std::optional<int64_t> parse_int(std::string_view text) {
  int64_t v = 0;
  while (!text.empty() && text.front() == ' ')
    text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ')
    text.remove_suffix(1);
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// A JSON number, or a string holding one (SandboxResources.from_mapping coerces with float()).
double to_float(const boost::json::value& v, std::string_view key) {
  if (v.is_number()) return v.to_number<double>();
  if (v.is_string()) {
    if (auto d = parse_double(v.get_string())) return *d;
  }
  throw InvalidArgumentError("Invalid sandbox resource " + std::string(key) + ": " + value_text(v));
}

// A JSON integer (or integral float), or a string holding one; fractions are refused.
int64_t to_integer(const boost::json::value& v, std::string_view key) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= INT64_MAX) return static_cast<int64_t>(v.get_uint64());
  if (v.is_double() && std::trunc(v.get_double()) == v.get_double() &&
      std::abs(v.get_double()) < 9e18) {
    return static_cast<int64_t>(v.get_double());
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.get_string())) return *i;
  }
  throw InvalidArgumentError("Invalid sandbox resource " + std::string(key) + ": " + value_text(v));
}

// A port: a JSON integer or a numeric string ("Invalid sandbox TCP port: ..." otherwise).
int64_t to_port(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) return v.get_uint64() > INT64_MAX ? INT64_MAX : int64_t(v.get_uint64());
  if (v.is_string()) {
    if (auto i = parse_int(v.get_string())) return *i;
  }
  throw InvalidArgumentError("Invalid sandbox TCP port: " + value_text(v));
}

void require_positive(const std::optional<double>& value, std::string_view what) {
  if (value && !(*value > 0 && std::isfinite(*value))) {
    throw InvalidArgumentError(std::string(what) + " must be > 0, got " + number_text(*value));
  }
}

template <class T>
void require_non_negative(const std::optional<T>& value, std::string_view key) {
  if (value && *value < 0) {
    throw InvalidArgumentError("Sandbox resource " + std::string(key) + " must be >= 0, got " +
                               number_text(static_cast<double>(*value)));
  }
}

// Runs `read` and turns the SDK's reader errors into InvalidArgumentError.
template <class F>
auto reading(F&& read) {
  try {
    return read();
  } catch (const base::json::Error& e) {
    throw InvalidArgumentError(e.what());
  }
}

}  // namespace

Resources Resources::from_json(const boost::json::value& value) {
  Resources r;
  if (value.is_null()) return r;
  if (!value.is_object()) {
    throw InvalidArgumentError("Sandbox resources must be a mapping, got " +
                               std::string(base::json::kind_name(value)));
  }
  static const std::vector<std::string> kKeys = {"cpu", "disk_gib", "gpu", "gpu_type",
                                                 "memory_mib"};
  std::vector<std::string> unknown;
  for (const auto& member : value.get_object()) {
    const std::string key(member.key());
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end()) unknown.push_back(key);
  }
  if (!unknown.empty()) {
    std::sort(unknown.begin(), unknown.end());
    throw InvalidArgumentError("Unknown sandbox resource keys: " + python_list(unknown) +
                               ". Expected keys: " + python_list(kKeys));
  }
  const auto& o = value.get_object();
  auto get = [&](std::string_view key) -> const boost::json::value* {
    auto it = o.find(key);
    return it == o.end() || it->value().is_null() ? nullptr : &it->value();
  };
  if (auto* v = get("cpu")) r.cpu = to_float(*v, "cpu");
  if (auto* v = get("memory_mib")) r.memory_mib = to_integer(*v, "memory_mib");
  if (auto* v = get("disk_gib")) r.disk_gib = to_integer(*v, "disk_gib");
  if (auto* v = get("gpu")) r.gpu = to_integer(*v, "gpu");
  if (auto* v = get("gpu_type")) {
    r.gpu_type = v->is_string() ? std::string(v->get_string()) : boost::json::serialize(*v);
  }
  return r;
}

namespace detail {

void require_utf8(std::string_view text, std::string_view what) {
  if (const size_t at = base::utf8::first_invalid(text); at != text.size()) {
    throw InvalidArgumentError(std::string(what) + " is not valid UTF-8 (byte " +
                               std::to_string(at) + ")");
  }
}

}  // namespace detail

namespace {

void require_text(std::string_view text, std::string_view what) {
  detail::require_utf8(text, what);
}

void require_text(const StringMap& map, std::string_view what) {
  for (const auto& [key, value] : map) {
    require_text(key, std::string(what) + " name");
    require_text(value, std::string(what) + " '" + key + "'");
  }
}

}  // namespace

void SandboxSpec::validate() const {
  std::set<int64_t> seen;
  for (int64_t port : ports) {
    if (port < 1 || port > 65535) {
      throw InvalidArgumentError("Sandbox TCP port must be between 1 and 65535, got " +
                                 std::to_string(port));
    }
    if (!seen.insert(port).second) {
      throw InvalidArgumentError("Duplicate sandbox TCP port: " + std::to_string(port));
    }
  }
  require_positive(ttl_s, "Sandbox ttl_s");
  require_positive(ready_timeout_s, "Sandbox ready_timeout_s");
  if (resources.cpu && !(*resources.cpu >= 0 && std::isfinite(*resources.cpu))) {
    throw InvalidArgumentError("Sandbox resource cpu must be >= 0, got " +
                               number_text(*resources.cpu));
  }
  require_non_negative(resources.memory_mib, "memory_mib");
  require_non_negative(resources.disk_gib, "disk_gib");
  require_non_negative(resources.gpu, "gpu");
  if (entrypoint && entrypoint->empty()) {
    throw InvalidArgumentError("Sandbox entrypoint must not be an empty list");
  }
  for (const auto& [path, contents] : files) {
    if (path.empty()) throw InvalidArgumentError("Sandbox startup file path must not be empty");
    require_text(path, "Sandbox startup file path");
  }
  // Text crosses the ABI as UTF-8 (docs/abi/strings.md); file contents are bytes.
  if (image) {
    // No image reference is this long (Docker's: a name of 255 bytes, a tag of 128, a digest);
    // one that is would only fail later, inside a URL or a request.
    if (image->size() > 4096) {
      throw InvalidArgumentError("Sandbox image must be at most 4096 bytes, got " +
                                 std::to_string(image->size()));
    }
    require_text(*image, "Sandbox image");
  }
  if (workdir) require_text(*workdir, "Sandbox workdir");
  if (resources.gpu_type) require_text(*resources.gpu_type, "Sandbox resource gpu_type");
  require_text(env, "Sandbox env");
  require_text(metadata, "Sandbox metadata");
  if (entrypoint) {
    for (const auto& arg : *entrypoint)
      require_text(arg, "Sandbox entrypoint argument");
  }
}

SandboxSpec SandboxSpec::from_json(const boost::json::value& value) {
  if (!value.is_object()) {
    throw InvalidArgumentError("Sandbox spec must be a JSON object, got " +
                               std::string(base::json::kind_name(value)));
  }
  SandboxSpec spec;
  reading([&] {
    base::json::ObjectReader r(value.get_object(), "$");
    spec.image = r.string("image");
    spec.ttl_s = r.number("ttl_s");
    spec.ready_timeout_s = r.number("ready_timeout_s");
    spec.workdir = r.string("workdir");
    spec.env = r.string_map("env").value_or(StringMap{});
    spec.files = r.string_map("files").value_or(StringMap{});
    spec.metadata = r.string_map("metadata").value_or(StringMap{});
    if (const auto* res = r.value("resources")) spec.resources = Resources::from_json(*res);
    spec.entrypoint = r.string_list("entrypoint");
    if (const auto* opts = r.value("provider_options")) {
      if (!opts->is_object()) r.fail("provider_options", "must be an object");
      spec.provider_options = opts->get_object();
    }
    if (const auto* ports = r.value("ports")) {
      if (!ports->is_array()) {
        throw InvalidArgumentError("Sandbox ports must be a list or tuple of TCP port numbers");
      }
      for (const auto& p : ports->get_array())
        spec.ports.push_back(to_port(p));
    }
    r.finish();
    return 0;
  });
  spec.validate();
  return spec;
}

void ExecOptions::validate() const {
  require_positive(timeout_s, "exec timeout_s");
  if (cwd) require_text(*cwd, "exec cwd");
  if (user) require_text(*user, "exec user");
  require_text(env, "exec env");
}

}  // namespace sbx
