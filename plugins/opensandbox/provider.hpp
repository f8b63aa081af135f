// The opensandbox provider: sandboxes of an OpenSandbox server, through its lifecycle API and each
// sandbox's execd API (HTTP, libcurl multi through the SDK's client). Blocking style on the SDK's
// pool: each operation but exec holds a pool thread while its requests run on the two clients'
// loop threads (one for the lifecycle API, one for execd); exec holds none.
#pragma once

#include "config.hpp"
#include "execd.hpp"
#include "lifecycle.hpp"

#include <sbx/sdk/blocking.hpp>
#include <sbx/sdk/execd_terminal.hpp>
#include <sbx/sdk/plugin.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::opensandbox {

// One sandbox: the server's id, its execd endpoint and the spec's workdir (the default cwd).
// Immutable after create; THREADING: read from any thread.
class OpenSandbox final : public sdk::Sandbox {
 public:
  OpenSandbox(std::string id, ExecdEndpoint execd, std::optional<std::string> workdir,
              std::vector<uint16_t> ports)
      : sdk::Sandbox(std::move(id)),
        execd_(std::move(execd)),
        workdir_(std::move(workdir)),
        ports_(std::move(ports)) {}

  const ExecdEndpoint& execd() const noexcept { return execd_; }
  const std::optional<std::string>& workdir() const noexcept { return workdir_; }
  // The spec's ports (what sbx.endpoint/1 may be asked for), carried to connected handles.
  const std::vector<uint16_t>& ports() const noexcept { return ports_; }
  // Whether this handle last saw the sandbox paused (its own pause/resume, or a status read).
  // THREADING: thread-safe.
  bool paused() const noexcept { return paused_.load(); }
  void set_paused(bool paused) noexcept { paused_.store(paused); }
  // Whether this handle's close has begun: a command still running then ends with NOT_FOUND
  // (docs/sandbox-semantics.md, "Closed and gone sandboxes"), whatever execd reports of it.
  bool closing() const noexcept { return closing_.load(); }
  void set_closing() noexcept { closing_.store(true); }
  // The terminals this handle opened or took up (execd's /pty). THREADING: thread-safe.
  sdk::ExecdTerminals& terminals() noexcept { return terminals_; }

 private:
  ExecdEndpoint execd_;
  std::optional<std::string> workdir_;
  std::vector<uint16_t> ports_;
  std::atomic<bool> paused_{false};
  std::atomic<bool> closing_{false};
  sdk::ExecdTerminals terminals_;
};

// The value of the sbx.workdir metadata a create adds (decision 216): the hex of the workdir's
// bytes, nullopt when that would pass a label value's 63 characters; and back (nullopt for a
// value that is not such hex).
std::optional<std::string> workdir_label(std::string_view workdir);
std::optional<std::string> workdir_from_label(std::string_view label);

// The seed's state mapping (case-insensitive), plus "paused"/"pausing"/"resuming".
sdk::SandboxStatus to_sandbox_status(std::string_view state);

// The create request body for `spec` (everything but the retries): image or snapshot, entrypoint,
// resourceLimits, timeout, env, metadata (attribution under the host's labels under the spec's
// metadata; values sanitised), platform, volumes, networkPolicy, extensions. Throws
// INVALID_ARGUMENT for bad provider_options.
boost::json::object create_request(const Config& config, const sdk::Spec& spec,
                                   const KeyValues& attribution);

// Whether a failed create attempt is worth another, by the error's type: a failed readiness probe
// or health check, a transport failure (could not connect, connection lost, timed out, also after
// the request may have reached the server), or an error answer the lifecycle client marked
// retryable (HTTP status and server error code, see is_retryable_create_answer). Never an invalid
// argument or a cancellation.
bool is_retryable_create_error(const sdk::Error& error);

// Whether a sandbox's metadata matches a list/reap selector: every pair's key present with the
// same value, or with any value when the selector's value is empty.
bool matches_selector(const KeyValues& selector, const KeyValues& metadata);

// Blocking style on the SDK's pool for everything but exec, which holds no thread while its
// command runs (sdk::AsyncExec): its output and end come on the execd client's loop thread.
class OpenSandboxProvider final : public sdk::BlockingProvider,
                                  public sdk::AsyncExec,
                                  public sdk::BlockingEndpoint,
                                  public sdk::BlockingListReap,
                                  public sdk::BlockingPause,
                                  public sdk::BlockingConnect,
                                  public sdk::BlockingRenew,
                                  public sdk::BlockingShellSessions,
                                  public sdk::BlockingPty {
 public:
  static constexpr const char* kId = "opensandbox";
  static constexpr const char* kDescription =
      "Sandboxes of an OpenSandbox server (lifecycle and execd HTTP APIs)";
  static constexpr const char* kConfigSchema = kConfigSchemaText;

  // Validates the config (with $OPEN_SANDBOX_DOMAIN / $OPEN_SANDBOX_API_KEY as fallbacks);
  // contacts nothing.
  OpenSandboxProvider(const sdk::ProviderContext& context, const boost::json::object& config);

  std::unique_ptr<sdk::Sandbox> create(const sdk::Spec& spec,
                                       const sdk::CancelToken& cancel) override;
  // What the host's exec calls: starts the command and returns; `done` completes on the execd
  // client's loop thread, where the output is also written. Cancellation interrupts the command.
  void exec_async(sdk::Sandbox& sandbox, sdk::ExecRequest request,
                  sdk::ExecCompletion done) override;
  // The same, waiting on the calling thread (for BlockingProvider; the adapter calls exec_async).
  sdk::ExitStatus exec(sdk::Sandbox& sandbox, const sdk::ExecRequest& request, sdk::OutputSink& out,
                       const sdk::CancelToken& cancel) override;
  void upload(sdk::Sandbox& sandbox, const sdk::UploadRequest& request, sdk::ByteSource& source,
              const sdk::CancelToken& cancel) override;
  void download(sdk::Sandbox& sandbox, const std::string& remote_path, sdk::ByteSink& sink,
                const sdk::CancelToken& cancel) override;
  sdk::SandboxStatus status(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  void close(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;

  // sbx.pty/1 over execd's /pty routes (sdk::ExecdTerminal; plain http endpoints only). execd's
  // POST /pty takes only cwd and command: env becomes exports before the command, the size a
  // resize once connected; a user is refused (UNIMPLEMENTED). A terminal another process opened
  // is taken up from execd by id.
  std::string open_pty(sdk::Sandbox& sandbox, const sdk::PtyRequest& request,
                       const sdk::CancelToken& cancel) override;
  void attach_pty(sdk::Sandbox& sandbox, const std::string& id, uint64_t since, bool takeover,
                  sdk::PtyAttachCompletion done) override;
  void write_pty(sdk::Sandbox& sandbox, const std::string& id, std::string_view input) override;
  void resize_pty(sdk::Sandbox& sandbox, const std::string& id, uint16_t rows,
                  uint16_t cols) override;
  void close_pty(sdk::Sandbox& sandbox, const std::string& id,
                 const sdk::CancelToken& cancel) override;

  // sbx.endpoint/1: GET the sandbox's endpoint for `port` (the same request and handling as
  // execd's endpoint: scheme from the connection when it has none, the connection's headers under
  // the endpoint's own; the API key only in server-proxy mode), retried as status is.
  sdk::Endpoint endpoint(sdk::Sandbox& sandbox, uint16_t port,
                         const sdk::CancelToken& cancel) override;
  // sbx.list-reap/1: list is GET /v1/sandboxes filtered by the selector's pairs with a value (the
  // server's metadata filter), every page, each item checked against the whole selector here too
  // (an empty value: the key with any value). Reap deletes each listed sandbox (404: already gone,
  // removed) and completes with those removed; when some could not be removed it fails, naming how
  // many and the first errors.
  std::vector<sdk::SandboxInfo> list(const KeyValues& selector,
                                     const sdk::CancelToken& cancel) override;
  std::vector<sdk::SandboxInfo> reap(const KeyValues& selector,
                                     const sdk::CancelToken& cancel) override;

  // sbx.pause/1: POST pause / resume; pausing a paused sandbox or resuming a running one changes
  // nothing. While this handle knows the sandbox paused, exec, upload and download fail at once
  // with FAILED_PRECONDITION.
  void pause(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  void resume(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;

  // sbx.connect/1: the descriptor is {"format": "sbx.descriptor/1", "provider": "opensandbox",
  // "sandbox_id", "workdir"?}; connect checks the sandbox on the server (gone or stopped:
  // NOT_FOUND), fetches its execd endpoint and health-checks it as create does.
  std::string serialize(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  sdk::Connected connect(const std::string& descriptor, const sdk::CancelToken& cancel) override;
  // sbx.renew/1: POST renew-expiration with the time asked for (milliseconds); the server's answer.
  int64_t renew(sdk::Sandbox& sandbox, int64_t expires_at_unix_ms,
                const sdk::CancelToken& cancel) override;

 private:
  // The handle's terminal `id`, or one another process opened, taken up from execd.
  std::shared_ptr<sdk::ExecdTerminal> terminal(OpenSandbox& box, const std::string& id,
                                               bool takeover);

  // One create attempt: POST, endpoint, health check, workdir, probe; on a failure after the POST
  // the new sandbox is deleted (errors of that cleanup are logged and swallowed).
  // `skip_health_check`: the config's or the sandbox's option (provider_options).
  std::unique_ptr<OpenSandbox> create_once(const sdk::Spec& spec, const boost::json::object& body,
                                           bool skip_health_check, const sdk::CancelToken& cancel);
  // The execd endpoint, then /ping until 200 (unless `skip_health_check`), within `budget`.
  // The timeout's message says whether it came `after_create` or on connect and names the step
  // that timed out; `step` is set to the step under way ("endpoint fetch", "health check").
  ExecdEndpoint connect_execd(const std::string& id, std::chrono::milliseconds budget,
                              bool skip_health_check, bool after_create, std::string& step,
                              const sdk::CancelToken& cancel);
  // Deletes a sandbox whose create failed at `step` (the error of that step is `failure`); a
  // failure of the delete is logged and swallowed.
  void cleanup_failed_create(const std::string& id, const std::string& step,
                             const std::exception_ptr& failure);
  // The error a create reports after `attempts` attempts ended with `last`: the same status and
  // details, the message naming the attempts and the last error.
  static sdk::Error final_create_error(const sdk::Error& last, int attempts);
  // Logs at info a TTL the create request changes (under the server's minimum, or fractional).
  void log_ttl(const sdk::Spec& spec) const;
  // DELETE /v1/sandboxes/{id} within close_timeout_s, retried by operations.*; 404 is success.
  void remove_sandbox(const std::string& id, const sdk::CancelToken& cancel);
  // Runs a command to its end, collecting its output (for the probe and the workdir).
  sdk::ProbeAttempt run_collect(const OpenSandbox& box, const std::string& command,
                                std::chrono::milliseconds timeout, const sdk::CancelToken& cancel);
  std::chrono::milliseconds request_timeout() const;
  // The SandboxCheckFn of a command in sandbox `id`: reads its lifecycle status (on the
  // lifecycle loop) and answers FAILED_PRECONDITION when it is paused (its execd frozen),
  // NOT_FOUND when the server no longer has it or it stopped, else lets the command go on.
  SandboxCheckFn sandbox_check(const std::string& id);
  // For a transfer that could not connect or lost its connection: the same question, asked on the
  // calling thread (bounded by 5 s); rethrows the original error when the sandbox seems fine.
  [[noreturn]] void explain_transfer_error(const std::string& id, const sdk::Error& original);
  static CommandRequest command_for(const OpenSandbox& box, const sdk::ExecRequest& request);

  Config config_;
  sdk::Logger log_;
  KeyValues attribution_;
  LifecycleClient lifecycle_;
  ExecdClient execd_;
};

}  // namespace sbx::opensandbox
