// ABI 1.1 lifecycle of a local_docker sandbox beyond create and close: pause and resume (the Engine
// API's pause/unpause: the cgroup freezer), and descriptors for sbx.connect/1 (a sandbox found
// again by its container name, with what a later process needs read from the labels stamped at
// create). THREADING: any thread; each call is a request or two on `api`.
#pragma once

#include "docker_api.hpp"

#include <sbx/sdk/cancel.hpp>

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sbx::local_docker {

// Freezes every process of the container. Pausing a paused container succeeds; a container that
// is gone is NOT_FOUND; one that is not running is FAILED_PRECONDITION.
void pause_container(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel);
// Thaws it. Resuming a running container succeeds; a container that is gone is NOT_FOUND.
void resume_container(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel);

// Fails with FAILED_PRECONDITION ("... is paused; resume it first") when the container is paused,
// NOT_FOUND with the reason sandbox_gone when it is gone or no longer runs. For file transfers,
// which the daemon would otherwise half do (or do on a sandbox that has ended).
void require_running(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel);

// What a connect found out about a sandbox.
struct FoundSandbox {
  std::string name;          // the sandbox id
  std::string container_id;  // Docker's Id
  std::optional<std::string> workdir;
  std::vector<uint16_t> ports;
  std::optional<int64_t> expires_at;  // Unix seconds: the label's (the host's file may say later)
  bool has_expiry_file = false;       // labelled sbx.expiry_file=expiry::kPath: renewable
  std::string agent_run_dir;          // labelled sbx.agent: its agent's socket directory
  std::string agent_user;             // labelled sbx.agent.user: commands' default user
  bool paused = false;
};

// The descriptor of a sandbox (JSON text): {"format": "sbx.descriptor/1", "provider":
// "local_docker", "sandbox_id": NAME, "container_id": ID}.
std::string make_descriptor(const std::string& name, const std::string& container_id);

// Reads a descriptor (also the bare {"sandbox_id": NAME}) and finds its container: NOT_FOUND when
// it is gone, has stopped, or is another container by that name now; INVALID_ARGUMENT for a
// malformed descriptor, one of another provider, or a container that is not a local_docker
// sandbox.
FoundSandbox find_sandbox(DockerApi& api, const std::string& descriptor,
                          const sdk::CancelToken& cancel);

}  // namespace sbx::local_docker
