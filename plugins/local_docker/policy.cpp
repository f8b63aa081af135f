#include "policy.hpp"

#include <sbx/sdk/error.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

namespace sbx::local_docker {

namespace {

// Docker settings that loosen a container or reach host devices and namespaces, under the names a
// client would try (the Engine API's HostConfig fields in snake case, the CLI's flags). None is
// ever taken from a request.
constexpr std::string_view kHostOptions[] = {"privileged",
                                             "cap_add",
                                             "capabilities",
                                             "devices",
                                             "device_requests",
                                             "device_cgroup_rules",
                                             "network",
                                             "network_mode",
                                             "pid",
                                             "pid_mode",
                                             "ipc",
                                             "ipc_mode",
                                             "uts_mode",
                                             "userns_mode",
                                             "cgroupns_mode",
                                             "cgroup_parent",
                                             "security_opt",
                                             "sysctls",
                                             "runtime",
                                             "group_add",
                                             "host_config",
                                             "binds",
                                             "mounts",
                                             "volumes_from"};

bool under(const std::string& path, const std::string& prefix) {
  if (prefix == "/") return true;
  return path == prefix ||
         (path.size() > prefix.size() && path.starts_with(prefix) && path[prefix.size()] == '/');
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A bind's host source: "src:dst[:mode]" strings and Mount objects whose source is absolute.
// Anything else is a named volume.
bool is_host_path(std::string_view source) {
  return source.starts_with('/');
}

// Checks one host path against the allowlist; returns it resolved.
std::string allowed_host_path(const CreateConfig& create, const std::string& source,
                              const std::string& what) {
  const std::string resolved = resolve_host_path(source, what);
  for (const auto& prefix : create.allowed_host_paths) {
    if (under(resolved, resolve_host_path(prefix, "create.allowed_host_paths"))) return resolved;
  }
  std::string message = what + ": host path '" + source + "'";
  if (resolved != source) message += " (resolved: '" + resolved + "')";
  if (create.allowed_host_paths.empty()) {
    message +=
        " is not allowed: this local_docker provider lets no request mount host paths. "
        "The operator allows prefixes with create.allowed_host_paths in its config.";
  } else {
    message += " is not under an allowed prefix (create.allowed_host_paths: " +
               joined(create.allowed_host_paths) + ")";
  }
  throw sdk::Error::permission_denied(message);
}

void check_named_volume(const CreateConfig& create, const std::string& name,
                        const std::string& what) {
  if (create.allow_named_volumes) return;
  throw sdk::Error::permission_denied(
      what + ": named volume '" + name +
      "' is not allowed: named volumes outlive their sandbox and are shared by name with every "
      "other sandbox of the daemon. The operator allows them with create.allow_named_volumes.");
}

}  // namespace

void refuse_host_options(const boost::json::object& provider_options) {
  for (const auto key : kHostOptions) {
    if (!provider_options.contains(key)) continue;
    throw sdk::Error::permission_denied(
        "provider_options." + std::string(key) +
        ": local_docker never takes this from a request. A container's privileges, devices, "
        "namespaces and security options are the operator's, set for every sandbox in the "
        "provider config (create.network, create.security_opt, create.cap_drop, ...).");
  }
}

void apply_host_policy(const CreateConfig& create, const sdk::Spec& spec, SandboxOptions& options) {
  for (size_t i = 0; i < options.binds.size(); ++i) {
    std::string& bind = options.binds[i];
    const std::string what = "provider_options.volumes[" + std::to_string(i) + "]";
    const size_t colon = bind.find(':');  // validated: "src:dst[:mode]"
    const std::string source = bind.substr(0, colon);
    if (!is_host_path(source)) {
      check_named_volume(create, source, what);
      continue;
    }
    bind = allowed_host_path(create, source, what) + bind.substr(colon);
  }
  // Mount objects are numbered after the strings in the order given; name them by their target.
  for (Mount& mount : options.mounts) {
    const std::string what = "provider_options.volumes (target " + mount.target + ")";
    if (!is_host_path(mount.source)) {
      check_named_volume(create, mount.source, what);
      continue;
    }
    mount.source = allowed_host_path(create, mount.source, what);
  }
  if (spec.resources.gpu && *spec.resources.gpu > 0 && !create.allow_gpu) {
    throw sdk::Error::permission_denied(
        "resources.gpu: GPUs are host devices and this local_docker provider gives none to a "
        "request. The operator allows them with create.allow_gpu.");
  }
}

std::string resolve_host_path(const std::string& path, const std::string& what) {
  if (!is_host_path(path)) {
    throw sdk::Error::invalid_argument(what + ": '" + path + "' is not an absolute path");
  }
  std::vector<std::string> parts;
  for (size_t start = 1; start <= path.size();) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    std::string part = path.substr(start, slash - start);
    if (part == "." || part == "..") {
      throw sdk::Error::invalid_argument(what + ": '" + path +
                                         "' has a '.' or '..' component; give the path plainly");
    }
    if (!part.empty()) parts.push_back(std::move(part));
    start = slash + 1;
  }
  // The longest prefix that exists, resolved; then the missing tail as written.
  for (size_t n = parts.size();; --n) {
    std::string prefix;
    for (size_t k = 0; k < n; ++k)
      prefix += "/" + parts[k];
    if (prefix.empty()) prefix = "/";
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(prefix.c_str(), nullptr),
                                                     &std::free);
    if (!real) {
      if (n == 0) {
        throw sdk::Error::invalid_argument(what + ": cannot resolve '/': " + std::strerror(errno));
      }
      continue;
    }
    std::string resolved = real.get();
    if (n < parts.size()) {
      // The first missing component must be missing indeed, not a link that points nowhere
      // (which the daemon would follow when it creates the directory).
      struct stat st {};
      const std::string first_missing = (prefix == "/" ? "" : prefix) + "/" + parts[n];
      if (::lstat(first_missing.c_str(), &st) == 0) {
        throw sdk::Error::invalid_argument(what + ": '" + first_missing +
                                           "' is a link to nothing, or cannot be resolved");
      }
    }
    for (size_t k = n; k < parts.size(); ++k)
      resolved += (resolved == "/" ? "" : "/") + parts[k];
    return resolved;
  }
}

}  // namespace sbx::local_docker
