// Containers: the create request (labels, env, resources, ports, volumes, entrypoint, TTL), start,
// inspect, status, remove, list, and endpoint resolution from the published ports.
#pragma once

#include "config.hpp"
#include "docker_api.hpp"
#include "images.hpp"
#include "reaper/expiry_file.hpp"

#include <sbx/sdk/types.hpp>

#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::local_docker {

// The label every local_docker container carries; list/reap only consider containers with it.
inline constexpr std::string_view kSandboxLabel = "sbx.sandbox";
// Unix time (seconds) after which a container with a TTL ends itself.
inline constexpr std::string_view kExpiresAtLabel = "sbx.expires_at";
// What a later process needs to reach the sandbox (sbx.connect/1): the spec's workdir and its
// declared ports ("8000,8001"), stamped at create (a container's labels cannot change later).
inline constexpr std::string_view kWorkdirLabel = "sbx.workdir";
inline constexpr std::string_view kPortsLabel = "sbx.ports";

// The spec's environment (all "KEY=value" strings with their NULs) and entrypoint together may take
// at most this much: the kernel gives a process 2 MiB for arguments and environment (a quarter of
// the default 8 MiB stack), and Docker passes the container's environment to every exec too, so
// half of it stays for each command and its own environment.
inline constexpr size_t kMaxSpecEnvBytes = 1024 * 1024;

// The body of POST /containers/create for `spec`. Throws INVALID_ARGUMENT for requests Docker
// cannot honour (ports without a network, gpu_type, non-positive cpu/memory/disk, bad env keys).
// `with_disk_limit` false leaves resources.disk_gib out (storage driver without size limits).
// `expires_at` (from expiry_of) is stamped as the sbx.expires_at label and is the keep-alive's or
// watchdog's expiry at the start; with `ttl_dir` (the host directory holding the expiry file,
// host_dirs.hpp) that directory is bind-mounted read-only at /.sbx/ttl, the agent or the
// keep-alive honour the file, and the label sbx.expiry_file names it. With `agent`, sbx-agent is
// the main process (agent.hpp): its binary and run directory are bind-mounted, the spec's
// entrypoint runs as its child.
struct AgentLaunch {
  std::string binary;   // the agent's binary on the host
  std::string run_dir;  // the host directory of the container's /.sbx/run
  // The image's USER when it is not root: the agent then runs as root (so it can switch users
  // and write files as root, as Docker exec and the archive API can) and runs the entrypoint and
  // commands without a user as this one. Empty: root.
  std::string user;
};
boost::json::object container_config(const Config& config, const sdk::Spec& spec,
                                     const SandboxOptions& options, const ImageRef& image,
                                     std::optional<int64_t> expires_at, bool with_disk_limit,
                                     const std::string& ttl_dir = "",
                                     const AgentLaunch* agent = nullptr);

// With a TTL: the unix time (seconds) at which the sandbox expires if created now (the TTL rounded
// up to whole seconds).
std::optional<int64_t> expiry_of(const sdk::Spec& spec);

// POST /containers/create?name=...; returns the container id. Daemon warnings are logged.
std::string create_container(DockerApi& api, const std::string& name,
                             const boost::json::object& body, const sdk::Logger& log,
                             const sdk::CancelToken& cancel);

// True when `error` (from create_container) says the storage driver cannot apply a size limit.
bool is_storage_opt_unsupported(const sdk::Error& error);

void start_container(DockerApi& api, const std::string& container,
                     std::chrono::milliseconds timeout, const sdk::CancelToken& cancel);

// Watches a container that is about to start for the exit of its main process (POST
// /containers/{id}/wait?condition=next-exit), so that a sandbox that dies during startup can say
// why even when AutoRemove has deleted it already. Cancels the wait when destroyed.
class ExitWatch {
 public:
  ExitWatch(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel);
  ~ExitWatch();
  ExitWatch(const ExitWatch&) = delete;
  ExitWatch& operator=(const ExitWatch&) = delete;
  // The main process's exit code, waiting at most `limit` for it; nothing if it did not exit.
  std::optional<int64_t> exit_code(std::chrono::milliseconds limit) const;

 private:
  http::Call call_;
};

// The last lines of the container's output (stdout and stderr, at most `lines`), for messages;
// empty when the container is gone or has printed nothing. Errors are swallowed.
std::string container_output_tail(DockerApi& api, const std::string& container, int lines);

// GET /containers/{id}/json; NOT_FOUND when the container is gone.
boost::json::object inspect_container(DockerApi& api, const std::string& container,
                                      const sdk::CancelToken& cancel);

// State.Status -> the provider-neutral status (Docker's "paused" counts as running).
sdk::SandboxStatus status_from_state(std::string_view state);

// The container's status; a container the daemon does not know is STOPPED.
sdk::SandboxStatus container_status(DockerApi& api, const std::string& container,
                                    const sdk::CancelToken& cancel);

// Force-removes the container and its anonymous volumes. A container that is gone, or already
// being removed, counts as removed. With a `deadline`, the requests (the removal and, when the
// daemon is removing it already, the wait for that) end by then together (Error::timeout);
// otherwise each has the request timeout.
void remove_container(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel,
                      std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

// Containers with the sandbox label whose labels match `selector` (an empty value matches any
// value of that key).
std::vector<sdk::SandboxInfo> list_containers(DockerApi& api, const sdk::KeyValues& selector,
                                              const sdk::CancelToken& cancel);

// The URL of `port` from an inspect result: the published host port on publish_host (or on the
// binding's own address when that is specific).
sdk::Endpoint endpoint_from_inspect(const boost::json::object& inspect, uint16_t port,
                                    const std::string& publish_host, const std::string& container);

}  // namespace sbx::local_docker
