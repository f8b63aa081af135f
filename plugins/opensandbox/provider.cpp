#include "provider.hpp"

#include "diagnosis.hpp"

#include <sbx/abi/ext/connect.h>
#include <sbx/base/shell_quote.hpp>
#include <sbx/sdk/paths.hpp>
#include <sbx/sdk/retry.hpp>

#include <boost/json.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

namespace sbx::opensandbox {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string random_run_id() {
  std::random_device device;
  std::uniform_int_distribution<int> digit(0, 15);
  std::string out;
  for (int i = 0; i < 12; ++i)
    out += "0123456789abcdef"[digit(device)];
  return out;
}

// The attribution metadata (prefixed keys), or nothing when disabled.
KeyValues attribution_metadata(const AttributionConfig& a) {
  KeyValues out;
  if (!a.enabled) return out;
  auto add = [&](const char* key, const std::optional<std::string>& value) {
    if (value && !value->empty()) out[a.key_prefix + key] = *value;
  };
  add("team", a.team);
  add("user", a.user);
  add("workload", a.workload);
  out[a.key_prefix + "run"] = a.run.value_or(random_run_id());
  return out;
}

// Metadata the plugin adds so that a bare id connects with what its create knew (decision 216).
// Label values allow [A-Za-z0-9_.-] and 63 characters: the workdir goes as the hex of its bytes
// (paths up to 31 bytes), the ports joined by '.'; what does not fit is not carried.
constexpr const char* kWorkdirKey = "sbx.workdir";
constexpr const char* kPortsKey = "sbx.ports";
constexpr size_t kMaxLabelValue = 63;

}  // namespace

std::optional<std::string> workdir_label(std::string_view workdir) {
  if (workdir.empty() || workdir.size() * 2 > kMaxLabelValue) return std::nullopt;
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : workdir) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  }
  return out;
}

std::optional<std::string> workdir_from_label(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(hex.data() + i, hex.data() + i + 2, value, 16);
    if (ec != std::errc() || end != hex.data() + i + 2) return std::nullopt;
    out += static_cast<char>(value);
  }
  return out;
}

namespace {

std::optional<std::string> ports_label(const std::vector<uint16_t>& ports) {
  std::string out;
  for (const uint16_t port : ports)
    out += (out.empty() ? "" : ".") + std::to_string(port);
  if (out.empty() || out.size() > kMaxLabelValue) return std::nullopt;
  return out;
}

// The ports of an sbx.ports label ("8080.9090"); nullopt when malformed.
std::optional<std::vector<uint16_t>> ports_from_label(std::string_view label) {
  std::vector<uint16_t> out;
  while (!label.empty()) {
    const size_t dot = label.find('.');
    const std::string_view word = label.substr(0, dot);
    uint16_t port = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), port);
    if (ec != std::errc() || end != word.data() + word.size() || port == 0) return std::nullopt;
    out.push_back(port);
    label = dot == std::string_view::npos ? std::string_view() : label.substr(dot + 1);
  }
  return out;
}

OpenSandbox& as_box(sdk::Sandbox& sandbox) {
  return static_cast<OpenSandbox&>(sandbox);
}

// What the lifecycle status of sandbox `id` says of a command or transfer that meets silence or a
// closed port: an error when it is paused or gone, nothing when it runs.
std::optional<sdk::Error> paused_or_gone(const std::string& id, const std::string* state,
                                         const sdk::Error* error) {
  if (error) {
    if (error->status() != SBX_STATUS_NOT_FOUND) return std::nullopt;  // cannot tell
    return sdk::Error::not_found("OpenSandbox sandbox " + id +
                                 " is gone (the server no longer knows it)");
  }
  switch (to_sandbox_status(*state)) {
    case sdk::SandboxStatus::paused:
      return sdk::Error::failed_precondition("OpenSandbox sandbox " + id + " is " + *state +
                                             " (its execd does not answer; resume it first)");
    case sdk::SandboxStatus::stopped:
    case sdk::SandboxStatus::error:
      return sdk::Error::not_found("OpenSandbox sandbox " + id + " is " + *state);
    default:
      return std::nullopt;
  }
}

// A command that ended while its sandbox was being closed through this handle: the sandbox is gone,
// and so is the command's result (its end is the close's kill, or the connection's).
sdk::Error closed_under(const OpenSandbox& box) {
  return sdk::Error::not_found("OpenSandbox sandbox " + box.id() +
                               " was closed while the command ran");
}

// A transfer's sandbox path, resolved (docs/sandbox-semantics.md): a relative one is relative
// to the spec's workdir; without a workdir execd resolves it against its own directory. A ".."
// above "/" is refused here: execd would clamp it.
std::string sandbox_path(const OpenSandbox& box, const std::string& path) {
  return sdk::resolve_sandbox_path(path, box.workdir());
}

// Refuses a transfer or command on a sandbox this handle knows paused.
void check_not_paused(const OpenSandbox& box) {
  if (box.paused()) {
    throw sdk::Error::failed_precondition("OpenSandbox sandbox " + box.id() +
                                          " is paused (resume it first)");
  }
}

}  // namespace

sdk::SandboxStatus to_sandbox_status(std::string_view state) {
  const std::string s = lower(state);
  if (s == "active" || s == "ready" || s == "running") return sdk::SandboxStatus::running;
  if (s == "creating" || s == "initializing" || s == "pending" || s == "starting") {
    return sdk::SandboxStatus::starting;
  }
  if (s == "completed" || s == "deleted" || s == "exited" || s == "stopped" || s == "terminated" ||
      s == "stopping") {
    return sdk::SandboxStatus::stopped;
  }
  if (s == "crashed" || s == "error" || s == "failed" || s == "unhealthy") {
    return sdk::SandboxStatus::error;
  }
  if (s == "paused" || s == "pausing" || s == "resuming") return sdk::SandboxStatus::paused;
  return sdk::SandboxStatus::unknown;
}

bool is_retryable_create_error(const sdk::Error& error) {
  switch (error.status()) {
    case SBX_STATUS_CANCELLED:
    case SBX_STATUS_INVALID_ARGUMENT:
      return false;
    case SBX_STATUS_CREATE_VERIFICATION_FAILED:
      return true;
    case SBX_STATUS_TIMEOUT:
      return true;  // a create that timed out (the seed retries it too; cleanup ran)
    case SBX_STATUS_UNAVAILABLE:
      // Transport: could not connect, or lost the connection (also "may have run": a create the
      // server may have done leaves a sandbox its TTL and metadata make findable). Not a TLS
      // failure (a certificate that does not verify, a server that does not speak TLS): the SDK
      // marks those not retryable, and they fail the same way again.
      return error.retryable() || error.may_have_run();
    default:
      return error.retryable();
  }
}

json::object create_request(const Config& config, const sdk::Spec& spec,
                            const KeyValues& attribution) {
  const SandboxOptions options = SandboxOptions::parse(spec.provider_options);
  json::object body;
  if (spec.image && !spec.image->empty()) {
    json::object image{{"uri", *spec.image}};
    if (options.image_auth) image["auth"] = *options.image_auth;
    body["image"] = std::move(image);
  } else if (options.image_auth) {
    throw sdk::Error::invalid_argument("provider_options.image_auth needs spec.image");
  }
  if (options.snapshot_id) {
    if (body.contains("image")) {
      throw sdk::Error::invalid_argument(
          "give spec.image or provider_options.snapshot_id, not both (the server takes exactly "
          "one)");
    }
    body["snapshotId"] = *options.snapshot_id;
  }
  if (!body.contains("image") && !body.contains("snapshotId")) {
    throw sdk::Error::invalid_argument(
        "OpenSandbox needs spec.image or provider_options.snapshot_id");
  }
  json::array entrypoint;
  for (const auto& word : spec.entrypoint.value_or(config.create.default_entrypoint)) {
    entrypoint.emplace_back(word);
  }
  if (entrypoint.empty()) throw sdk::Error::invalid_argument("spec.entrypoint must not be empty");
  body["entrypoint"] = std::move(entrypoint);
  body["resourceLimits"] = resource_map(spec.resources);
  if (options.resource_requests) {
    body["resourceRequests"] = resource_map(*options.resource_requests);
  }
  if (spec.ttl) body["timeout"] = ttl_seconds(*spec.ttl);
  json::object env;
  for (const auto& [k, v] : spec.env)
    env[k] = v;
  body["env"] = std::move(env);
  KeyValues merged = attribution;
  for (const auto& [k, v] : spec.labels)
    merged[k] = v;
  for (const auto& [k, v] : spec.metadata)
    merged[k] = v;
  json::object metadata;
  for (const auto& [k, v] : merged)
    metadata[k] = sanitize_metadata_value(v);
  if (const auto workdir = spec.workdir ? workdir_label(*spec.workdir) : std::nullopt) {
    metadata[kWorkdirKey] = *workdir;
  }
  if (const auto ports = ports_label(spec.ports)) metadata[kPortsKey] = *ports;
  body["metadata"] = std::move(metadata);
  if (options.platform) body["platform"] = *options.platform;
  if (!options.volumes.empty()) body["volumes"] = options.volumes;
  if (options.network_policy) body["networkPolicy"] = *options.network_policy;
  const KeyValues extensions =
      resolve_extensions(options.extensions, config.create.image_pull_policy);
  if (!extensions.empty()) {
    json::object ext;
    for (const auto& [k, v] : extensions)
      ext[k] = v;
    body["extensions"] = std::move(ext);
  }
  return body;
}

OpenSandboxProvider::OpenSandboxProvider(const sdk::ProviderContext& context,
                                         const boost::json::object& config)
    : config_(Config::parse(config, std::getenv("OPEN_SANDBOX_DOMAIN"),
                            std::getenv("OPEN_SANDBOX_API_KEY"))),
      log_(context.log),
      attribution_(attribution_metadata(config_.attribution)),
      lifecycle_(config_.connection, context.log),
      execd_(config_.connection, config_.operations, context.log) {
  log_.debug("opensandbox: server ", config_.connection.base_url(), ", ",
             config_.connection.use_server_proxy ? "server-proxy" : "direct", " execd, API key ",
             config_.connection.api_key ? "set" : "unset");
}

SandboxCheckFn OpenSandboxProvider::sandbox_check(const std::string& id) {
  return [this, id](Verdict verdict) {
    lifecycle_.status_async(
        id, 5s, [id, verdict](const SandboxStatusInfo* status, const sdk::Error* error) {
          verdict(paused_or_gone(id, status ? &status->state : nullptr, error));
        });
  };
}

void OpenSandboxProvider::explain_transfer_error(const std::string& id,
                                                 const sdk::Error& original) {
  if (!reached_no_answer(original)) throw original;
  std::optional<sdk::Error> verdict;
  try {
    const std::string state = lifecycle_.state(id, 5s, {});
    verdict = paused_or_gone(id, &state, nullptr);
  } catch (const sdk::Error& e) {
    verdict = paused_or_gone(id, nullptr, &e);
  }
  throw verdict ? *verdict : original;
}

std::chrono::milliseconds OpenSandboxProvider::request_timeout() const {
  return config_.connection.request_timeout_s ? seconds_ms(*config_.connection.request_timeout_s)
                                              : 0ms;
}

std::unique_ptr<sdk::Sandbox> OpenSandboxProvider::create(const sdk::Spec& spec,
                                                          const sdk::CancelToken& cancel) {
  const json::object body = create_request(config_, spec, attribution_);
  log_ttl(spec);
  const bool skip_health_check =
      config_.create.skip_health_check ||
      SandboxOptions::parse(spec.provider_options).skip_health_check.value_or(false);
  std::unique_ptr<OpenSandbox> box;
  int attempts = 0;
  try {
    sdk::retry(
        config_.create.retry_policy(),
        [&] {
          ++attempts;
          box = create_once(spec, body, skip_health_check, cancel);
        },
        cancel, is_retryable_create_error,
        [&](int attempt, const sdk::Error& error, std::chrono::milliseconds delay) {
          log_.warn("Retrying OpenSandbox sandbox create after attempt ", attempt,
                    "; next_sleep_s=", static_cast<double>(delay.count()) / 1000,
                    "; error=", error.what());
        });
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_CANCELLED || (attempts <= 1 && !is_retryable_create_error(e))) {
      throw;
    }
    throw final_create_error(e, attempts);
  }
  return box;
}

std::unique_ptr<OpenSandbox> OpenSandboxProvider::create_once(const sdk::Spec& spec,
                                                              const json::object& body,
                                                              bool skip_health_check,
                                                              const sdk::CancelToken& cancel) {
  std::chrono::milliseconds create_timeout = request_timeout();
  if (config_.create.request_timeout_s) {
    create_timeout = seconds_ms(*config_.create.request_timeout_s);
  }
  if (config_.create.timeout_s) create_timeout = seconds_ms(*config_.create.timeout_s);
  const std::string id = lifecycle_.create(body, create_timeout, cancel);
  log_.debug("opensandbox: created sandbox ", id);
  std::string step = "endpoint fetch";
  try {
    std::chrono::milliseconds budget = seconds_ms(config_.create.connect_attempt_timeout_s);
    if (config_.create.timeout_s) budget = seconds_ms(*config_.create.timeout_s);
    if (spec.ready_timeout) budget = *spec.ready_timeout;
    auto box = std::make_unique<OpenSandbox>(
        id, connect_execd(id, budget, skip_health_check, true, step, cancel), spec.workdir,
        spec.ports);
    step = "workdir";
    if (spec.workdir) {
      const auto made = run_collect(*box, "mkdir -p " + base::shell_quote(*spec.workdir),
                                    seconds_ms(config_.probe.timeout_s), cancel);
      if (made.return_code != 0) {
        throw sdk::Error::create_failed("cannot create the workdir " + *spec.workdir +
                                        " in sandbox " + id + ": " +
                                        made.stderr_text.substr(0, 200));
      }
    }
    step = "probe";
    sdk::run_readiness_probe(
        config_.probe, id,
        [&](std::chrono::milliseconds timeout) {
          return run_collect(*box, *config_.probe.command, timeout, cancel);
        },
        cancel, seconds_ms(config_.create.connect_poll_s));
    return box;
  } catch (...) {
    // The sandbox exists on the server but is not usable: delete it (a cancelled create too),
    // then report the original failure.
    cleanup_failed_create(id, step, std::current_exception());
    throw;
  }
}

void OpenSandboxProvider::cleanup_failed_create(const std::string& id, const std::string& step,
                                                const std::exception_ptr& failure) {
  std::string what = "create " + step + " failure";
  try {
    std::rethrow_exception(failure);
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_CANCELLED) what = "create cancelled during the " + step;
  } catch (...) {
  }
  try {
    // Through close's retries (one 5xx must not leak a sandbox that may have no TTL); not
    // cancellable: a cancelled create must not leave its sandbox behind either.
    remove_sandbox(id, {});
    log_.debug("opensandbox: deleted sandbox ", id, " after ", what);
  } catch (const std::exception& e) {
    log_.warn("Failed to clean up OpenSandbox sandbox after ", what, "; sandbox_id=", id,
              "; error=", e.what());
  }
}

sdk::Error OpenSandboxProvider::final_create_error(const sdk::Error& last, int attempts) {
  return sdk::Error(last.status(),
                    "OpenSandbox create failed after " + std::to_string(attempts) +
                        (attempts == 1 ? " attempt" : " attempts") + "; last error: " + last.what(),
                    last.details());
}

void OpenSandboxProvider::log_ttl(const sdk::Spec& spec) const {
  if (!spec.ttl) return;
  const int64_t sent = ttl_seconds(*spec.ttl);
  if (sent * 1000 == spec.ttl->count()) return;
  std::ostringstream asked;
  asked << static_cast<double>(spec.ttl->count()) / 1000;
  if (sent == kMinTtlSeconds && spec.ttl->count() < kMinTtlSeconds * 1000) {
    log_.info("opensandbox: TTL ", asked.str(), " s is under the server's minimum of ",
              kMinTtlSeconds, " s; sending timeout ", sent, " s");
  } else {
    log_.info("opensandbox: TTL ", asked.str(), " s rounded up to whole seconds; sending timeout ",
              sent, " s");
  }
}

ExecdEndpoint OpenSandboxProvider::connect_execd(const std::string& id,
                                                 std::chrono::milliseconds budget,
                                                 bool skip_health_check, bool after_create,
                                                 std::string& step,
                                                 const sdk::CancelToken& cancel) {
  // The endpoint, then execd's /ping until it answers 200, within `budget`. With
  // skip_health_check only the endpoint is fetched (retried the same way: the seed's reconnect
  // after create), and the probe alone proves readiness.
  // Polled fast at first (execd usually listens within a few hundred ms of the create's answer),
  // then ever more slowly: 50 ms, doubling up to create.connect_poll_s.
  const auto deadline = std::chrono::steady_clock::now() + budget;
  const auto max_poll = seconds_ms(config_.create.connect_poll_s);
  auto poll = std::min<std::chrono::milliseconds>(50ms, max_poll);
  std::optional<ExecdEndpoint> endpoint;
  std::string last_error = "no attempt";
  step = "endpoint fetch";
  for (;;) {
    sdk::throw_if_cancelled(cancel);
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (remaining <= 0ms) {
      std::ostringstream message;
      message << "Timed out connecting to OpenSandbox sandbox "
              << (after_create ? "after create" : "on connect") << ", "
              << (endpoint ? "waiting for execd's /ping to answer 200"
                           : "fetching its execd endpoint (GET /v1/sandboxes/" + id +
                                 "/endpoints/" + std::to_string(kExecdPort) + ")")
              << "; sandbox_id=" << id
              << ", timeout_s=" << static_cast<double>(budget.count()) / 1000
              << "; last error: " << last_error;
      // Within create a timeout is a failed attempt (retryable, as the seed's); on connect the
      // sandbox exists but does not answer in time.
      if (after_create) throw sdk::Error::create_failed(message.str(), true);
      throw sdk::Error(SBX_STATUS_TIMEOUT, message.str());
    }
    const auto attempt = std::min(remaining, seconds_ms(config_.create.connect_attempt_timeout_s));
    try {
      if (!endpoint) {
        endpoint = lifecycle_.endpoint(id, kExecdPort, attempt, cancel);
        if (!skip_health_check) step = "health check";
      }
      if (skip_health_check || execd_.ping(*endpoint, attempt, cancel)) {
        return *endpoint;
      }
      last_error = "execd /ping did not answer 200";
    } catch (const sdk::Error& e) {
      if (e.status() == SBX_STATUS_CANCELLED || !is_retryable_create_error(e)) throw;
      last_error = e.what();
    }
    sdk::sleep_for(std::min(poll, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::max(deadline - std::chrono::steady_clock::now(),
                                               std::chrono::steady_clock::duration::zero()))),
                   cancel);
    poll = std::min(poll * 2, max_poll);
  }
}

sdk::ProbeAttempt OpenSandboxProvider::run_collect(const OpenSandbox& box,
                                                   const std::string& command,
                                                   std::chrono::milliseconds timeout,
                                                   const sdk::CancelToken& cancel) {
  sdk::ProbeAttempt result;
  CommandRequest request{.command = command, .timeout = timeout};
  const auto outcome = execd_.run(
      box.execd(), box.id(), request,
      [&](sdk::StdStream stream, std::string_view bytes) {
        (stream == sdk::StdStream::out ? result.stdout_text : result.stderr_text) += bytes;
      },
      cancel);
  result.return_code = outcome.status.return_code;
  return result;
}

// What an exec asks execd for: the spec's workdir as the default cwd; a user that is a number is
// sent as the uid, a name runs the command through `su` (execd takes no user names).
CommandRequest OpenSandboxProvider::command_for(const OpenSandbox& box,
                                                const sdk::ExecRequest& request) {
  CommandRequest command{.command = request.command,
                         .cwd = request.cwd ? request.cwd : box.workdir(),
                         .envs = request.env,
                         .timeout = request.timeout};
  if (request.user && *request.user != "root") {
    uint32_t uid = 0;
    const auto& user = *request.user;
    const auto [end, ec] = std::from_chars(user.data(), user.data() + user.size(), uid);
    if (ec == std::errc() && end == user.data() + user.size()) {
      command.uid = uid;
    } else {
      command.command =
          "su -s /bin/sh -c " + base::shell_quote(request.command) + " " + base::shell_quote(user);
    }
  }
  return command;
}

void OpenSandboxProvider::exec_async(sdk::Sandbox& sandbox, sdk::ExecRequest request,
                                     sdk::ExecCompletion done) {
  const auto& box = as_box(sandbox);
  check_not_paused(box);
  const CommandRequest command = command_for(box, request);
  sdk::OutputSink* out = &done.output();
  // The handle outlives the operation (the host releases a sandbox with nothing pending).
  const OpenSandbox* handle = &box;
  const sdk::CancelToken cancel = done.cancel_token();
  auto completion = std::make_shared<sdk::ExecCompletion>(std::move(done));
  execd_.start(
      box.execd(), box.id(), command,
      [out](sdk::StdStream stream, std::string_view text) { out->write(stream, text); },
      [this, completion, handle, id = box.id(), cancel](const CommandOutcome* outcome,
                                                        const sdk::Error* error) {
        if (handle->closing() && !cancel.stop_requested()) {
          return completion->fail(closed_under(*handle));
        }
        if (outcome) return completion->succeed(outcome->status);
        if (!is_backend_502(*error) || cancel.stop_requested()) return completion->fail(*error);
        // The sandbox may have died of memory: its status says so for a few seconds.
        diagnose_after_502(
            lifecycle_, id, *error,
            [this, completion](const sdk::Error& e) {
              if (std::string_view(e.what()).starts_with("Sandbox was OOM-killed")) {
                log_.warn(e.what());
              }
              completion->fail(e);
            },
            cancel);
      },
      cancel, sandbox_check(box.id()));
}

sdk::ExitStatus OpenSandboxProvider::exec(sdk::Sandbox& sandbox, const sdk::ExecRequest& request,
                                          sdk::OutputSink& out, const sdk::CancelToken& cancel) {
  const auto& box = as_box(sandbox);
  check_not_paused(box);
  // As exec_async: a command that ends while this handle closes the sandbox has no result.
  const auto closed_meanwhile = [&] { return box.closing() && !cancel.stop_requested(); };
  sdk::ExitStatus status;
  try {
    status =
        execd_
            .run(
                box.execd(), box.id(), command_for(box, request),
                [&out](sdk::StdStream stream, std::string_view text) { out.write(stream, text); },
                cancel, sandbox_check(box.id()))
            .status;
  } catch (const sdk::Error&) {
    if (closed_meanwhile()) throw closed_under(box);
    throw;
  }
  if (closed_meanwhile()) throw closed_under(box);
  return status;
}

void OpenSandboxProvider::upload(sdk::Sandbox& sandbox, const sdk::UploadRequest& request,
                                 sdk::ByteSource& source, const sdk::CancelToken& cancel) {
  const auto& box = as_box(sandbox);
  check_not_paused(box);
  sdk::UploadRequest resolved = request;
  resolved.remote_path = sandbox_path(box, request.remote_path);
  try {
    execd_.upload(box.execd(), box.id(), resolved, source, cancel, sandbox_check(box.id()));
  } catch (const sdk::Error& e) {
    explain_transfer_error(box.id(), e);
  }
}

void OpenSandboxProvider::download(sdk::Sandbox& sandbox, const std::string& remote_path,
                                   sdk::ByteSink& sink, const sdk::CancelToken& cancel) {
  const auto& box = as_box(sandbox);
  check_not_paused(box);
  try {
    execd_.download(box.execd(), box.id(), sandbox_path(box, remote_path), sink, cancel,
                    sandbox_check(box.id()));
  } catch (const sdk::Error& e) {
    explain_transfer_error(box.id(), e);
  }
}

sdk::SandboxStatus OpenSandboxProvider::status(sdk::Sandbox& sandbox,
                                               const sdk::CancelToken& cancel) {
  std::string state;
  try {
    sdk::retry(
        config_.operations.retry_policy(),
        [&] { state = lifecycle_.state(sandbox.id(), request_timeout(), cancel); }, cancel);
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_NOT_FOUND) return sdk::SandboxStatus::stopped;
    throw;
  }
  const auto status = to_sandbox_status(state);
  if (status == sdk::SandboxStatus::paused || status == sdk::SandboxStatus::running) {
    as_box(sandbox).set_paused(status == sdk::SandboxStatus::paused);
  }
  return status;
}

// Pause and resume are retried as status and close are: each reads the state back, so a second
// attempt after a lost answer finds the work done.
void OpenSandboxProvider::pause(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  sdk::retry(
      config_.operations.retry_policy(),
      [&] { lifecycle_.pause_or_resume(sandbox.id(), true, request_timeout(), cancel); }, cancel);
  as_box(sandbox).set_paused(true);
}

void OpenSandboxProvider::resume(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  sdk::retry(
      config_.operations.retry_policy(),
      [&] { lifecycle_.pause_or_resume(sandbox.id(), false, request_timeout(), cancel); }, cancel);
  as_box(sandbox).set_paused(false);
}

void OpenSandboxProvider::close(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  as_box(sandbox).set_closing();
  as_box(sandbox).terminals().clear();  // their attachments end (NOT_FOUND) first
  remove_sandbox(sandbox.id(), cancel);
}

// ---- sbx.pty/1 over execd's /pty (sdk::ExecdTerminal) -------------------------------------------

namespace {

// Where the WebSocket goes: the endpoint's host and port, its path as the prefix, its headers.
sdk::ExecdPlace execd_place(const OpenSandbox& box) {
  const std::string& url = box.execd().base_url;
  constexpr std::string_view kHttp = "http://";
  if (!url.starts_with(kHttp)) {
    throw sdk::Error::unimplemented("terminals need a plain http execd endpoint, not " +
                                    url.substr(0, url.find("://")));
  }
  const std::string rest = url.substr(kHttp.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  sdk::ExecdPlace place;
  place.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  const size_t colon = authority.rfind(':');
  const bool bracketed = authority.starts_with('[');
  std::string host = authority, port = "80";
  if (colon != std::string::npos && (!bracketed || authority.find(']') < colon)) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (bracketed) host = host.substr(1, host.size() - 2);
  place.endpoint.host = host;
  try {
    place.endpoint.port = static_cast<uint16_t>(std::stoul(port));
  } catch (const std::exception&) {
    throw sdk::Error::internal("the execd endpoint " + authority + " has no port number");
  }
  place.headers = box.execd().headers;
  return place;
}

// `command` (none: the image's bash, else sh) after `export` of `env`, as execd's body has no env.
std::optional<std::string> with_env(const sdk::PtyRequest& request) {
  if (request.env.empty()) return request.command;
  std::string out;
  for (const auto& [k, v] : request.env)
    out += "export " + k + "=" + base::shell_quote(v) + "; ";
  return out + request.command.value_or("exec \"$(command -v bash || echo sh)\"");
}

}  // namespace

std::string OpenSandboxProvider::open_pty(sdk::Sandbox& sandbox, const sdk::PtyRequest& request,
                                          const sdk::CancelToken& cancel) {
  OpenSandbox& box = as_box(sandbox);
  check_not_paused(box);  // its frozen execd would take the open, then time out
  if (request.user) {
    throw sdk::Error::unimplemented(
        "execd's terminals run as the sandbox's user: a terminal's user cannot be chosen");
  }
  for (const auto& [k, v] : request.env) {
    if (k.empty() || k.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789_") != std::string::npos) {
      throw sdk::Error::invalid_argument("a terminal's variable name must be [A-Za-z0-9_]+: " + k);
    }
  }
  const sdk::ExecdPlace place = execd_place(box);
  boost::json::object body;
  if (const auto command = with_env(request)) body["command"] = *command;
  if (const auto cwd = request.cwd ? request.cwd : box.workdir()) body["cwd"] = *cwd;
  const std::string id = execd_.open_pty(box.execd(), boost::json::serialize(body), cancel);
  try {
    auto terminal = std::make_shared<sdk::ExecdTerminal>(place, id, request.tty, log_);
    // execd starts terminals at 80 x 24; a resize before anything is typed sets the size asked.
    if (request.tty && (request.rows != 24 || request.cols != 80)) {
      terminal->resize(request.rows, request.cols);
    }
    box.terminals().add(std::move(terminal));
  } catch (...) {
    try {
      execd_.delete_pty(box.execd(), id, sdk::CancelToken());
    } catch (const sdk::Error& e) {
      log_.warn("opensandbox: terminal ", id, " of sandbox ", box.id(),
                " could not be deleted: ", e.what());
    }
    throw;
  }
  return id;
}

std::shared_ptr<sdk::ExecdTerminal> OpenSandboxProvider::terminal(OpenSandbox& box,
                                                                  const std::string& id,
                                                                  bool takeover) {
  return box.terminals().find_or(id, [&] {
    return std::make_shared<sdk::ExecdTerminal>(execd_place(box), id,
                                                sdk::ExecdTerminal::TakeUp{takeover}, log_);
  });
}

void OpenSandboxProvider::attach_pty(sdk::Sandbox& sandbox, const std::string& id, uint64_t since,
                                     bool takeover, sdk::PtyAttachCompletion done) {
  OpenSandbox& box = as_box(sandbox);
  check_not_paused(box);
  terminal(box, id, takeover)->output().attach(since, takeover, std::move(done));
}

void OpenSandboxProvider::write_pty(sdk::Sandbox& sandbox, const std::string& id,
                                    std::string_view input) {
  OpenSandbox& box = as_box(sandbox);
  check_not_paused(box);
  terminal(box, id, true)->write(input);
}

void OpenSandboxProvider::resize_pty(sdk::Sandbox& sandbox, const std::string& id, uint16_t rows,
                                     uint16_t cols) {
  OpenSandbox& box = as_box(sandbox);
  check_not_paused(box);
  terminal(box, id, true)->resize(rows, cols);
}

void OpenSandboxProvider::close_pty(sdk::Sandbox& sandbox, const std::string& id,
                                    const sdk::CancelToken& cancel) {
  OpenSandbox& box = as_box(sandbox);
  box.terminals().close(id, [&] { execd_.delete_pty(box.execd(), id, cancel); });
}

void OpenSandboxProvider::remove_sandbox(const std::string& id, const sdk::CancelToken& cancel) {
  const auto timeout =
      config_.operations.close_timeout_s ? seconds_ms(*config_.operations.close_timeout_s) : 0ms;
  sdk::retry(
      config_.operations.retry_policy(), [&] { lifecycle_.remove(id, timeout, cancel); }, cancel,
      {},
      [&](int attempt, const sdk::Error& error, std::chrono::milliseconds delay) {
        log_.warn("Retrying OpenSandbox close of ", id, " after attempt ", attempt,
                  "; next_sleep_s=", static_cast<double>(delay.count()) / 1000,
                  "; error=", error.what());
      });
}

bool matches_selector(const KeyValues& selector, const KeyValues& metadata) {
  for (const auto& [k, v] : selector) {
    const auto it = metadata.find(k);
    if (it == metadata.end() || (!v.empty() && it->second != v)) return false;
  }
  return true;
}

sdk::Endpoint OpenSandboxProvider::endpoint(sdk::Sandbox& sandbox, uint16_t port,
                                            const sdk::CancelToken& cancel) {
  ExecdEndpoint found;
  sdk::retry(
      config_.operations.retry_policy(),
      [&] { found = lifecycle_.endpoint(sandbox.id(), port, request_timeout(), cancel); }, cancel);
  sdk::Endpoint out{std::move(found.base_url), {}};
  for (auto& [name, value] : found.headers)
    out.headers[name] = std::move(value);
  return out;
}

std::vector<sdk::SandboxInfo> OpenSandboxProvider::list(const KeyValues& selector,
                                                        const sdk::CancelToken& cancel) {
  // The server filters by exact pairs; a key wanted with any value is checked here only. Every
  // item is checked here as well: a server that ignored the filter must not make reap delete
  // sandboxes the selector does not name.
  KeyValues exact;
  for (const auto& [k, v] : selector) {
    if (!v.empty()) exact[k] = v;
  }
  const std::string filter = metadata_filter(exact);
  constexpr int64_t kPageSize = 200;    // the server's cap
  constexpr int64_t kMaxPages = 10000;  // bounds a server that always says there is more
  std::vector<sdk::SandboxInfo> out;
  std::set<std::string> seen;  // pages shift while sandboxes come and go: no id twice
  for (int64_t page = 1;; ++page) {
    ListPage answer;
    sdk::retry(
        config_.operations.retry_policy(),
        [&] { answer = lifecycle_.list_page(filter, page, kPageSize, request_timeout(), cancel); },
        cancel);
    for (auto& item : answer.items) {
      if (!matches_selector(selector, item.metadata) || !seen.insert(item.id).second) continue;
      out.push_back(sdk::SandboxInfo{.id = std::move(item.id),
                                     .status = to_sandbox_status(item.state),
                                     .labels = std::move(item.metadata),
                                     .created_unix_ms = item.created_unix_ms});
    }
    if (!answer.has_next_page || answer.items.empty()) break;
    if (page >= kMaxPages) {
      log_.warn("opensandbox: list stopped after ", kMaxPages, " pages of ", kPageSize,
                " sandboxes");
      break;
    }
  }
  log_.debug("opensandbox: listed ", out.size(), " sandboxes");
  return out;
}

std::vector<sdk::SandboxInfo> OpenSandboxProvider::reap(const KeyValues& selector,
                                                        const sdk::CancelToken& cancel) {
  std::vector<sdk::SandboxInfo> removed;
  std::string failures;
  size_t failed = 0;
  for (auto& info : list(selector, cancel)) {
    sdk::throw_if_cancelled(cancel);
    try {
      remove_sandbox(info.id, cancel);  // a sandbox already gone (404) counts as removed
      info.status = sdk::SandboxStatus::stopped;
      removed.push_back(std::move(info));
    } catch (const sdk::Error& e) {
      if (e.status() == SBX_STATUS_CANCELLED) throw;
      if (++failed <= 3) failures += std::string(failures.empty() ? "" : "; ") + e.what();
    }
  }
  if (failed > 0) {
    log_.warn("opensandbox: reap removed ", removed.size(), " sandboxes; ", failed,
              " could not be removed");
    throw sdk::Error(SBX_STATUS_INTERNAL,
                     "OpenSandbox reap removed " + std::to_string(removed.size()) +
                         " sandboxes but " + std::to_string(failed) +
                         " could not be removed: " + failures,
                     sdk::ErrorDetails{.retryable = true});
  }
  log_.info("opensandbox: reaped ", removed.size(), " sandboxes");
  return removed;
}

std::string OpenSandboxProvider::serialize(sdk::Sandbox& sandbox, const sdk::CancelToken&) {
  const auto& box = as_box(sandbox);
  json::object descriptor{
      {"format", SBX_DESCRIPTOR_FORMAT}, {"provider", kId}, {"sandbox_id", box.id()}};
  if (box.workdir()) descriptor["workdir"] = *box.workdir();
  if (!box.ports().empty()) {
    json::array ports;
    for (const uint16_t port : box.ports())
      ports.emplace_back(port);
    descriptor["ports"] = std::move(ports);
  }
  return json::serialize(descriptor);
}

sdk::Connected OpenSandboxProvider::connect(const std::string& descriptor,
                                            const sdk::CancelToken& cancel) {
  boost::system::error_code ec;
  const json::value parsed = json::parse(descriptor, ec);
  if (ec || !parsed.is_object()) {
    throw sdk::Error::invalid_argument("the descriptor is not a JSON object");
  }
  const auto& d = parsed.get_object();
  // A descriptor from serialize(), or {"sandbox_id"} alone (what `sbx` makes of a bare id): the
  // server's id is all connect needs.
  if (const auto* format = d.if_contains("format")) {
    if (!format->is_string() || format->get_string() != SBX_DESCRIPTOR_FORMAT) {
      throw sdk::Error::invalid_argument("the descriptor's format is not " SBX_DESCRIPTOR_FORMAT);
    }
    const auto* provider = d.if_contains("provider");
    if (!provider || !provider->is_string() || provider->get_string() != kId) {
      throw sdk::Error::invalid_argument("the descriptor is not of provider opensandbox");
    }
  }
  const auto* id = d.if_contains("sandbox_id");
  if (!id || !id->is_string() || id->get_string().empty()) {
    throw sdk::Error::invalid_argument("the descriptor has no sandbox_id");
  }
  std::optional<std::string> workdir;
  if (const auto* w = d.if_contains("workdir"); w && w->is_string()) {
    workdir = std::string(w->get_string());
  }
  std::optional<std::vector<uint16_t>> ports;
  if (const auto* p = d.if_contains("ports"); p && p->is_array()) {
    ports.emplace();
    for (const auto& port : p->get_array()) {
      if (!port.is_int64() || port.get_int64() < 1 || port.get_int64() > 65535) {
        throw sdk::Error::invalid_argument("the descriptor's ports are not port numbers");
      }
      ports->push_back(static_cast<uint16_t>(port.get_int64()));
    }
  }
  const std::string sandbox_id(id->get_string());
  ListedSandbox found;
  sdk::retry(
      config_.operations.retry_policy(),
      [&] { found = lifecycle_.get(sandbox_id, request_timeout(), cancel); }, cancel);
  const std::string& state = found.state;
  const auto status = to_sandbox_status(state);
  if (status == sdk::SandboxStatus::stopped || status == sdk::SandboxStatus::error) {
    throw sdk::Error::not_found("OpenSandbox sandbox " + sandbox_id + " is " + state);
  }
  // A bare id: what the create left in the sandbox's metadata.
  if (!d.contains("workdir")) {
    if (const auto it = found.metadata.find(kWorkdirKey); it != found.metadata.end()) {
      workdir = workdir_from_label(it->second);
    }
  }
  if (!ports) {
    if (const auto it = found.metadata.find(kPortsKey); it != found.metadata.end()) {
      ports = ports_from_label(it->second);
    }
  }
  // A paused sandbox's execd is frozen (docker pause): its /ping would wait out the budget. Only
  // its endpoint is fetched; the handle knows it paused and refuses commands until resumed.
  std::string step;
  auto endpoint =
      connect_execd(sandbox_id, seconds_ms(config_.create.connect_attempt_timeout_s),
                    config_.create.skip_health_check || status == sdk::SandboxStatus::paused, false,
                    step, cancel);
  auto box = std::make_unique<OpenSandbox>(sandbox_id, std::move(endpoint), workdir,
                                           ports.value_or(std::vector<uint16_t>{}));
  box->set_paused(status == sdk::SandboxStatus::paused);
  sdk::Connected out;
  out.sandbox = std::move(box);
  out.workdir = workdir;
  out.ports = ports.value_or(std::vector<uint16_t>{});
  return out;
}

int64_t OpenSandboxProvider::renew(sdk::Sandbox& sandbox, int64_t expires_at_unix_ms,
                                   const sdk::CancelToken& cancel) {
  // Idempotent (it sets an absolute expiry): retried as status is.
  int64_t granted = 0;
  sdk::retry(
      config_.operations.retry_policy(),
      [&] {
        granted = lifecycle_.renew(sandbox.id(), expires_at_unix_ms, request_timeout(), cancel);
      },
      cancel);
  return granted;
}

}  // namespace sbx::opensandbox

SBX_PLUGIN("opensandbox", "0.1.0",
           "Sandboxes of an OpenSandbox server, through its lifecycle and execd HTTP APIs",
           sbx::sdk::factory<sbx::opensandbox::OpenSandboxProvider>())
