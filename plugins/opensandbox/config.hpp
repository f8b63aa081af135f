// opensandbox's configuration: the provider config (the seed's sections `connection`, `create`,
// `probe`, `operations` and `attribution`) and the per-sandbox provider_options, validated up front
// with the seed's messages; every error names the JSON path. Also the pure helpers create uses:
// metadata value sanitising, resource quantity formatting and the image pull policy extensions.
// THREADING: everything here is plain data or a pure function.
#pragma once

#include <sbx/sdk/json.hpp>
#include <sbx/sdk/probe.hpp>
#include <sbx/sdk/retry.hpp>
#include <sbx/sdk/types.hpp>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::opensandbox {

// A config's seconds as milliseconds, rounded to the nearest.
inline std::chrono::milliseconds seconds_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

using KeyValues = sdk::KeyValues;

// JSON Schema (draft 2020-12) of the provider config, as offered by the factory.
extern const char kConfigSchemaText[];

inline constexpr std::string_view kPullPolicyKey = "imagePullPolicy";
inline constexpr std::string_view kPullPolicyAnnotationKey =
    "opensandbox.extensions.image-pull-policy";
inline constexpr uint16_t kExecdPort = 44772;
// The lifecycle API refuses a `timeout` (TTL) below this many seconds.
inline constexpr int64_t kMinTtlSeconds = 60;

struct ConnectionConfig {
  std::string domain = "localhost:8080";  // host[:port][/prefix], or a URL with a scheme
  // The management API key (OPEN-SANDBOX-API-KEY). A secret: never logged, never sent to a
  // sandbox endpoint in direct mode.
  std::optional<std::string> api_key;
  std::string protocol = "http";                   // "http" or "https"; a scheme in `domain` wins
  std::optional<double> request_timeout_s = 30.0;  // per request (the SDK's default); null: none
  bool use_server_proxy = false;  // execd through {server}/v1/sandboxes/{id}/proxy/
  std::optional<double> keepalive_expiry_s = 3.0;  // unset (null): libcurl's default
  int64_t max_connections = 100;
  int64_t max_keepalive_connections = 20;  // idle connections kept; 0: none is reused
  // The seed's "httpx"/"aiohttp" choice: either is accepted so its configs load (the transport is
  // always libcurl's multi interface, kept-alive HTTP/1.1 as both of those); anything else is
  // refused.
  std::optional<std::string> transport_backend;
  bool disable_connection_pooling = false;
  int64_t connect_retries = 2;
  bool verify_tls = true;
  std::optional<std::string> ca_bundle;
  double connect_timeout_s = 10;

  // scheme://host[:port][/prefix] without a trailing '/'; the lifecycle API is under it + "/v1".
  std::string base_url() const;
  // The scheme given to an endpoint that has none ("http" or "https").
  std::string scheme() const;
};

enum class PullPolicy { always, if_not_present, never };
std::string_view to_string(PullPolicy policy) noexcept;
// "Always", "IfNotPresent", "Never"; nullopt otherwise.
std::optional<PullPolicy> parse_pull_policy(std::string_view text) noexcept;

struct CreateConfig {
  std::optional<double> request_timeout_s;  // the create request's own timeout
  std::optional<double> timeout_s;          // bounds the create request; unset: request timeouts
  int64_t retries = 2;
  double retry_delay_s = 5.0;
  double retry_max_delay_s = 60.0;
  std::optional<PullPolicy> image_pull_policy = PullPolicy::if_not_present;  // null: pass through
  bool skip_health_check = false;
  double connect_attempt_timeout_s = 30.0;
  double connect_poll_s = 2.0;
  // The container command when the spec has no entrypoint (the server requires one with an image).
  std::vector<std::string> default_entrypoint = {"tail", "-f", "/dev/null"};

  sdk::RetryPolicy retry_policy() const;
};

struct OperationConfig {
  int64_t retries = 3;
  double retry_delay_s = 1.0;
  double retry_max_delay_s = 15.0;
  int64_t command_retries = 0;
  std::optional<double> close_timeout_s = 30.0;
  // An exec stream that carries no byte (not even execd's 3 s ping) this long is dead.
  double stream_idle_timeout_s = 60.0;
  // Background mode: submit with background=true, then poll the command's status (the first poll
  // after min(initial, interval), each pause 1.5 times the last, capped at interval), then fetch
  // its combined log once.
  bool background_exec = false;
  double background_poll_initial_s = 0.25;
  double background_poll_interval_s = 2.0;
  std::optional<double> status_poll_timeout_s = 10.0;  // per status poll; null: request timeout

  sdk::RetryPolicy retry_policy() const;
};

struct AttributionConfig {
  bool enabled = true;
  std::string key_prefix = "nemo-gym.nvidia.com/";  // "" = bare keys
  std::optional<std::string> team;
  std::optional<std::string> user;
  std::optional<std::string> workload;
  std::optional<std::string> run;
};

struct Config {
  ConnectionConfig connection;
  CreateConfig create;
  sdk::ProbeConfig probe;
  OperationConfig operations;
  AttributionConfig attribution;

  // The seed's probe defaults.
  static sdk::ProbeConfig default_probe();

  // Reads and validates a provider config. `env_domain` and `env_api_key` are the values of
  // $OPEN_SANDBOX_DOMAIN and $OPEN_SANDBOX_API_KEY (or null): used when the config does not set
  // `connection.domain` / `connection.api_key`. Throws json::Error / sdk::Error (INVALID_ARGUMENT)
  // naming the JSON path of the first bad value.
  static Config parse(const boost::json::object& json, const char* env_domain,
                      const char* env_api_key);
};

// The attribution key prefix as the seed normalises it: trimmed, "/" appended when missing,
// validated as a lowercase DNS subdomain; "" (or blank) stays "". Throws sdk::Error
// (INVALID_ARGUMENT) naming `path`.
std::string normalize_key_prefix(std::string_view prefix, std::string_view path);

// A metadata value as Kubernetes label values allow: every run of characters outside
// [A-Za-z0-9_.-] becomes one '_', leading and trailing "._-" are stripped, the rest cut to 63
// characters and stripped again; "metadata" when nothing is left.
std::string sanitize_metadata_value(std::string_view value);

// A resource quantity: an integral value without a fraction ("2"), otherwise the shortest text
// that reads back as the same double, as Python's str(float) ("0.5", "1e-05", "1e+16").
std::string resource_quantity(double value);

// The resource map of the create request: cpu, memory ("<n>Mi"), ephemeral-storage ("<n>Gi"),
// gpu and gpu_type, each only when set.
boost::json::object resource_map(const sdk::Resources& resources);

// spec.provider_options, validated (unknown keys refused, listing the supported ones).
struct SandboxOptions {
  std::optional<boost::json::object> image_auth;  // {username, password}; a secret
  std::optional<boost::json::object> network_policy;
  std::optional<sdk::Resources> resource_requests;  // sent as resourceRequests
  std::optional<boost::json::object> platform;      // {os, arch}
  std::optional<std::string> snapshot_id;
  boost::json::array volumes;
  std::optional<bool> skip_health_check;
  KeyValues extensions;

  static SandboxOptions parse(const boost::json::object& options);
};

// The extensions sent with create: `extensions` with the pull policy set in both keys (each only
// when absent), the policy being the first of the two keys' values, else `config_policy`. With
// `config_policy` unset the extensions pass through untouched. Throws INVALID_ARGUMENT for a
// policy that is not Always, IfNotPresent or Never.
KeyValues resolve_extensions(KeyValues extensions, std::optional<PullPolicy> config_policy);

// The create TTL in whole seconds: rounded up, and to the server's minimum of 60 s.
int64_t ttl_seconds(std::chrono::milliseconds ttl);

}  // namespace sbx::opensandbox
