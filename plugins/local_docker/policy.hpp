// What a create request may ask of the host. A request reaches the daemon through the spec and
// provider_options; of that, only three things touch the host itself: bind mounts of host paths,
// named volumes (which outlive the sandbox and are shared by name) and GPUs. Each is refused with
// PERMISSION_DENIED unless the operator's config allows it. Everything else that could loosen a
// container (privileged mode, capabilities, devices, host namespaces, security options, sysctls,
// user namespaces, the network) is never taken from a request: the operator's config sets it for
// every sandbox, and a request that names it is refused (docs/serve.md, "Security model").
//
// THREADING: free functions of their arguments; they read the host's file system (realpath).
#pragma once

#include "config.hpp"

#include <sbx/sdk/provider.hpp>

#include <boost/json/object.hpp>

#include <string>

namespace sbx::local_docker {

// Refuses (PERMISSION_DENIED) a provider option that names a Docker setting a request may never
// choose (privileged, cap_add, devices, pid_mode, ...), saying where the operator sets the
// container's security instead. Other keys are left to SandboxOptions::parse.
void refuse_host_options(const boost::json::object& provider_options);

// Checks the host resources a validated request asks for against the operator's config and
// rewrites each bind mount's source to its resolved path, so that the daemon mounts what was
// checked. Throws PERMISSION_DENIED naming the option and the config key that would allow it, or
// INVALID_ARGUMENT for a host path that cannot be judged ("." or ".." components).
void apply_host_policy(const CreateConfig& create, const sdk::Spec& spec, SandboxOptions& options);

// `path` (absolute) as the kernel would reach it now: the symlinks of its existing part resolved
// (realpath), a missing tail appended as written. "." and ".." components and a tail that starts
// with a dangling symlink are refused (INVALID_ARGUMENT naming `what`).
std::string resolve_host_path(const std::string& path, const std::string& what);

}  // namespace sbx::local_docker
