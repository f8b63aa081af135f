// local_docker's configuration: the provider config (one JSON object given to the factory) and the
// per-sandbox provider_options. Both are validated up front; every error names the JSON path.
#pragma once

#include <sbx/sdk/json.hpp>
#include <sbx/sdk/probe.hpp>

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::local_docker {

// JSON Schema (draft 2020-12) of the provider config, as offered by the factory.
extern const char kConfigSchemaText[];

enum class PullPolicy { if_not_present, always, never };
std::string_view to_string(PullPolicy policy) noexcept;

// What to do with resources.disk_gib when the storage driver cannot enforce a size limit.
enum class DiskLimitMode { error, warn };

struct CreateConfig {
  std::string keepalive_shell = "/bin/sh";
  std::string keepalive_cmd = "while :; do sleep 2147483647; done";
  double start_timeout_s = 600;  // bounds the image pull and the container start, each
  bool init = true;              // HostConfig.Init: a tiny init reaps zombies and forwards signals
  std::string network = "none";  // HostConfig.NetworkMode
  bool read_only = false;
  std::vector<std::string> cap_drop;
  std::vector<std::string> security_opt;
  std::optional<int64_t> pids_limit;
  bool apply_resource_limits = true;       // cpu and memory; gpu and disk are always requested
  std::string publish_host = "127.0.0.1";  // an IPv4 or IPv6 literal
  DiskLimitMode disk_limit = DiskLimitMode::error;
  std::string name_prefix = "sbx-";
  int64_t concurrency = 32;  // creates in flight per provider instance (pull to ready)
  // What a request may ask of the host (policy.hpp): host path prefixes its bind mounts may use
  // (resolved, symlinks followed; none by default), named volumes, GPUs.
  std::vector<std::string> allowed_host_paths;
  bool allow_named_volumes = false;
  bool allow_gpu = false;
};

struct ExecConfig {
  double default_timeout_s = 180;
  std::optional<std::string> shell;  // unset: bash when the image has it, else sh
  int64_t concurrency = 32;          // execs in flight per provider instance
};

// The TTL reaper: a container that lives as long as the daemon and removes expired sandboxes.
struct ReaperConfig {
  bool enabled = true;
  double interval_s = 2;  // between two sweeps
};

struct Config {
  std::string socket = "/var/run/docker.sock";
  std::optional<std::string> api_version;  // pinned "1.NN"; unset = negotiated at first use
  double request_timeout_s = 60;
  PullPolicy image_pull_policy = PullPolicy::if_not_present;
  // Commands, through sbx-agent as the sandbox's main process (agent.hpp), or through Docker exec.
  bool agent = true;
  std::string agent_dir = "/run/sbx/local_docker";
  CreateConfig create;
  ExecConfig exec;
  ReaperConfig reaper;
  sdk::ProbeConfig probe;
  // Whether the config names a probe command (probe.command, null included). Without one, a
  // sandbox with the agent is ready when its agent answers: an image without a shell is too.
  bool probe_configured = false;

  // The probe defaults of this provider (the seed's six fields).
  static sdk::ProbeConfig default_probe();

  // Reads and validates a provider config. `docker_host` is the value of $DOCKER_HOST or null; it
  // chooses the socket when the config does not. Throws sdk::Error (INVALID_ARGUMENT) naming the
  // JSON path of the first bad value.
  static Config parse(const boost::json::object& json, const char* docker_host);
};

// A bind mount or named volume from provider_options.volumes in object form.
struct Mount {
  std::string source;  // absolute host path (bind) or a volume name
  std::string target;  // absolute path in the container
  bool read_only = false;
};

// spec.provider_options, validated.
struct SandboxOptions {
  std::vector<std::string> binds;  // "src:dst[:ro|rw]" strings, as HostConfig.Binds
  std::vector<Mount> mounts;       // object entries, as HostConfig.Mounts
  // The X-Registry-Auth header value (base64url JSON). A secret: never logged.
  std::optional<std::string> registry_auth;
  std::optional<PullPolicy> image_pull_policy;

  // Throws INVALID_ARGUMENT naming the offending key (unknown keys list the supported ones).
  static SandboxOptions parse(const boost::json::object& options);
};

// RFC 4648 base64url with padding, as Docker expects for X-Registry-Auth.
std::string base64url(std::string_view bytes);

}  // namespace sbx::local_docker
