#include "provider.hpp"

#include "archive.hpp"
#include "containers.hpp"
#include "exec.hpp"
#include "lifecycle.hpp"
#include "policy.hpp"

#include <sbx/sdk/probe.hpp>
#include <sbx/sdk/time.hpp>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <variant>

namespace sbx::local_docker {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

// After a command died past its sandbox's expiry: how long the container may take to stop for the
// death to count as the TTL's.
constexpr milliseconds kTtlStopWait = 2s;
// The farthest renew takes: the longest TTL a create takes (2^31 - 1 s, about 68 years).
constexpr int64_t kMaxRenewAheadMs = int64_t{2147483647} * 1000;
// A sandbox's shell when its image has none (`sh` cannot be started): command lines fail at once
// saying so, argv commands run (ExecRequest::argv). Not a program name anyone has.
constexpr std::string_view kNoShell = "<no shell>";
// Bound on the `command -v bash` exec that picks a sandbox's shell.
constexpr milliseconds kShellProbeTimeout = 10s;
// Room in the pool for everything that is not an exec: execs beyond exec.concurrency wait on the
// semaphore on their own pool thread, so status, close and file transfers never queue behind them.
constexpr size_t kPoolThreads = 4096;

// Enough connections that nothing waits for one: an exec holds one (its stream) and a create two
// (the exit watch's long poll and the probe's exec), plus room for status, close, inspect, files.
int64_t max_connections(const Config& config) {
  return std::min<int64_t>(config.exec.concurrency + 2 * config.create.concurrency + 64, 4096);
}

milliseconds to_ms(double seconds) {
  return sdk::seconds_to_ms(seconds);
}

// Docker resolves "root" through /etc/passwd; uid 0 works in every image.
std::optional<std::string> docker_user(const std::optional<std::string>& user) {
  if (user && *user == "root") return std::string("0");
  return user;
}

// The probe also finds the shell, saving an exec per create: after the probe command (in a
// subshell, so its exit status and `exit` keep their meaning) it prints this marker when bash
// exists, and the marker is taken off stdout before the probe's check.
constexpr std::string_view kBashMarker = "\n<sbx-shell:bash>";

std::string with_bash_check(const std::string& command) {
  return "(" + command + "\n); sbx_probe_rc=$?; command -v bash >/dev/null 2>&1 && printf %s '" +
         std::string(kBashMarker) + "'; exit $sbx_probe_rc";
}

bool take_bash_marker(std::string& stdout_text) {
  if (!stdout_text.ends_with(kBashMarker)) return false;
  stdout_text.resize(stdout_text.size() - kBashMarker.size());
  return true;
}

// An exec's output flow until its command through the agent exists (exec_async): a hold asked
// before is kept and applied then.
class FlowSlot {
 public:
  void hold(bool hold) {
    std::lock_guard lock(mutex_);
    held_ = hold;
    command_.hold(hold);
  }
  void set(AgentCommand command) {
    std::lock_guard lock(mutex_);
    command_ = std::move(command);
    if (held_) command_.hold(true);
  }

 private:
  std::mutex mutex_;
  bool held_ = false;
  AgentCommand command_;
};

// Thrown by a probe attempt when the container has stopped: polling it further is pointless.
struct ContainerStopped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Force-removes a container whose create failed somewhere after the create request was sent
// (even a cancelled request may have created it). Removal ignores the caller's cancellation. The
// destructor blocks for at most one request timeout in total (60 s by default), whatever the
// attempts: a daemon that does not answer in that time leaves the container to the TTL reaper
// (with a TTL) or to `sbx reap`, and the failure is logged.
class ContainerGuard {
 public:
  // `dirs`: also removes the sandbox's host directories (after the container).
  ContainerGuard(DockerApi& api, std::string name, const sdk::Logger& log, HostDirs* dirs = nullptr)
      : api_(api), name_(std::move(name)), log_(log), dirs_(dirs) {}
  ContainerGuard(const ContainerGuard&) = delete;
  ContainerGuard& operator=(const ContainerGuard&) = delete;
  ~ContainerGuard() {
    if (state_ == State::dismissed) return;
    remove();
    if (dirs_) dirs_->remove(name_);
  }
  void created() { state_ = State::created; }
  void dismiss() { state_ = State::dismissed; }

 private:
  void remove() {
    const auto deadline = Clock::now() + api_.request_timeout();
    // When the create request got no answer (cancelled, timed out, connection lost) the daemon may
    // still be creating the container: look again a few times.
    const int attempts = state_ == State::created ? 1 : 5;
    for (int i = 0; i < attempts; ++i) {
      if (i > 0) {
        if (Clock::now() + kGuardPause >= deadline) break;
        std::this_thread::sleep_for(kGuardPause);
      }
      try {
        // A fresh token: the create's own may be cancelled already.
        remove_container(api_, name_, sdk::CancelToken(), deadline);
      } catch (const std::exception& e) {
        log_.error("could not remove container ", name_, " after its create failed: ", e.what());
        return;
      }
    }
    log_.debug("removed container ", name_, " of a failed create");
  }

  using Clock = std::chrono::steady_clock;
  static constexpr auto kGuardPause = 400ms;
  enum class State { unknown, created, dismissed };
  DockerApi& api_;
  std::string name_;
  const sdk::Logger& log_;
  HostDirs* dirs_;
  State state_ = State::unknown;
};

int64_t unix_now_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The agent ends the sandbox on the second of its expiry by its own reading of the clock; the
// host's reading a moment later may still be in the second before (time() is a coarse clock).
constexpr int64_t kTtlClockSlackMs = 1000;

// Errors after the container exists become CREATE_FAILED (with the details kept), except those
// whose status says more: cancellation, a failed readiness check, an unreachable daemon, a bad
// request.
sdk::Error create_error(const sdk::Error& e, const std::string& name) {
  switch (e.status()) {
    case SBX_STATUS_CANCELLED:
    case SBX_STATUS_CREATE_FAILED:
    case SBX_STATUS_CREATE_VERIFICATION_FAILED:
    case SBX_STATUS_UNAVAILABLE:
    case SBX_STATUS_INVALID_ARGUMENT:
      return e;
    default:
      break;
  }
  return sdk::Error(SBX_STATUS_CREATE_FAILED,
                    "creating sandbox " + name + " failed: " + std::string(e.what()), e.details());
}

std::string join_ports(const std::vector<uint16_t>& ports) {
  std::string out;
  for (uint16_t port : ports)
    out += (out.empty() ? "" : ", ") + std::to_string(port);
  return out.empty() ? "none" : out;
}

// Why a container stopped during startup: its exit code (from the watch; the container may be
// gone already when it has a TTL), the runtime's error and the container's last output, if any.
// The hint that an entrypoint must keep running is given only when nothing says the process could
// not even start (a runtime error, or runc's "exec <path>: <reason>" such as "argument list too
// long" for an environment the kernel refuses).
std::string stop_reason(DockerApi& api, const std::string& name, const ExitWatch& watch,
                        const std::string& keepalive_shell) {
  std::string reason = "its main process exited";
  const auto code = watch.exit_code(2s);
  if (code) reason += " with exit code " + std::to_string(*code);
  std::string runtime_error;
  try {
    const auto inspect = inspect_container(api, name, sdk::CancelToken());
    const auto* state = inspect.if_contains("State");
    if (const auto* error =
            state && state->is_object() ? state->get_object().if_contains("Error") : nullptr;
        error && error->is_string()) {
      runtime_error = std::string(error->get_string());
    }
  } catch (const sdk::Error&) {  // removed already (AutoRemove)
  }
  if (!runtime_error.empty()) reason += ": " + runtime_error;
  const std::string output = container_output_tail(api, name, 5);
  if (!output.empty()) reason += "; its last output: " + output;
  const bool not_started = !runtime_error.empty() ||
                           output.find("argument list too long") != std::string::npos ||
                           (output.starts_with("exec ") && output.find(": ") != std::string::npos);
  if (not_started) return reason;
  // 127 is "not found" from Docker's init and from shells: the image lacks the program.
  if (code == 127 && output.empty()) {
    return reason +
           " (a program it needs is not in the image: the entrypoint's, or with Docker "
           "exec the keep-alive shell " +
           keepalive_shell + ", create.keepalive_shell; the agent needs none)";
  }
  return reason + " (an entrypoint must keep running; without one the keep-alive does)";
}

}  // namespace

// ---- Semaphore ---------------------------------------------------------------------------------

void Semaphore::acquire(const sdk::CancelToken& cancel) {
  std::unique_lock lock(mutex_);
  if (!available_.wait(lock, cancel, [this] { return count_ > 0; })) throw sdk::Error::cancelled();
  --count_;
}

void Semaphore::release() {
  {
    std::lock_guard lock(mutex_);
    ++count_;
  }
  available_.notify_one();
}

// ---- Provider ----------------------------------------------------------------------------------

LocalDockerProvider::LocalDockerProvider(const sdk::ProviderContext& context,
                                         const boost::json::object& config)
    : config_(Config::parse(config, std::getenv("DOCKER_HOST"))),
      log_(context.log),
      api_(ApiOptions{.socket = config_.socket,
                      .api_version = config_.api_version,
                      .request_timeout = to_ms(config_.request_timeout_s),
                      .max_connections = static_cast<long>(max_connections(config_))},
           log_),
      exec_slots_(config_.exec.concurrency),
      dirs_(config_.agent_dir),
      agent_client_(config_.agent ? std::make_unique<AgentClient>(log_) : nullptr),
      create_slots_(config_.create.concurrency),
      reaper_(api_, config_.reaper, config_.socket, log_) {}

milliseconds LocalDockerProvider::start_timeout() const {
  return to_ms(config_.create.start_timeout_s);
}

std::unique_ptr<sdk::Sandbox> LocalDockerProvider::create(const sdk::Spec& spec,
                                                          const sdk::CancelToken& cancel) {
  const auto started = Clock::now();
  if (!spec.image) {
    throw sdk::Error::invalid_argument("spec.image is required for the local_docker provider");
  }
  // Everything that can be refused is checked before the daemon sees anything.
  const ImageRef image = parse_image(*spec.image);
  refuse_host_options(spec.provider_options);
  SandboxOptions options = SandboxOptions::parse(spec.provider_options);
  apply_host_policy(config_.create, spec, options);
  const std::optional<int64_t> expires_at = expiry_of(spec);
  container_config(config_, spec, options, image, expires_at, true);
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& file : spec.files) {
    files.emplace_back(container_path(file.path, spec.workdir), file.contents);
  }
  const Semaphore::Slot slot(create_slots_, cancel);

  std::string image_user =
      ensure_image(api_, image, options.image_pull_policy.value_or(config_.image_pull_policy),
                   options.registry_auth, start_timeout(), log_, cancel);
  if (is_root_user(image_user)) image_user.clear();

  // Before the container exists: a host that dies from now on leaves nothing past its TTL, also
  // a container it created but never started (which the TTL watchdog inside cannot end).
  if (spec.ttl) reaper_.ensure(cancel);

  const std::string name = config_.create.name_prefix + random_hex(12);
  // The host keeps the agent's socket directory and the expiry where the sandbox cannot write
  // (host_dirs.hpp), made before the container that mounts them.
  const bool host_dirs = agent_client_ || expires_at;
  if (host_dirs) {
    std::call_once(swept_, [&] {
      const size_t removed = dirs_.sweep();
      if (removed > 0) log_.debug("removed the host directories of ", removed, " ended sandboxes");
    });
    dirs_.make(name, agent_client_ != nullptr, expires_at);
  }
  ContainerGuard guard(api_, name, log_, host_dirs ? &dirs_ : nullptr);
  std::optional<AgentLaunch> agent;
  std::string socket;
  if (agent_client_) {
    // The image's user, when not root, is the agent's to switch to (AgentLaunch::user).
    agent = AgentLaunch{dirs_.binary(), dirs_.run_dir(name), image_user};
    socket = dirs_.socket(name);
  }
  try {
    std::string container_id;
    try {
      container_id = create_container_for(name, spec, options, image, expires_at,
                                          expires_at ? dirs_.ttl_dir(name) : "",
                                          agent ? &*agent : nullptr, cancel);
      guard.created();
    } catch (const sdk::Error& e) {
      if (e.http_status() != 0) guard.dismiss();  // the daemon answered: nothing was created
      throw;
    }
    // Before the start: no exec needed, parents created by the daemon, in place for the entrypoint.
    if (!files.empty()) upload_files(api_, name, files, cancel);
    std::string shell = start_and_probe(name, socket, spec, cancel);
    guard.dismiss();
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
    log_.debug("sandbox ", name, " ready (image ", image.name, ", shell ", shell,
               agent ? ", agent" : ", Docker exec", ") in ", ms.count(), " ms");
    auto box = std::make_unique<DockerSandbox>(
        name, std::move(container_id), std::move(shell), spec.workdir, spec.ports, expires_at,
        expires_at.has_value(), socket, agent ? agent->user : "");
    if (agent) box->set_agent_is_root(true);  // made so above: nothing to ask before a transfer
    return box;
  } catch (const sdk::Error& e) {
    throw create_error(e, name);
  }
}

std::string LocalDockerProvider::create_container_for(
    const std::string& name, const sdk::Spec& spec, const SandboxOptions& options,
    const ImageRef& image, std::optional<int64_t> expires_at, const std::string& ttl_dir,
    const AgentLaunch* agent, const sdk::CancelToken& cancel) {
  try {
    return create_container(
        api_, name,
        container_config(config_, spec, options, image, expires_at, true, ttl_dir, agent), log_,
        cancel);
  } catch (const sdk::Error& e) {
    // The daemon does not see the host directories: it is not on this machine.
    if (!ttl_dir.empty() && std::string_view(e.what()).find("bind source path does not exist") !=
                                std::string_view::npos) {
      throw sdk::Error::failed_precondition(
          "the Docker daemon does not see this machine's " + config_.agent_dir + " (" + e.what() +
          "): a sandbox with a TTL keeps its expiry there, where it cannot rewrite it, so it "
          "needs the daemon on this machine (decision 251)");
    }
    if (!spec.resources.disk_gib || !is_storage_opt_unsupported(e)) throw;
    const std::string disk = std::to_string(*spec.resources.disk_gib);
    if (config_.create.disk_limit == DiskLimitMode::error) {
      throw sdk::Error::invalid_argument(
          "resources.disk_gib=" + disk + " cannot be enforced by this Docker daemon's storage " +
          "driver; set create.disk_limit to \"warn\" in the local_docker config to create " +
          "sandboxes without a disk limit (" + std::string(e.what()) + ")");
    }
    log_.warn("resources.disk_gib=", disk, " is not enforced for sandbox ", name,
              ": the storage driver cannot limit container size (create.disk_limit is \"warn\")");
    return create_container(
        api_, name,
        container_config(config_, spec, options, image, expires_at, false, ttl_dir, agent), log_,
        cancel);
  }
}

std::string LocalDockerProvider::start_and_probe(const std::string& name, const std::string& socket,
                                                 const sdk::Spec& spec,
                                                 const sdk::CancelToken& cancel) {
  std::optional<Clock::time_point> ready_deadline;
  milliseconds timeout = start_timeout();
  if (spec.ready_timeout) {
    const milliseconds ready = std::min(*spec.ready_timeout, kNoTimeout);
    ready_deadline = Clock::now() + ready;
    timeout = std::min(timeout, ready);
  }
  const ExitWatch watch(api_, name, cancel);
  try {
    start_container(api_, name, timeout, cancel);
  } catch (const sdk::Error& e) {
    if (e.status() != SBX_STATUS_TIMEOUT) throw;
    throw sdk::Error::create_failed(
        "sandbox " + name + " did not start within " + std::to_string(timeout.count()) + " ms",
        true);
  }
  try {
    if (!socket.empty()) {
      wait_for_agent(name, socket, watch, ready_deadline.value_or(Clock::now() + timeout), cancel);
    }
    const std::optional<bool> has_bash = probe(name, socket, ready_deadline, cancel);
    std::string shell = resolve_shell(name, socket, has_bash, cancel, /*during_create=*/true);
    // A main process that exited meanwhile (an entrypoint that ends at once) is not ready.
    if (watch.exit_code(0ms)) throw ContainerStopped("its main process exited");
    return shell;
  } catch (const ContainerStopped&) {
    throw sdk::Error::create_failed("sandbox " + name + " stopped before it was ready: " +
                                    stop_reason(api_, name, watch, config_.create.keepalive_shell));
  }
}

std::optional<bool> LocalDockerProvider::probe(const std::string& name, const std::string& socket,
                                               std::optional<Clock::time_point> ready_deadline,
                                               const sdk::CancelToken& cancel) {
  sdk::ProbeConfig probe = config_.probe;
  if (!probe.command) return std::nullopt;
  // With the agent, the sandbox is ready once its agent answers (wait_for_agent), unless the
  // operator asked for a probe: the default probe is a command line, and an image may have no
  // shell.
  if (!socket.empty() && !config_.probe_configured) return std::nullopt;
  if (ready_deadline) {
    // spec.ready_timeout bounds start and probe together: the probe gets what is left.
    const double left = std::chrono::duration<double>(*ready_deadline - Clock::now()).count();
    if (left <= 0) {
      throw sdk::Error::create_verification_failed("sandbox " + name +
                                                   " was not ready within spec.ready_timeout");
    }
    probe.deadline_s = std::min(left, probe.deadline_s.value_or(probe.timeout_s));
  }
  const std::string shell = config_.exec.shell.value_or("sh");
  const bool detect = !config_.exec.shell;
  std::optional<bool> has_bash;
  sdk::run_readiness_probe(
      probe, name,
      [&](milliseconds timeout) {
        ExecParams params;
        params.argv = {shell, "-c", detect ? with_bash_check(*probe.command) : *probe.command};
        params.timeout = timeout;
        CollectingSink sink;
        sdk::ExitStatus status;
        try {
          status = run_command(name, socket, std::nullopt, params, sink, cancel);
        } catch (const sdk::Error& e) {
          if (e.status() == SBX_STATUS_NOT_FOUND || e.status() == SBX_STATUS_FAILED_PRECONDITION) {
            throw ContainerStopped(e.what());
          }
          throw;
        }
        if (detect) has_bash = take_bash_marker(sink.stdout_text);
        return sdk::ProbeAttempt{status.return_code, std::move(sink.stdout_text),
                                 std::move(sink.stderr_text)};
      },
      cancel);
  return has_bash;  // from the attempt that passed
}

std::string LocalDockerProvider::resolve_shell(const std::string& name, const std::string& socket,
                                               std::optional<bool> has_bash,
                                               const sdk::CancelToken& cancel, bool during_create) {
  if (config_.exec.shell) return *config_.exec.shell;
  if (has_bash) return *has_bash ? "bash" : "sh";
  try {
    ExecParams params;
    params.argv = {"sh", "-c", "command -v bash"};
    params.timeout = kShellProbeTimeout;
    CollectingSink sink;
    const sdk::ExitStatus status = run_command(name, socket, std::nullopt, params, sink, cancel);
    // `sh` itself could not be started: the image has no shell.
    if (status.error_type == SBX_EXEC_ERROR_SANDBOX) return std::string(kNoShell);
    return status.return_code == 0 && !status.error_type ? "bash" : "sh";
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_CANCELLED) throw;
    // During a create, a container that is gone or stopped is not ready (ContainerStopped).
    if (during_create &&
        (e.status() == SBX_STATUS_NOT_FOUND || e.status() == SBX_STATUS_FAILED_PRECONDITION)) {
      throw ContainerStopped(e.what());
    }
    log_.debug("shell detection in ", name, " failed (using sh): ", e.what());
    return "sh";
  }
}

sdk::ExitStatus LocalDockerProvider::exec(sdk::Sandbox& sandbox, const sdk::ExecRequest& request,
                                          sdk::OutputSink& out, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  if (box.paused()) {  // paused by this handle or when it connected: is it still?
    if (container_status(api_, box.container(), cancel) == sdk::SandboxStatus::paused) {
      throw sdk::Error::failed_precondition("sandbox " + box.container() +
                                            " is paused; resume it first");
    }
    box.set_paused(false);
  }
  const std::string shell = request.argv.empty() ? shell_of(box, cancel) : std::string();
  if (const auto refused = needs_shell(box, shell, request, out)) return *refused;
  if (agent_client_ && !box.agent_socket().empty()) {
    return run_command(box.container(), box.agent_socket(), box.expires_at(),
                       exec_params(box, shell, request), out, cancel);
  }
  const Semaphore::Slot slot(exec_slots_, cancel);
  const ExecParams params = exec_params(box, shell, request);
  const auto started_at = std::chrono::system_clock::now();
  sdk::ExitStatus status;
  bool started = false;
  try {
    status = run_exec(api_, box.container(), params, out, log_, cancel, &started);
  } catch (const sdk::Error& e) {
    // No exec could be made: the container is gone (404) or no longer runs (409 "is not
    // running", as after its TTL, before AutoRemove): NOT_FOUND, as for any sandbox that is gone.
    if (!started && (e.http_status() == 404 ||
                     (e.http_status() == 409 && std::string_view(e.what()).find("is not running") !=
                                                    std::string_view::npos))) {
      throw sdk::Error::sandbox_gone("sandbox " + box.container() + " no longer exists (" +
                                     e.what() + ")");
    }
    if (e.status() == SBX_STATUS_FAILED_PRECONDITION && e.http_status() == 409 &&
        std::string_view(e.what()).find("paused") != std::string_view::npos) {
      throw sdk::Error::failed_precondition("sandbox " + box.container() +
                                            " is paused; resume it first");
    }
    // The exec went with its container (the daemon forgets the exec of a removed container).
    if (e.status() != SBX_STATUS_CANCELLED) {
      if (auto gone = ended_under_command(box, started_at, cancel)) throw *gone;
    }
    throw;
  }
  // A container's end kills every process in it (SIGKILL): a command killed by a signal may have
  // died with its sandbox, and then it has no result.
  if (!status.error_type && status.return_code >= 128) {
    if (auto gone = ended_under_command(box, started_at, cancel)) throw *gone;
  }
  return status;
}

std::optional<sdk::Error> LocalDockerProvider::ended_under_command(
    const DockerSandbox& box, std::chrono::system_clock::time_point since,
    const sdk::CancelToken& cancel) {
  const std::string& name = box.container();
  // The keep-alive or the watchdog ends the container at or after expires_at (it starts with the
  // container, and the expiry was taken from a clock rounded down at create).
  const auto expires_at = box.expires_at();
  const bool past_expiry = expires_at && unix_now_ms() + kTtlClockSlackMs >= *expires_at * 1000;
  bool gone = false;
  try {
    gone = container_status(api_, name, cancel) == sdk::SandboxStatus::stopped;
    // Still "running": the daemon records a container's end some time after its processes died
    // (tens of ms, more under load), and may pass on the command's exit first. Whether it is
    // ending: its expiry has passed, or the daemon logged a kill (a close, `docker rm -f`, the
    // reaper, `docker stop` or `kill`) or its end since the command started. Then wait
    // (briefly) for it to stop, rather than look at its state once.
    if (!gone && (past_expiry || container_event_since(box, since, cancel))) {
      http::Request wait;
      wait.method = "POST";
      wait.target = "/containers/" + name + "/wait?condition=not-running";
      wait.timeout = kTtlStopWait;
      const http::Response response = api_.send(std::move(wait), cancel);
      gone = response.status == 200 || response.status == 404;
    }
  } catch (const sdk::Error& e) {
    if (e.status() == SBX_STATUS_CANCELLED) throw;
    // Still running after kTtlStopWait, or the daemon cannot tell: the command's own outcome.
    log_.debug("sandbox ", name, ": whether it ended under a command is not known: ", e.what());
    return std::nullopt;
  }
  if (!gone) return std::nullopt;
  if (past_expiry) return sandbox_expired(name, *expires_at);
  return sdk::Error::sandbox_gone("sandbox " + name +
                                  " no longer exists: it was closed, removed or stopped while the "
                                  "command ran, and the command was killed with it");
}

bool LocalDockerProvider::container_event_since(const DockerSandbox& box,
                                                std::chrono::system_clock::time_point since,
                                                const sdk::CancelToken& cancel) {
  // The daemon's log of past events (GET /events with an `until` already past answers at once,
  // from the events it keeps), filtered on this container and the events of its end.
  auto seconds = [](std::chrono::system_clock::time_point t) {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    char text[48];
    std::snprintf(text, sizeof text, "%lld.%09lld", static_cast<long long>(ns / 1'000'000'000),
                  static_cast<long long>(ns % 1'000'000'000));
    return std::string(text);
  };
  const std::string& container = box.container_id().empty() ? box.container() : box.container_id();
  const json::object filters{{"type", json::array{"container"}},
                             {"container", json::array{container}},
                             {"event", json::array{"kill", "die", "destroy"}}};
  http::Request request;
  request.target = "/events?since=" + seconds(since - std::chrono::seconds(1)) +
                   "&until=" + seconds(std::chrono::system_clock::now()) +
                   "&filters=" + http::url_encode(json::serialize(filters));
  request.timeout = kTtlStopWait;
  const http::Response response = api_.send(std::move(request), cancel);
  if (response.status != 200) {
    throw api_error(response.status, response.body,
                    "reading the events of sandbox " + box.container());
  }
  return response.body.find('{') != std::string::npos;  // one JSON object per event
}

bool LocalDockerProvider::takes_exec(sdk::Sandbox& sandbox) {
  // A paused one goes to the pool, where exec() asks the daemon whether it still is.
  const auto& box = static_cast<DockerSandbox&>(sandbox);
  return agent_client_ && !box.agent_socket().empty() && !box.shell().empty() && !box.paused();
}

void LocalDockerProvider::exec_async(sdk::Sandbox& sandbox, sdk::ExecRequest request,
                                     sdk::ExecCompletion done) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  sdk::OutputSink& out = done.output();
  const sdk::CancelToken cancel = done.cancel_token();
  if (const auto refused = needs_shell(box, box.shell(), request, out)) {
    return done.succeed(*refused);
  }
  // The host may hold the output (sbx.flow/1) before the command's stream exists: the slot
  // keeps the hold and hands it on.
  auto flow = std::make_shared<FlowSlot>();
  done.on_hold([flow](bool hold) { flow->hold(hold); });
  auto completion = std::make_shared<sdk::ExecCompletion>(std::move(done));
  flow->set(start_agent_exec(
      box.container(), box.agent_socket(), box.expires_at(), exec_params(box, box.shell(), request),
      out,
      [completion](const sdk::ExitStatus* status, const sdk::Error* error) {
        if (status) return completion->succeed(*status);
        completion->fail(*error);
      },
      cancel));
}

std::string LocalDockerProvider::shell_of(DockerSandbox& box, const sdk::CancelToken& cancel) {
  std::string shell = box.shell();
  if (shell.empty()) {  // a connected sandbox: find out once (two first execs may both look)
    shell = resolve_shell(box.container(), box.agent_socket(), std::nullopt, cancel);
    box.set_shell(shell);
  }
  return shell;
}

std::optional<sdk::ExitStatus> LocalDockerProvider::needs_shell(const DockerSandbox& box,
                                                                const std::string& shell,
                                                                const sdk::ExecRequest& request,
                                                                sdk::OutputSink& out) const {
  if (!request.argv.empty() || shell != kNoShell) return std::nullopt;
  out.write(sdk::StdStream::err,
            "sbx: sandbox " + box.container() +
                " has no shell (its image has no sh): a command line needs one; run the "
                "program with its arguments instead (an argv exec runs without a shell)\n");
  return sdk::ExitStatus::sandbox_failure();
}

ExecParams LocalDockerProvider::exec_params(const DockerSandbox& box, const std::string& shell,
                                            const sdk::ExecRequest& request) const {
  ExecParams params;
  if (request.argv.empty()) {
    params.argv = {shell, "-c", request.command};
  } else {
    params.argv = request.argv;  // no shell: the image may have none
  }
  params.env = request.env;
  params.cwd = request.cwd;
  params.user = docker_user(request.user);
  if (!params.user && !box.default_user().empty()) params.user = box.default_user();
  params.timeout = request.timeout.value_or(to_ms(config_.exec.default_timeout_s));
  return params;
}

AgentCommand LocalDockerProvider::start_agent_exec(const std::string& name,
                                                   const std::string& socket,
                                                   std::optional<int64_t> expires_at,
                                                   const ExecParams& params, sdk::OutputSink& out,
                                                   AgentDoneFn done,
                                                   const sdk::CancelToken& cancel) {
  if (const auto message = oversized_argument(params)) {  // as the Docker exec path says it
    out.write(sdk::StdStream::err, *message);
    const auto failure = sdk::ExitStatus::sandbox_failure();
    done(&failure, nullptr);
    return {};
  }
  return agent_client_->start(
      socket, name, params, out,
      [done = std::move(done), expires_at, name](const sdk::ExitStatus* status,
                                                 const sdk::Error* error) {
        // A result, or an error the agent's answer made (NOT_FOUND when the sandbox expired under
        // the command: the agent killed it and said so).
        if (status || error->status() != SBX_STATUS_UNAVAILABLE) return done(status, error);
        // Past its expiry the sandbox is being reaped: whatever its socket's state (an agent that
        // ended at its expiry removes it), the command has no sandbox. NOT_FOUND.
        const bool expired_now =
            expires_at && unix_now_ms() + kTtlClockSlackMs >= *expires_at * 1000;
        if (expired_now && route_refused(*error)) {
          const auto expired = sandbox_expired(name, *expires_at);
          return done(nullptr, &expired);
        }
        // Its socket's path was changed from inside: it is there, and unreachable.
        if (route_refused(*error)) {
          const auto refused = unreachable(name, *error);
          return done(nullptr, &refused);
        }
        // Nothing reached the agent: the sandbox is gone (or stopped), as for Docker exec's 404.
        if (!error->may_have_run()) {
          const auto gone = sdk::Error::sandbox_gone("sandbox " + name + " no longer exists (" +
                                                     error->what() + ")");
          return done(nullptr, &gone);
        }
        // The agent went away with the command, without its end: the sandbox ended (closed,
        // removed, or reaped at its expiry). NOT_FOUND either way: the command has no result.
        if (expired_now) {
          const auto expired = sandbox_expired(name, *expires_at);
          return done(nullptr, &expired);
        }
        const auto ended = sdk::Error::sandbox_gone("sandbox " + name + " no longer answers (" +
                                                    error->what() + ")");
        done(nullptr, &ended);
      },
      cancel);
}

sdk::ExitStatus LocalDockerProvider::run_command(const std::string& name, const std::string& socket,
                                                 std::optional<int64_t> expires_at,
                                                 const ExecParams& params, sdk::OutputSink& out,
                                                 const sdk::CancelToken& cancel) {
  if (socket.empty()) return run_exec(api_, name, params, out, log_, cancel);
  // The error crosses threads as a value, thrown here: an exception object shared through a
  // promise is freed by whichever thread drops it last, under a reference count ThreadSanitizer
  // cannot see (libstdc++ is not instrumented).
  std::promise<std::variant<sdk::ExitStatus, sdk::Error>> result;
  start_agent_exec(
      name, socket, expires_at, params, out,
      [&result](const sdk::ExitStatus* status, const sdk::Error* error) {
        if (status) return result.set_value(*status);
        result.set_value(*error);
      },
      cancel);
  auto outcome = result.get_future().get();
  if (const auto* error = std::get_if<sdk::Error>(&outcome)) throw *error;
  return std::get<sdk::ExitStatus>(outcome);
}

void LocalDockerProvider::wait_for_agent(const std::string& name, const std::string& socket,
                                         const ExitWatch& watch, Clock::time_point deadline,
                                         const sdk::CancelToken& cancel) {
  // The agent binds its socket within a millisecond or so of the start; no event tells the host.
  auto pause = 1ms;
  for (;;) {
    sdk::throw_if_cancelled(cancel);
    if (agent_client_->ping(socket, 1s)) return;
    if (watch.exit_code(0ms)) throw ContainerStopped("its main process exited");
    if (Clock::now() >= deadline) {
      throw sdk::Error::create_verification_failed(
          "sandbox " + name + ": its agent did not answer on " + socket + " in time");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<milliseconds>(pause * 2, 50ms);
  }
}

namespace {

// Runs `files` (a transfer through the agent of sandbox `name`); an agent that cannot be reached
// means what the Engine API's 404 means: the sandbox is gone (or stopped).
template <class Files>
void through_agent(const std::string& name, Files&& files) {
  try {
    files();
  } catch (const sdk::Error& e) {
    if (e.status() != SBX_STATUS_UNAVAILABLE) throw;
    if (route_refused(e)) throw unreachable(name, e);
    throw sdk::Error::sandbox_gone(
        "sandbox " + name + (e.may_have_run() ? " no longer answers (" : " no longer exists (") +
        e.what() + ")");
  }
}

}  // namespace

bool LocalDockerProvider::files_through_agent(DockerSandbox& box, const sdk::CancelToken& cancel) {
  if (box.agent_socket().empty() || box.paused()) return false;
  if (const auto root = box.agent_is_root()) return *root;
  bool root = false;
  through_agent(box.container(),
                [&] { root = agent_client_->runs_as_root(box.agent_socket(), cancel); });
  box.set_agent_is_root(root);
  return root;
}

void LocalDockerProvider::upload(sdk::Sandbox& sandbox, const sdk::UploadRequest& request,
                                 sdk::ByteSource& source, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  const std::string path = container_path(request.remote_path, box.workdir());
  if (files_through_agent(box, cancel)) {
    return through_agent(box.container(), [&] {
      agent_client_->upload(box.agent_socket(), box.container(), path, request.mode, source,
                            cancel);
    });
  }
  require_running(api_, box.container(), cancel);  // the daemon would write, then not rename
  upload_file(api_, box.container(), path, request.mode, source, log_, cancel);
}

void LocalDockerProvider::download(sdk::Sandbox& sandbox, const std::string& remote_path,
                                   sdk::ByteSink& sink, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  const std::string path = container_path(remote_path, box.workdir());
  if (files_through_agent(box, cancel)) {
    return through_agent(box.container(), [&] {
      agent_client_->download(box.agent_socket(), box.container(), path, sink, cancel);
    });
  }
  require_running(api_, box.container(), cancel);
  download_file(api_, box.container(), path, sink, cancel);
}

sdk::SandboxStatus LocalDockerProvider::status(sdk::Sandbox& sandbox,
                                               const sdk::CancelToken& cancel) {
  return container_status(api_, static_cast<DockerSandbox&>(sandbox).container(), cancel);
}

void LocalDockerProvider::close(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  box.terminals().clear();  // their attachments end (NOT_FOUND) before the container goes
  box.exec_terminals().clear();
  remove_container(api_, box.container(), cancel);
  // Ours by its name only (a label is not trusted with a path to delete).
  dirs_.remove(box.container());
}

// ---- sbx.pty/1 (sdk::ExecdTerminal through the agent, ExecTerminal without it)
// ------------------------------------------------------------------

namespace {

sdk::ExecdPlace agent_place(const DockerSandbox& box) {
  return {.endpoint = {.unix_socket = box.agent_socket(), .follow_links = false}};
}

DockerSandbox& terminal_box(sdk::Sandbox& sandbox) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  if (box.paused()) {
    throw sdk::Error::failed_precondition("sandbox " + box.id() + " is paused");
  }
  return box;
}

}  // namespace

std::string LocalDockerProvider::open_pty(sdk::Sandbox& sandbox, const sdk::PtyRequest& request,
                                          const sdk::CancelToken& cancel) {
  DockerSandbox& box = terminal_box(sandbox);
  if (box.agent_socket().empty()) {
    const std::string shell = shell_of(box, cancel);
    std::optional<std::string> user = docker_user(request.user);
    if (!user && !box.default_user().empty()) user = box.default_user();
    sdk::PtyRequest exec_request = request;
    if (!exec_request.cwd) exec_request.cwd = box.workdir();
    auto made = std::make_shared<ExecTerminal>(api_, box.container(), shell, exec_request, user,
                                               log_, cancel);
    const std::string id = made->id();
    box.exec_terminals().add(std::move(made));
    return id;
  }
  json::object body{{"rows", request.rows}, {"cols", request.cols}};
  if (request.command) body["command"] = *request.command;
  if (const auto cwd = request.cwd ? request.cwd : box.workdir()) body["cwd"] = *cwd;
  if (!request.env.empty()) {
    json::object envs;
    for (const auto& [k, v] : request.env)
      envs[k] = v;
    body["envs"] = std::move(envs);
  }
  const std::string user = request.user.value_or(box.default_user());
  if (!user.empty()) body["user"] = user;
  const std::string id = agent_client_->open_pty(box.agent_socket(), json::serialize(body), cancel);
  try {
    box.terminals().add(
        std::make_shared<sdk::ExecdTerminal>(agent_place(box), id, request.tty, log_));
  } catch (...) {
    try {
      agent_client_->delete_pty(box.agent_socket(), id, sdk::CancelToken());
    } catch (const sdk::Error& e) {
      log_.warn("terminal ", id, " of sandbox ", box.id(), " could not be deleted: ", e.what());
    }
    throw;
  }
  return id;
}

std::shared_ptr<sdk::ExecdTerminal> LocalDockerProvider::terminal(DockerSandbox& box,
                                                                  const std::string& id,
                                                                  bool takeover) {
  if (box.agent_socket().empty()) throw sdk::Error::not_found("terminal " + id + " not found");
  // One this handle does not hold was opened by another process or handle: taken up from the
  // agent, with its replay.
  return box.terminals().find_or(id, [&] {
    return std::make_shared<sdk::ExecdTerminal>(agent_place(box), id,
                                                sdk::ExecdTerminal::TakeUp{takeover}, log_);
  });
}

void LocalDockerProvider::attach_pty(sdk::Sandbox& sandbox, const std::string& id, uint64_t since,
                                     bool takeover, sdk::PtyAttachCompletion done) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  if (box.agent_socket().empty()) {
    box.exec_terminals().get(id)->output().attach(since, takeover, std::move(done));
    return;
  }
  terminal(box, id, takeover)->output().attach(since, takeover, std::move(done));
}

void LocalDockerProvider::write_pty(sdk::Sandbox& sandbox, const std::string& id,
                                    std::string_view input) {
  DockerSandbox& box = terminal_box(sandbox);
  if (box.agent_socket().empty()) return box.exec_terminals().get(id)->write(input);
  terminal(box, id, true)->write(input);
}

void LocalDockerProvider::resize_pty(sdk::Sandbox& sandbox, const std::string& id, uint16_t rows,
                                     uint16_t cols) {
  DockerSandbox& box = terminal_box(sandbox);
  if (box.agent_socket().empty()) return box.exec_terminals().get(id)->resize(rows, cols);
  terminal(box, id, true)->resize(rows, cols);
}

void LocalDockerProvider::close_pty(sdk::Sandbox& sandbox, const std::string& id,
                                    const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  if (box.agent_socket().empty()) {
    const std::shared_ptr<ExecTerminal> gone = box.exec_terminals().take(id);
    gone->output().close();  // a reader still attached ends NOT_FOUND, not with the kill's 137
    gone->kill();
    return;
  }
  // The agent kills what runs on it.
  box.terminals().close(id, [&] { agent_client_->delete_pty(box.agent_socket(), id, cancel); });
}

void LocalDockerProvider::pause(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  box.set_paused(true);  // first: an exec from now on fails rather than wait on a frozen agent
  try {
    pause_container(api_, box.container(), cancel);
  } catch (...) {
    box.set_paused(false);
    throw;
  }
}

void LocalDockerProvider::resume(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  resume_container(api_, box.container(), cancel);
  box.set_paused(false);
}

std::string LocalDockerProvider::serialize(sdk::Sandbox& sandbox, const sdk::CancelToken&) {
  const auto& box = static_cast<DockerSandbox&>(sandbox);
  return make_descriptor(box.container(), box.container_id());
}

sdk::Connected LocalDockerProvider::connect(const std::string& descriptor,
                                            const sdk::CancelToken& cancel) {
  FoundSandbox found = find_sandbox(api_, descriptor, cancel);
  sdk::Connected connected;
  connected.workdir = found.workdir;
  connected.ports = found.ports;
  // Its agent, when it has one in this provider's agent_dir (a label names a path to connect to,
  // never one to trust otherwise); else Docker exec.
  std::string socket;
  if (agent_client_ && !found.agent_run_dir.empty() &&
      found.agent_run_dir == dirs_.run_dir(found.name)) {
    socket = dirs_.socket(found.name);
  }
  // A renew may have moved the expiry past the label: the host's file holds the one in force.
  if (found.has_expiry_file) {
    if (const auto in_file = dirs_.read_expiry(found.name)) found.expires_at = in_file;
  }
  // The shell is found at the first exec (the sandbox may be paused now) unless configured.
  auto box = std::make_unique<DockerSandbox>(
      std::move(found.name), std::move(found.container_id), config_.exec.shell.value_or(""),
      std::move(found.workdir), std::move(found.ports), found.expires_at, found.has_expiry_file,
      socket, std::move(found.agent_user));
  box->set_paused(found.paused);
  if (!socket.empty() && !found.paused && box->shell().empty()) {
    box->set_shell(resolve_shell(box->container(), socket, std::nullopt, cancel));
  }
  connected.sandbox = std::move(box);
  return connected;
}

int64_t LocalDockerProvider::renew(sdk::Sandbox& sandbox, int64_t expires_at_unix_ms,
                                   const sdk::CancelToken& cancel) {
  auto& box = static_cast<DockerSandbox&>(sandbox);
  const int64_t now_ms = unix_now_ms();
  if (expires_at_unix_ms <= now_ms) {
    throw sdk::Error::invalid_argument("the new expiry (" + std::to_string(expires_at_unix_ms) +
                                       " ms since the epoch) is not in the future");
  }
  if (expires_at_unix_ms - now_ms > kMaxRenewAheadMs) {
    throw sdk::Error::invalid_argument("the new expiry is more than 68 years away");
  }
  if (!box.expires_at()) {
    throw sdk::Error::failed_precondition(
        "sandbox " + box.container() + " was created without a TTL: its main process runs until " +
        "it is closed and cannot take an expiry later; create it with a TTL to renew it");
  }
  if (!box.has_expiry_file()) {
    throw sdk::Error::failed_precondition(
        "sandbox " + box.container() + " has no expiry file of the host's (it was made by a " +
        "local_docker before decision 251, whose sandboxes could rewrite theirs), so its expiry " +
        "cannot move");
  }
  // Seconds, rounded up: the resolution of the expiry file, the label and `date +%s`.
  const int64_t expires_at = expires_at_unix_ms / 1000 + (expires_at_unix_ms % 1000 > 0 ? 1 : 0);
  const boost::json::object inspect = inspect_container(api_, box.container(), cancel);
  const auto* state = inspect.if_contains("State");
  const auto* status =
      state && state->is_object() ? state->get_object().if_contains("Status") : nullptr;
  // A std::string: a conditional between json::string and "" would make a temporary json::string,
  // and a string_view of it would dangle.
  const std::string running =
      status && status->is_string() ? std::string(status->get_string()) : std::string();
  if (running != "running" && running != "paused") {
    throw sdk::Error::sandbox_gone("sandbox " + box.container() + " has ended (its container is " +
                                   (running.empty() ? std::string("in no known state") : running) +
                                   ")");
  }
  // The expiry in force may come from another handle's renew: the file, else what we know.
  const int64_t current = dirs_.read_expiry(box.container()).value_or(*box.expires_at());
  if (current * 1000 <= now_ms) {
    throw sdk::Error::sandbox_gone("sandbox " + box.container() +
                                   " has reached its TTL (sbx.expires_at=" +
                                   std::to_string(current) + ") and is being removed");
  }
  dirs_.write_expiry(box.container(), expires_at);
  box.set_expires_at(expires_at);
  log_.debug("sandbox ", box.container(), " renewed: expires at ", expires_at, " (was ", current,
             ")");
  return expires_at * 1000;
}

void LocalDockerProvider::write_startup_files(sdk::Sandbox&, const std::vector<sdk::StartupFile>&,
                                              const sdk::CancelToken&) {}

sdk::ThreadPool::Options LocalDockerProvider::pool_options() const {
  sdk::ThreadPool::Options options;
  options.max_threads =
      std::max<size_t>(kPoolThreads, static_cast<size_t>(config_.exec.concurrency) * 2);
  return options;
}

sdk::Endpoint LocalDockerProvider::endpoint(sdk::Sandbox& sandbox, uint16_t port,
                                            const sdk::CancelToken& cancel) {
  const auto& box = static_cast<DockerSandbox&>(sandbox);
  const auto& ports = box.ports();
  if (std::find(ports.begin(), ports.end(), port) == ports.end()) {
    throw sdk::Error::invalid_argument(
        "Sandbox port " + std::to_string(port) +
        " was not declared in spec.ports (declared: " + join_ports(ports) + ")");
  }
  const auto inspect = inspect_container(api_, box.container(), cancel);
  return endpoint_from_inspect(inspect, port, config_.create.publish_host, box.container());
}

std::vector<sdk::SandboxInfo> LocalDockerProvider::list(const sdk::KeyValues& selector,
                                                        const sdk::CancelToken& cancel) {
  return list_containers(api_, selector, cancel);
}

std::vector<sdk::SandboxInfo> LocalDockerProvider::reap(const sdk::KeyValues& selector,
                                                        const sdk::CancelToken& cancel) {
  std::vector<sdk::SandboxInfo> removed;
  std::string failures;
  size_t failed = 0;
  for (auto& info : list_containers(api_, selector, cancel)) {
    sdk::throw_if_cancelled(cancel);
    try {
      remove_container(api_, info.id, cancel);
      dirs_.remove(info.id);
      info.status = sdk::SandboxStatus::stopped;
      removed.push_back(std::move(info));
    } catch (const sdk::Error& e) {
      if (e.status() == SBX_STATUS_CANCELLED) throw;
      if (++failed <= 3) failures += std::string(failures.empty() ? "" : "; ") + e.what();
    }
  }
  if (failed > 0) {
    log_.warn("reap removed ", removed.size(), " sandboxes; ", failed, " could not be removed");
    throw sdk::Error(SBX_STATUS_INTERNAL,
                     "reap removed " + std::to_string(removed.size()) + " sandboxes but " +
                         std::to_string(failed) + " could not be removed: " + failures,
                     sdk::ErrorDetails{.retryable = true});
  }
  log_.info("reaped ", removed.size(), " sandboxes");
  return removed;
}

}  // namespace sbx::local_docker

SBX_PLUGIN("local_docker", "0.1.0",
           "Sandboxes as containers of the local Docker daemon (Engine API over its unix socket)",
           sbx::sdk::factory<sbx::local_docker::LocalDockerProvider>())
