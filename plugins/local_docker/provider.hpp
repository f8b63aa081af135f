// The local_docker provider: sandboxes are containers of the local Docker daemon, driven through
// the Engine API over its unix socket (never the docker CLI). Blocking style on the SDK's pool.
#pragma once

#include "agent.hpp"
#include "config.hpp"
#include "containers.hpp"
#include "docker_api.hpp"
#include "exec.hpp"
#include "host_dirs.hpp"
#include "images.hpp"
#include "reaper.hpp"
#include "terminal.hpp"

#include <sbx/sdk/blocking.hpp>
#include <sbx/sdk/execd_terminal.hpp>
#include <sbx/sdk/plugin.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sbx::local_docker {

// One sandbox: a container, known by its name (which is also the sandbox id).
class DockerSandbox final : public sdk::Sandbox {
 public:
  DockerSandbox(std::string name, std::string container_id, std::string shell,
                std::optional<std::string> workdir, std::vector<uint16_t> ports,
                std::optional<int64_t> expires_at, bool has_expiry_file,
                std::string agent_socket = "", std::string default_user = "")
      : sdk::Sandbox(std::move(name)),
        container_id_(std::move(container_id)),
        shell_(std::move(shell)),
        workdir_(std::move(workdir)),
        ports_(std::move(ports)),
        expires_at_(expires_at.value_or(kNoExpiry)),
        has_expiry_file_(has_expiry_file),
        agent_socket_(std::move(agent_socket)),
        default_user_(std::move(default_user)) {}

  const std::string& container() const noexcept { return id(); }
  const std::string& container_id() const noexcept { return container_id_; }
  // The shell every command runs with ("<shell> -c <command>"); empty until known: a sandbox
  // reached by connect finds out at its first exec. THREADING: thread-safe.
  std::string shell() const {
    std::lock_guard lock(mutex_);
    return shell_;
  }
  void set_shell(std::string shell) {
    std::lock_guard lock(mutex_);
    shell_ = std::move(shell);
  }
  const std::optional<std::string>& workdir() const noexcept { return workdir_; }
  const std::vector<uint16_t>& ports() const noexcept { return ports_; }
  // The expiry in force as this handle knows it (Unix seconds): set at create or connect, moved by
  // renew. Nothing without a TTL. THREADING: thread-safe.
  std::optional<int64_t> expires_at() const noexcept {
    const int64_t value = expires_at_.load();
    return value == kNoExpiry ? std::nullopt : std::optional<int64_t>(value);
  }
  void set_expires_at(int64_t value) noexcept { expires_at_.store(value); }
  // Whether the container keeps its expiry in the host's expiry file (expiry::kPath mounted from
  // host_dirs.hpp's ttl/), i.e. can be renewed.
  bool has_expiry_file() const noexcept { return has_expiry_file_; }
  // The host path of its agent's socket; empty when its commands go through Docker exec.
  const std::string& agent_socket() const noexcept { return agent_socket_; }
  // Who runs a command that names no user, when not the container's user: the image's USER, for
  // an agent run as root in its place (AgentLaunch::user). Empty: the container's.
  const std::string& default_user() const noexcept { return default_user_; }
  // Paused through this provider (the agent of a paused container cannot answer: an exec must
  // fail at once). THREADING: thread-safe.
  bool paused() const noexcept { return paused_.load(); }
  void set_paused(bool paused) noexcept { paused_.store(paused); }
  // Whether its agent runs as root, once asked (an image's non-root USER runs it as that user).
  // THREADING: thread-safe.
  std::optional<bool> agent_is_root() const noexcept {
    const int value = agent_is_root_.load();
    return value < 0 ? std::nullopt : std::optional<bool>(value == 1);
  }
  void set_agent_is_root(bool root) noexcept { agent_is_root_.store(root ? 1 : 0); }
  // The terminals this handle opened or took up (through its agent). THREADING: thread-safe.
  sdk::ExecdTerminals& terminals() noexcept { return terminals_; }
  // The terminals it opened as Docker execs (without the agent). THREADING: thread-safe.
  ExecTerminals& exec_terminals() noexcept { return exec_terminals_; }

 private:
  std::string container_id_;  // Docker's Id: a descriptor names this container, not only its name
  mutable std::mutex mutex_;
  std::string shell_;
  std::optional<std::string> workdir_;
  std::vector<uint16_t> ports_;
  static constexpr int64_t kNoExpiry = -1;
  std::atomic<int64_t> expires_at_;  // unix seconds of the TTL's end, or kNoExpiry
  bool has_expiry_file_;
  std::string agent_socket_;
  std::string default_user_;
  std::atomic<bool> paused_{false};
  std::atomic<int> agent_is_root_{-1};  // -1 not asked yet
  sdk::ExecdTerminals terminals_;
  ExecTerminals exec_terminals_;
};

// Caps the execs (or creates) in flight. Waiting can be cancelled.
class Semaphore {
 public:
  explicit Semaphore(int64_t count) : count_(count) {}
  // Throws Error::cancelled when `cancel` fires first.
  void acquire(const sdk::CancelToken& cancel);
  void release();

  // One unit, held for a scope.
  class Slot {
   public:
    Slot(Semaphore& semaphore, const sdk::CancelToken& cancel) : semaphore_(semaphore) {
      semaphore_.acquire(cancel);
    }
    ~Slot() { semaphore_.release(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    Semaphore& semaphore_;
  };

 private:
  std::mutex mutex_;
  std::condition_variable_any available_;
  int64_t count_;
};

class LocalDockerProvider final : public sdk::BlockingProvider,
                                  public sdk::BlockingEndpoint,
                                  public sdk::BlockingListReap,
                                  public sdk::BlockingPause,
                                  public sdk::BlockingConnect,
                                  public sdk::BlockingRenew,
                                  public sdk::BlockingShellSessions,
                                  public sdk::BlockingPty,
                                  public sdk::AsyncExec {
 public:
  static constexpr const char* kId = "local_docker";
  static constexpr const char* kDescription =
      "Containers of the local Docker daemon, through the Engine API on its unix socket";
  static constexpr const char* kConfigSchema = kConfigSchemaText;

  // Validates the config; contacts nothing (the daemon is first used by the first operation).
  LocalDockerProvider(const sdk::ProviderContext& context, const boost::json::object& config);

  std::unique_ptr<sdk::Sandbox> create(const sdk::Spec& spec,
                                       const sdk::CancelToken& cancel) override;
  sdk::ExitStatus exec(sdk::Sandbox& sandbox, const sdk::ExecRequest& request, sdk::OutputSink& out,
                       const sdk::CancelToken& cancel) override;
  // A sandbox with an agent runs its commands through it, on the agent client's one loop thread
  // (no thread per running command); the others through exec() on the pool.
  bool takes_exec(sdk::Sandbox& sandbox) override;
  void exec_async(sdk::Sandbox& sandbox, sdk::ExecRequest request,
                  sdk::ExecCompletion done) override;
  void upload(sdk::Sandbox& sandbox, const sdk::UploadRequest& request, sdk::ByteSource& source,
              const sdk::CancelToken& cancel) override;
  void download(sdk::Sandbox& sandbox, const std::string& remote_path, sdk::ByteSink& sink,
                const sdk::CancelToken& cancel) override;
  sdk::SandboxStatus status(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  void close(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;

  // Startup files are already in place: create() writes them into the container before it starts
  // (one archive, no exec needed), so the adapter's later call has nothing to do.
  void write_startup_files(sdk::Sandbox& sandbox, const std::vector<sdk::StartupFile>& files,
                           const sdk::CancelToken& cancel) override;

  sdk::ThreadPool::Options pool_options() const override;

  sdk::Endpoint endpoint(sdk::Sandbox& sandbox, uint16_t port,
                         const sdk::CancelToken& cancel) override;
  std::vector<sdk::SandboxInfo> list(const sdk::KeyValues& selector,
                                     const sdk::CancelToken& cancel) override;
  std::vector<sdk::SandboxInfo> reap(const sdk::KeyValues& selector,
                                     const sdk::CancelToken& cancel) override;

  // sbx.pause/1: the Engine API's pause and unpause.
  void pause(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  void resume(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  // sbx.connect/1: a container name (and Id) is enough; the rest is on its labels.
  std::string serialize(sdk::Sandbox& sandbox, const sdk::CancelToken& cancel) override;
  sdk::Connected connect(const std::string& descriptor, const sdk::CancelToken& cancel) override;
  // sbx.renew/1: rewrites the sandbox's expiry file on the host (host_dirs.hpp; also while
  // paused), which the agent or keep-alive inside and the reaper read. Refused
  // (FAILED_PRECONDITION) for a sandbox without a TTL or without an expiry file of the host's (one
  // made by a local_docker before decision 251); a past expiry is INVALID_ARGUMENT; a sandbox
  // that has ended or reached its expiry NOT_FOUND. Rounds up to whole seconds.
  int64_t renew(sdk::Sandbox& sandbox, int64_t expires_at_unix_ms,
                const sdk::CancelToken& cancel) override;

  // sbx.pty/1 through the sandbox's agent (sdk::ExecdTerminal over its socket, decision 231): a
  // handle holds the terminals it opened or took up; a terminal of another process is taken up
  // from the agent (with its replay) on first use. A sandbox without the agent opens Docker execs
  // with a TTY on a hijacked stream (ExecTerminal, decision 235), reachable from the handle that
  // opened them only.
  std::string open_pty(sdk::Sandbox& sandbox, const sdk::PtyRequest& request,
                       const sdk::CancelToken& cancel) override;
  void attach_pty(sdk::Sandbox& sandbox, const std::string& id, uint64_t since, bool takeover,
                  sdk::PtyAttachCompletion done) override;
  void write_pty(sdk::Sandbox& sandbox, const std::string& id, std::string_view input) override;
  void resize_pty(sdk::Sandbox& sandbox, const std::string& id, uint16_t rows,
                  uint16_t cols) override;
  void close_pty(sdk::Sandbox& sandbox, const std::string& id,
                 const sdk::CancelToken& cancel) override;

 private:
  using Clock = std::chrono::steady_clock;

  // The handle's terminal `id`, or one another process opened, taken up from the agent.
  std::shared_ptr<sdk::ExecdTerminal> terminal(DockerSandbox& box, const std::string& id,
                                               bool takeover);
  // The shell a sandbox's commands run with (found out at the first use after a connect).
  std::string shell_of(DockerSandbox& box, const sdk::CancelToken& cancel);

  std::string create_container_for(const std::string& name, const sdk::Spec& spec,
                                   const SandboxOptions& options, const ImageRef& image,
                                   std::optional<int64_t> expires_at, const std::string& ttl_dir,
                                   const AgentLaunch* agent, const sdk::CancelToken& cancel);
  // Asked when a command's exec (started at `since`) ended without a result of its own (killed
  // by a signal, or the exec vanished): whether its sandbox ended under it (closed by any handle,
  // removed, stopped, expired), i.e. its container is gone or no longer runs. The daemon records
  // a container's end a moment after its processes died: when it still says "running" but the
  // container is ending (past its expiry, or a kill or end logged since `since`), this waits up to
  // kTtlStopWait for it to stop. The error to complete the command with (NOT_FOUND: the
  // sandbox's expiry or its end named), or nothing when the sandbox still runs or the daemon
  // cannot tell (the command's own outcome stands). Cancellation is thrown.
  std::optional<sdk::Error> ended_under_command(const DockerSandbox& box,
                                                std::chrono::system_clock::time_point since,
                                                const sdk::CancelToken& cancel);
  // Whether the daemon logged a kill, an end or a removal of `box`'s container since `since`.
  bool container_event_since(const DockerSandbox& box, std::chrono::system_clock::time_point since,
                             const sdk::CancelToken& cancel);
  // Start, readiness probe and the shell (exec.shell, or found: bash, sh, or none). `socket`: the
  // agent's, or empty (Docker exec). A main process that exits before all that is CREATE_FAILED
  // with its reason.
  std::string start_and_probe(const std::string& name, const std::string& socket,
                              const sdk::Spec& spec, const sdk::CancelToken& cancel);
  std::optional<bool> probe(const std::string& name, const std::string& socket,
                            std::optional<Clock::time_point> ready_deadline,
                            const sdk::CancelToken& cancel);
  // exec.shell, else bash or sh: from the probe, or from an exec of `command -v bash`.
  std::string resolve_shell(const std::string& name, const std::string& socket,
                            std::optional<bool> has_bash, const sdk::CancelToken& cancel,
                            bool during_create = false);
  // One command, waited for on the calling thread (the probe, shell detection, exec() on the
  // pool): through the agent on `socket` (start_agent_exec) when it is set, else Docker exec.
  sdk::ExitStatus run_command(const std::string& name, const std::string& socket,
                              std::optional<int64_t> expires_at, const ExecParams& params,
                              sdk::OutputSink& out, const sdk::CancelToken& cancel);
  // A command line (no argv) in a sandbox whose image has no shell: 125/"sandbox", saying so on
  // `out`'s stderr. Nothing otherwise.
  std::optional<sdk::ExitStatus> needs_shell(const DockerSandbox& box, const std::string& shell,
                                             const sdk::ExecRequest& request,
                                             sdk::OutputSink& out) const;
  // What Docker exec (or the agent) runs: `shell -c command`, or the request's argv as it is.
  ExecParams exec_params(const DockerSandbox& box, const std::string& shell,
                         const sdk::ExecRequest& request) const;
  // Runs a command through the agent of sandbox `name` on `socket`: `done` once, with the exit
  // status or the error as Docker exec reports it (NOT_FOUND for a sandbox that is gone, also one
  // that ended or expired while the command ran; past `expires_at` the message names the expiry).
  AgentCommand start_agent_exec(const std::string& name, const std::string& socket,
                                std::optional<int64_t> expires_at, const ExecParams& params,
                                sdk::OutputSink& out, AgentDoneFn done,
                                const sdk::CancelToken& cancel);
  // Waits until the agent answers on `socket` (it binds it a moment after the start), or the
  // container's main process exits (ContainerStopped), or `deadline`.
  void wait_for_agent(const std::string& name, const std::string& socket, const ExitWatch& watch,
                      Clock::time_point deadline, const sdk::CancelToken& cancel);
  // Whether `box`'s files go through its agent: it has one, not paused behind this handle (a
  // frozen agent cannot answer; the Engine API refuses at once), and it runs as root (so files are
  // root's, as the archive writes them; asked once per handle). Else the archive path.
  bool files_through_agent(DockerSandbox& box, const sdk::CancelToken& cancel);
  std::chrono::milliseconds start_timeout() const;

  Config config_;
  sdk::Logger log_;
  DockerApi api_;
  Semaphore exec_slots_;
  HostDirs dirs_;  // the agent's binary, and each sandbox's socket and expiry directories
  std::unique_ptr<AgentClient> agent_client_;  // with config.agent
  std::once_flag swept_;
  Semaphore create_slots_;
  Reaper reaper_;  // ensured by the first create with a TTL
};

}  // namespace sbx::local_docker
