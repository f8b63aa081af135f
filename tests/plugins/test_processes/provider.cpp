// test_processes: a provider for tests only. Each sandbox is a private directory on the host and
// each command a host process (/bin/sh -c) in its own process group. There is NO isolation.
//
// It implements the asynchronous sbx::sdk::Provider interface directly (not the blocking adapter),
// so that host tests exercise completion from other threads, completion inside the start call,
// cancellation, streamed output, timeouts and errors. Fault injection comes from its config.
//
// Paths: a sandbox path "/a/b" is "<sandbox dir>/a/b" on the host; a relative path is relative to
// the spec's workdir (or "/"). Paths that would leave the sandbox directory are refused.
//
// ABI 1.1: pause stops the sandbox's process groups (SIGSTOP) and marks the sandbox paused;
// connect finds a sandbox again by its id under the configured root. What a connect needs (the
// spec's workdir, env and ports) and the pause mark live in hidden files in the sandbox directory
// (/.sbx-meta, /.sbx-paused), so another process, or another host object, sees them too.
//
// TTL and sbx.renew/1: the expiry is kept in /.sbx-meta and enforced by whoever looks next: a call
// on a sandbox past its expiry (status, exec, a transfer, connect) ends it first and answers as for
// a sandbox that is gone; a command still running at the expiry is ended then, its exec with
// NOT_FOUND, as one running when the sandbox is closed. A tests-only shortcut: nothing ends an
// expired sandbox while no process uses this provider. Commands run as the host's user: an exec
// with another `user` is UNIMPLEMENTED.
//
// ABI 1.2: sbx.session/1 through sdk::ShellSessions (over this provider's exec); sbx.pty/1 with
// host processes on pseudo-terminals (terminal.hpp), kept by this provider object and reachable
// from any handle to the sandbox in this process.

#include "terminal.hpp"

#include <sbx/abi/ext/connect.h>
#include <boost/json.hpp>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/plugin.hpp>
#include <sbx/sdk/shell_sessions.hpp>
#include <sbx/sdk/thread_pool.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

extern char** environ;

namespace sbx::test_processes {
namespace {

namespace fs = std::filesystem;
using sdk::Error;
using Clock = std::chrono::steady_clock;

std::string errno_text() {
  return std::strerror(errno);
}

struct Config {
  fs::path root;
  std::chrono::milliseconds default_timeout{60'000};
  std::optional<std::string> fail_create;  // create fails with CREATE_FAILED and this message
  std::optional<std::string> fail_create_reason;  // ... and this reason (sbx_error.reason)
  bool fail_probe = false;                        // create fails with CREATE_VERIFICATION_FAILED
  std::optional<std::string> throw_in;  // method that throws std::runtime_error synchronously
  bool complete_inline = false;         // status and close complete inside the start call
  std::chrono::milliseconds create_delay{0};
  std::chrono::milliseconds upload_delay{0};  // before an upload reads its source
  // "init" (the provider's creation from this config), "create" or "exec" (in the call itself,
  // before it returns): that step waits until a writer opens and closes `hang_fifo`, a FIFO the
  // test made (never, when nobody does): a plugin that never returns (tests/core/reload_test.cpp).
  // It writes "<hang_fifo>.hanging" first, for the test to wait on.
  std::optional<std::string> hang_in;
  fs::path hang_fifo;
  // A renew does its work, then creates `<renew_gate>.waiting-<N>` (N counts renews from 1) and
  // completes only once `renew_gate` exists: a test holds a renew's completion back.
  std::optional<std::string> renew_gate;
  // false: sbx.session/1 is not offered (a host's fallback for providers without it is tested).
  bool sessions = true;

  static Config read(const boost::json::object& json) {
    sdk::json::ObjectReader r(json);
    Config c;
    const char* tmp = std::getenv("TMPDIR");
    c.root = r.string("root", tmp && *tmp ? tmp : "/tmp");
    if (auto t = r.number("default_timeout_s", 0, 1e9, true)) {
      c.default_timeout = std::chrono::milliseconds(static_cast<int64_t>(*t * 1000));
    }
    c.fail_create = r.string("fail_create");
    c.fail_create_reason = r.string("fail_create_reason");
    c.fail_probe = r.boolean("fail_probe", false);
    c.throw_in = r.string("throw_in");
    c.complete_inline = r.boolean("complete_inline", false);
    c.create_delay =
        std::chrono::milliseconds(r.integer("create_delay_ms", 0, 600'000).value_or(0));
    c.upload_delay =
        std::chrono::milliseconds(r.integer("upload_delay_ms", 0, 600'000).value_or(0));
    c.hang_in = r.string("hang_in");
    c.hang_fifo = r.string("hang_fifo", "");
    if (c.hang_in && (c.hang_fifo.empty() ||
                      (*c.hang_in != "init" && *c.hang_in != "create" && *c.hang_in != "exec"))) {
      throw Error::invalid_argument(
          "$.hang_in: one of \"init\", \"create\", \"exec\", with \"hang_fifo\"");
    }
    c.renew_gate = r.string("renew_gate");
    c.sessions = r.boolean("sessions", true);
    r.finish();
    return c;
  }
};

class ProcessSandbox final : public sdk::Sandbox {
 public:
  ProcessSandbox(fs::path dir, sdk::Spec spec, int64_t expires_at_unix_ms)
      : sdk::Sandbox(dir.filename().string()),
        dir_(std::move(dir)),
        spec_(std::move(spec)),
        expires_at_unix_ms_(expires_at_unix_ms) {}

  static int64_t unix_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t expires_at_unix_ms() const { return expires_at_unix_ms_.load(); }
  void set_expires_at_unix_ms(int64_t at) { expires_at_unix_ms_.store(at); }
  // Ends the sandbox when its expiry has passed; true when it did (or it had already).
  bool expire_if_due() {
    const int64_t at = expires_at_unix_ms_.load();
    if (at <= 0 || unix_now_ms() < at) return false;
    close();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    return true;
  }

  const fs::path& dir() const { return dir_; }
  const sdk::Spec& spec() const { return spec_; }

  // Maps a sandbox path to the host, refusing paths that leave the sandbox directory.
  fs::path host_path(std::string_view path) const {
    fs::path p(path);
    if (p.is_relative()) p = fs::path(spec_.workdir.value_or("/")) / p;
    fs::path inside = p.relative_path().lexically_normal();
    if (!inside.empty() && *inside.begin() == "..") {
      throw Error::invalid_argument("path " + std::string(path) + " leaves the sandbox");
    }
    return dir_ / inside;
  }

  // Process groups of running commands, killed by close.
  // A group started while the sandbox is paused (its exec began just before the pause) is
  // stopped at once, as the freezer would.
  void track(pid_t pgid) {
    std::lock_guard lock(mutex_);
    groups_.insert(pgid);
    if (paused()) ::kill(-pgid, SIGSTOP);
  }
  void untrack(pid_t pgid) {
    std::lock_guard lock(mutex_);
    groups_.erase(pgid);
  }
  // Marks the sandbox closed and kills what runs in it; true the first time.
  bool close() {
    std::lock_guard lock(mutex_);
    for (pid_t g : groups_)
      ::kill(-g, SIGKILL);
    return !closed_.exchange(true);
  }
  bool closed() const { return closed_.load(); }
  // A sandbox that is gone (closed through this or another handle) is NOT_FOUND for every call,
  // as the ABI asks; one that is paused refuses commands and transfers at once.
  void require_open() {
    if (expire_if_due() || closed() || !fs::exists(dir_)) {
      throw Error::not_found("sandbox " + id() + " no longer exists");
    }
  }
  void require_running() {
    require_open();
    if (paused())
      throw Error::failed_precondition("sandbox " + id() + " is paused; resume it first");
  }
  bool paused() const { return fs::exists(dir_ / ".sbx-paused"); }
  // Marks the sandbox paused or running, and stops or continues what runs in it.
  void set_paused(bool paused) {
    require_open();
    std::lock_guard lock(mutex_);
    if (paused) {
      std::ofstream(dir_ / ".sbx-paused") << "";
    } else {
      fs::remove(dir_ / ".sbx-paused");
    }
    for (pid_t g : groups_)
      ::kill(-g, paused ? SIGSTOP : SIGCONT);
  }

 private:
  fs::path dir_;
  sdk::Spec spec_;
  std::mutex mutex_;
  std::set<pid_t> groups_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> expires_at_unix_ms_{0};  // 0: no TTL
};

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  void reset() {
    if (fd >= 0) ::close(std::exchange(fd, -1));
  }
};

// A command's environment: the plugin's own variables, the spec's env, then `extra` (these win).
std::vector<std::string> command_env(const ProcessSandbox& sandbox, const sdk::KeyValues& extra) {
  std::vector<std::string> env_strings = {
      "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + sandbox.dir().string(),
      "TMPDIR=" + sandbox.dir().string(), "SBX_SANDBOX_ROOT=" + sandbox.dir().string()};
  sdk::KeyValues env = sandbox.spec().env;
  for (const auto& [k, v] : extra)
    env[k] = v;
  for (const auto& [k, v] : env)
    env_strings.push_back(k + "=" + v);
  return env_strings;
}

// Runs `/bin/sh -c command` in its own session, streams its output, enforces the timeout by
// killing the process group, and honours cancellation the same way.
sdk::ExitStatus run_command(ProcessSandbox& sandbox, const sdk::ExecRequest& req,
                            std::chrono::milliseconds timeout, sdk::OutputSink& out,
                            const sdk::CancelToken& cancel) {
  const fs::path cwd = sandbox.host_path(req.cwd.value_or(sandbox.spec().workdir.value_or("/")));
  if (!fs::is_directory(cwd)) {
    return sdk::ExitStatus::sandbox_failure();  // the sandbox cannot start a process there
  }
  std::vector<std::string> env_strings = command_env(sandbox, req.env);
  std::vector<char*> envp;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw Error::internal("pipe: " + errno_text());
  Fd out_r(out_pipe[0]), out_w(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw Error::internal("pipe: " + errno_text());
  Fd err_r(err_pipe[0]), err_w(err_pipe[1]);
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_w.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_w.fd, 2);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  std::string command = req.command;
  char sh[] = "/bin/sh", dash_c[] = "-c";
  char* argv[] = {sh, dash_c, command.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  out_w.reset();
  err_w.reset();
  if (rc != 0) return sdk::ExitStatus::sandbox_failure();

  sandbox.track(pid);
  std::stop_callback on_cancel(cancel, [&] {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake.fd, &one, sizeof(one));
  });
  const auto deadline = Clock::now() + timeout;
  bool timed_out = false, cancelled = false;
  // The sandbox's expiry is checked at least this often while the command runs (renew may move
  // it); passing it ends the sandbox, whose close kills the command.
  constexpr int kExpiryCheckMs = 200;
  const auto wait_bound = [&](int ms) {
    return sandbox.expires_at_unix_ms() > 0 ? std::min(ms, kExpiryCheckMs) : ms;
  };
  std::optional<Clock::time_point> drain_until;  // after a kill, stop waiting for stray holders
  char buffer[65536];
  while (out_r.fd >= 0 || err_r.fd >= 0) {
    const auto now = Clock::now();
    if (!timed_out && !cancelled && now >= deadline) timed_out = true;
    if ((timed_out || cancelled) && !drain_until) {
      ::kill(-pid, SIGKILL);
      drain_until = now + std::chrono::seconds(2);
    }
    if (drain_until && now >= *drain_until) break;
    sandbox.expire_if_due();
    const auto limit = drain_until ? *drain_until : deadline;
    const int wait_ms = wait_bound(static_cast<int>(
        std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(limit - now).count()) +
        1));
    pollfd fds[3] = {{out_r.fd, POLLIN, 0}, {err_r.fd, POLLIN, 0}, {wake.fd, POLLIN, 0}};
    if (::poll(fds, 3, wait_ms) < 0 && errno != EINTR) break;
    if (fds[2].revents & POLLIN) cancelled = true;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Fd& pipe = i == 0 ? out_r : err_r;
      const ssize_t n = ::read(pipe.fd, buffer, sizeof(buffer));
      if (n > 0) {
        out.write(i == 0 ? sdk::StdStream::out : sdk::StdStream::err,
                  std::string_view(buffer, static_cast<size_t>(n)));
      } else if (n == 0 || errno != EINTR) {
        pipe.reset();
      }
    }
  }
  // Both pipes ended, but the command may not have: GNU tools close stdout and stderr at exit,
  // before they end. Killing the group now would turn such an exit into SIGKILL's 137 (it did,
  // under load), so the command's own end is waited for, within its timeout and cancellation.
  if (!timed_out && !cancelled) {
    const Fd exited(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    while (exited.fd >= 0) {
      const auto now = Clock::now();
      if (now >= deadline) {
        timed_out = true;
        break;
      }
      if (sandbox.expire_if_due() || sandbox.closed()) break;  // killed with the sandbox
      const int wait_ms = wait_bound(static_cast<int>(std::min<int64_t>(
          1000,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1)));
      pollfd fds[2] = {{exited.fd, POLLIN, 0}, {wake.fd, POLLIN, 0}};
      if (::poll(fds, 2, wait_ms) < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) {
        cancelled = true;
        break;
      }
      if (fds[0].revents & POLLIN) break;
    }
  }
  // Nothing of the command outlives the exec, but a session's background jobs
  // (sdk::ShellSessions marks its runs with SBX_SESSION_ID) outlive a run that ended by itself.
  if (timed_out || cancelled || !req.env.count("SBX_SESSION_ID")) ::kill(-pid, SIGKILL);
  // Untracked before it is reaped: close kills tracked groups, and a reaped leader's id (its
  // group's) may be another process's by then.
  sandbox.untrack(pid);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (cancelled) throw Error::cancelled("exec cancelled");
  // Closed (through any handle) or expired while it ran: the sandbox is gone, and so is the result.
  if (sandbox.closed() || !fs::exists(sandbox.dir())) {
    throw Error::not_found("sandbox " + sandbox.id() + " went away while the command ran");
  }
  if (timed_out) return sdk::ExitStatus::timed_out();
  if (WIFEXITED(status)) return sdk::ExitStatus::exited(WEXITSTATUS(status));
  return sdk::ExitStatus::exited(128 + WTERMSIG(status));
}

class TestProcessesProvider final : public sdk::Provider,
                                    public sdk::PauseExtension,
                                    public sdk::ConnectExtension,
                                    public sdk::RenewExtension,
                                    public sdk::ShellSessions,
                                    public sdk::PtyExtension {
 public:
  static constexpr const char* kId = "test_processes";
  static constexpr const char* kDescription =
      "Sandboxes as host processes in private directories (tests only, no isolation)";
  static constexpr const char* kConfigSchema = R"({
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "root": {"type": "string"},
    "default_timeout_s": {"type": "number", "exclusiveMinimum": 0},
    "fail_create": {"type": ["string", "null"]},
    "fail_create_reason": {"type": ["string", "null"]},
    "fail_probe": {"type": "boolean"},
    "throw_in": {"type": ["string", "null"]},
    "complete_inline": {"type": "boolean"},
    "create_delay_ms": {"type": "integer", "minimum": 0},
    "upload_delay_ms": {"type": "integer", "minimum": 0},
    "hang_in": {"enum": ["init", "create", "exec"]},
    "hang_fifo": {"type": "string"},
    "renew_gate": {"type": "string"},
    "sessions": {"type": "boolean"}
  }
})";

  TestProcessesProvider(const sdk::ProviderContext& context, const boost::json::object& config)
      : sdk::ShellSessions(static_cast<sdk::Provider&>(*this)),
        config_(Config::read(config)),
        log_(context.log),
        pool_({.max_threads = 32}) {
    maybe_hang("init");
  }

  sdk::SessionExtension* session_extension() override {
    return config_.sessions ? sdk::Provider::session_extension() : nullptr;
  }

  void create(sdk::Spec spec, sdk::Completion<std::unique_ptr<sdk::Sandbox>> done) override {
    maybe_hang("create");
    maybe_throw("create");
    pool_.submit([this, spec = std::move(spec), done = std::move(done)]() mutable {
      try {
        done.succeed(create_now(std::move(spec), done.cancel_token()));
      } catch (...) {
        done.fail_current_exception();
      }
    });
  }

  void exec(sdk::Sandbox& s, sdk::ExecRequest request, sdk::ExecCompletion done) override {
    maybe_hang("exec");
    maybe_throw("exec");
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    sandbox.require_running();
    if (request.user && *request.user != std::to_string(::getuid())) {
      throw Error::unimplemented("test_processes runs commands as the host's user (uid " +
                                 std::to_string(::getuid()) + ") only, not as '" + *request.user +
                                 "'");
    }
    pool_.submit([this, &sandbox, request = std::move(request), done = std::move(done)]() mutable {
      try {
        const auto timeout = request.timeout.value_or(config_.default_timeout);
        done.succeed(run_command(sandbox, request, timeout, done.output(), done.cancel_token()));
      } catch (...) {
        done.fail_current_exception();
      }
    });
  }

  void upload(sdk::Sandbox& s, sdk::UploadRequest request, sdk::ByteSource& source,
              sdk::Completion<void> done) override {
    maybe_throw("upload");
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    sandbox.require_running();
    pool_.submit(
        [this, &sandbox, &source, request = std::move(request), done = std::move(done)]() mutable {
          try {
            injected_delay(config_.upload_delay, done.cancel_token());
            write_file(sandbox.host_path(request.remote_path), request.mode, source,
                       done.cancel_token());
            done.succeed();
          } catch (...) {
            done.fail_current_exception();
          }
        });
  }

  void download(sdk::Sandbox& s, std::string remote_path, sdk::ByteSink& sink,
                sdk::Completion<void> done) override {
    maybe_throw("download");
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    sandbox.require_running();
    sink.hold_by_blocking_writes();  // sbx.flow/1: the pool thread's writes wait while held
    pool_.submit(
        [&sandbox, &sink, path = std::move(remote_path), done = std::move(done)]() mutable {
          try {
            const sdk::detail::WritesMayWait here;
            read_file(sandbox.host_path(path), path, sink, done.cancel_token());
            done.succeed();
          } catch (...) {
            done.fail_current_exception();
          }
        });
  }

  void status(sdk::Sandbox& s, sdk::Completion<sdk::SandboxStatus> done) override {
    maybe_throw("status");
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    auto answer = [&sandbox] {
      if (sandbox.expire_if_due() || sandbox.closed() || !fs::exists(sandbox.dir())) {
        return sdk::SandboxStatus::stopped;
      }
      return sandbox.paused() ? sdk::SandboxStatus::paused : sdk::SandboxStatus::running;
    };
    if (config_.complete_inline) return done.succeed(answer());
    pool_.submit([answer, done = std::move(done)]() mutable { done.succeed(answer()); });
  }

  void close(sdk::Sandbox& s, sdk::Completion<void> done) override {
    maybe_throw("close");
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    auto remove = [this, &sandbox] {
      forget_terminals(sandbox.id());
      sandbox.close();
      std::error_code ec;
      fs::remove_all(sandbox.dir(), ec);
      if (ec) throw Error::internal("removing " + sandbox.dir().string() + ": " + ec.message());
    };
    if (config_.complete_inline) {
      remove();
      return done.succeed();
    }
    pool_.submit([remove, done = std::move(done)]() mutable {
      try {
        remove();
        done.succeed();
      } catch (...) {
        done.fail_current_exception();
      }
    });
  }

  void pause(sdk::Sandbox& s, sdk::Completion<void> done) override {
    static_cast<ProcessSandbox&>(s).set_paused(true);
    done.succeed();
  }

  void resume(sdk::Sandbox& s, sdk::Completion<void> done) override {
    static_cast<ProcessSandbox&>(s).set_paused(false);
    done.succeed();
  }

  void renew(sdk::Sandbox& s, int64_t expires_at_unix_ms, sdk::Completion<int64_t> done) override {
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    sandbox.require_open();
    if (expires_at_unix_ms <= ProcessSandbox::unix_now_ms()) {
      throw Error::invalid_argument("the new expiry is in the past");
    }
    sandbox.set_expires_at_unix_ms(expires_at_unix_ms);
    write_meta(sandbox.dir(), sandbox.spec(), expires_at_unix_ms);
    if (!config_.renew_gate) {
      done.succeed(expires_at_unix_ms);
      return;
    }
    const fs::path gate = *config_.renew_gate;
    const fs::path waiting = gate.string() + ".waiting-" + std::to_string(++renews_);
    pool_.submit([gate, waiting, expires_at_unix_ms, done = std::move(done)]() mutable {
      std::ofstream{waiting};
      std::error_code ec;
      while (!fs::exists(gate, ec) && !done.cancel_token().stop_requested())
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      done.succeed(expires_at_unix_ms);
    });
  }

  // ---- sbx.pty/1: terminals as host processes on pseudo-terminals (terminal.hpp) --------------

  void open_pty(sdk::Sandbox& s, sdk::PtyRequest request,
                sdk::Completion<std::string> done) override {
    auto& sandbox = static_cast<ProcessSandbox&>(s);
    sandbox.require_running();
    if (request.user && *request.user != std::to_string(::getuid())) {
      throw Error::unimplemented("test_processes runs terminals as the host's user only");
    }
    TerminalStart start;
    start.cwd = sandbox.host_path(request.cwd.value_or(sandbox.spec().workdir.value_or("/")));
    if (!fs::is_directory(start.cwd)) {
      throw Error::invalid_argument("the terminal's cwd " + request.cwd.value_or("/") +
                                    " is not a directory in the sandbox");
    }
    if (request.tty && !request.env.count("TERM")) request.env["TERM"] = "xterm-256color";
    start.env = command_env(sandbox, request.env);
    start.argv = request.command ? std::vector<std::string>{"/bin/sh", "-c", *request.command}
                                 : std::vector<std::string>{"/bin/sh", "-i"};
    start.tty = request.tty;
    start.rows = request.rows;
    start.cols = request.cols;
    auto terminal = std::make_shared<LocalTerminal>(start);
    sandbox.track(terminal->pid());
    const std::string id =
        "t" + std::to_string(terminal->pid()) + "-" + std::to_string(++terminals_made_);
    {
      std::lock_guard lock(terminals_mutex_);
      terminals_[sandbox.id()][id] = std::move(terminal);
    }
    done.succeed(id);
  }

  void attach_pty(sdk::Sandbox& s, std::string id, uint64_t since, bool takeover,
                  sdk::PtyAttachCompletion done) override {
    terminal(s, id)->output().attach(since, takeover, std::move(done));
  }

  void write_pty(sdk::Sandbox& s, std::string id, std::string input,
                 sdk::Completion<void> done) override {
    terminal(s, id)->write(input);
    done.succeed();
  }

  void resize_pty(sdk::Sandbox& s, std::string id, uint16_t rows, uint16_t cols,
                  sdk::Completion<void> done) override {
    terminal(s, id)->resize(rows, cols);
    done.succeed();
  }

  void close_pty(sdk::Sandbox& s, std::string id, sdk::Completion<void> done) override {
    std::shared_ptr<LocalTerminal> gone;
    {
      std::lock_guard lock(terminals_mutex_);
      auto it = terminals_.find(s.id());
      if (it != terminals_.end()) {
        if (auto t = it->second.find(id); t != it->second.end()) {
          gone = std::move(t->second);
          it->second.erase(t);
        }
      }
    }
    if (!gone) throw Error::not_found("terminal " + id + " not found");
    static_cast<ProcessSandbox&>(s).untrack(gone->pid());
    pool_.submit([gone = std::move(gone), done = std::move(done)]() mutable {
      gone.reset();  // kills the process, ends the attachment, joins the reader
      done.succeed();
    });
  }

  void serialize(sdk::Sandbox& s, sdk::Completion<std::string> done) override {
    done.succeed(boost::json::serialize(boost::json::object{
        {"format", SBX_DESCRIPTOR_FORMAT}, {"provider", kId}, {"sandbox_id", s.id()}}));
  }

  void connect(std::string descriptor, sdk::Completion<sdk::Connected> done) override {
    const boost::json::object d = sdk::json::parse_object(descriptor, "the descriptor");
    const auto* provider = d.if_contains("provider");
    if (provider && (!provider->is_string() || provider->get_string() != kId)) {
      throw Error::invalid_argument("the descriptor is not of provider test_processes");
    }
    const auto* id = d.if_contains("sandbox_id");
    // Only a name create made (sbx-test-XXXXXX) under this provider's root: a descriptor never
    // points the provider at another directory.
    const std::string name = id && id->is_string() ? std::string(id->get_string()) : "";
    if (!name.starts_with("sbx-test-") || name.size() != 15 ||
        name.find_first_of("/.") != std::string::npos) {
      throw Error::invalid_argument("the descriptor's sandbox_id '" + name +
                                    "' is not a test_processes sandbox");
    }
    const fs::path dir = config_.root / name;
    if (!fs::is_directory(dir)) throw Error::not_found("sandbox " + name + " no longer exists");
    int64_t expires_at = 0;
    sdk::Spec spec = read_meta(dir, expires_at);
    auto sandbox = std::make_unique<ProcessSandbox>(dir, spec, expires_at);
    if (sandbox->expire_if_due()) throw Error::not_found("sandbox " + name + " has expired");
    sdk::Connected connected;
    connected.workdir = spec.workdir;
    connected.ports = spec.ports;
    connected.sandbox = std::move(sandbox);
    done.succeed(std::move(connected));
  }

 private:
  std::shared_ptr<LocalTerminal> terminal(sdk::Sandbox& s, const std::string& id) {
    static_cast<ProcessSandbox&>(s).require_open();
    std::lock_guard lock(terminals_mutex_);
    auto it = terminals_.find(s.id());
    if (it != terminals_.end()) {
      if (auto t = it->second.find(id); t != it->second.end()) return t->second;
    }
    throw Error::not_found("terminal " + id + " not found");
  }
  // A sandbox's end ends its terminals (outside the lock: each joins its reader).
  void forget_terminals(const std::string& sandbox_id) {
    std::map<std::string, std::shared_ptr<LocalTerminal>> gone;
    {
      std::lock_guard lock(terminals_mutex_);
      auto it = terminals_.find(sandbox_id);
      if (it == terminals_.end()) return;
      gone = std::move(it->second);
      terminals_.erase(it);
    }
  }

  // What a connect needs of the spec, kept in the sandbox directory (hidden from `ls`).
  static void write_meta(const fs::path& dir, const sdk::Spec& spec, int64_t expires_at_unix_ms) {
    boost::json::object meta;
    meta["expires_at_unix_ms"] = expires_at_unix_ms;
    if (spec.workdir) meta["workdir"] = *spec.workdir;
    boost::json::object env;
    for (const auto& [k, v] : spec.env)
      env[k] = v;
    meta["env"] = std::move(env);
    boost::json::array ports;
    for (uint16_t p : spec.ports)
      ports.push_back(p);
    meta["ports"] = std::move(ports);
    std::ofstream(dir / ".sbx-meta") << boost::json::serialize(meta);
  }
  static sdk::Spec read_meta(const fs::path& dir, int64_t& expires_at_unix_ms) {
    std::ifstream in(dir / ".sbx-meta");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const boost::json::object meta = sdk::json::parse_object(text, dir.string() + "/.sbx-meta");
    sdk::Spec spec;
    if (const auto* e = meta.if_contains("expires_at_unix_ms"); e && e->is_int64()) {
      expires_at_unix_ms = e->get_int64();
    }
    if (const auto* w = meta.if_contains("workdir"); w && w->is_string()) {
      spec.workdir = std::string(w->get_string());
    }
    if (const auto* env = meta.if_contains("env"); env && env->is_object()) {
      for (const auto& member : env->get_object()) {
        if (member.value().is_string()) {
          spec.env.emplace(member.key(), std::string(member.value().get_string()));
        }
      }
    }
    if (const auto* ports = meta.if_contains("ports"); ports && ports->is_array()) {
      for (const auto& p : ports->get_array())
        spec.ports.push_back(static_cast<uint16_t>(p.to_number<int64_t>()));
    }
    return spec;
  }

  // Blocks the calling thread in `step` until a writer opens and closes the configured FIFO.
  void maybe_hang(std::string_view step) const {
    if (!config_.hang_in || *config_.hang_in != step) return;
    log_.info("hanging in ", std::string(step), " until ", config_.hang_fifo.string(),
              " is written");
    std::ofstream(config_.hang_fifo.string() + ".hanging") << step;  // for the test to wait on
    int fd = -1;
    while ((fd = ::open(config_.hang_fifo.c_str(), O_RDONLY | O_CLOEXEC)) < 0 && errno == EINTR) {
    }
    if (fd < 0) return;
    char c = 0;
    for (;;) {  // until the writer closes its end
      const ssize_t n = ::read(fd, &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    ::close(fd);
  }

  void maybe_throw(std::string_view method) const {
    if (config_.throw_in && *config_.throw_in == method) {
      throw std::runtime_error("test_processes: injected failure in " + std::string(method));
    }
  }

  // Waits `delay` (injected), or until cancelled.
  static void injected_delay(std::chrono::milliseconds delay, const sdk::CancelToken& cancel) {
    if (delay.count() <= 0) return;
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait_for(lock, cancel, delay, [] { return false; });
    sdk::throw_if_cancelled(cancel);
  }

  std::unique_ptr<sdk::Sandbox> create_now(sdk::Spec spec, const sdk::CancelToken& cancel) {
    injected_delay(config_.create_delay, cancel);
    if (config_.fail_create) {
      throw Error(SBX_STATUS_CREATE_FAILED, *config_.fail_create,
                  sdk::ErrorDetails{.reason = config_.fail_create_reason.value_or("")});
    }
    std::string pattern = (config_.root / "sbx-test-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) {
      throw Error::create_failed("cannot create a sandbox directory under " +
                                 config_.root.string() + ": " + errno_text());
    }
    const int64_t expires_at =
        spec.ttl ? ProcessSandbox::unix_now_ms() + std::max<int64_t>(spec.ttl->count(), 1) : 0;
    auto sandbox = std::make_unique<ProcessSandbox>(pattern, std::move(spec), expires_at);
    try {
      write_meta(sandbox->dir(), sandbox->spec(), expires_at);
      if (sandbox->spec().workdir)
        fs::create_directories(sandbox->host_path(*sandbox->spec().workdir));
      for (const auto& file : sandbox->spec().files) {
        const fs::path target = sandbox->host_path(file.path);
        fs::create_directories(target.parent_path());
        std::ofstream(target, std::ios::binary) << file.contents;
      }
      if (config_.fail_probe) {
        throw Error::create_verification_failed("sandbox " + sandbox->id() +
                                                " failed readiness probe (injected)");
      }
    } catch (...) {
      std::error_code ec;
      fs::remove_all(sandbox->dir(), ec);  // a failed create leaves nothing behind
      throw;
    }
    log_.debug("created sandbox ", sandbox->id());
    return sandbox;
  }

  // Writes to a temporary file renamed into place, so a failed upload leaves nothing partial.
  static void write_file(const fs::path& target, uint32_t mode, sdk::ByteSource& source,
                         const sdk::CancelToken& cancel) {
    fs::create_directories(target.parent_path());
    const fs::path temp = target.string() + ".upload-tmp";
    try {
      Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
      if (fd.fd < 0) throw Error::internal("open " + temp.string() + ": " + errno_text());
      char buffer[65536];
      int64_t total = 0;
      for (;;) {
        sdk::throw_if_cancelled(cancel);
        const size_t n = source.read(buffer, sizeof(buffer));
        if (n == 0) break;
        if (::write(fd.fd, buffer, n) != static_cast<ssize_t>(n)) {
          throw Error::internal("write " + temp.string() + ": " + errno_text());
        }
        total += static_cast<int64_t>(n);
      }
      if (total != source.size()) {
        throw Error::internal("upload source ended after " + std::to_string(total) + " of " +
                              std::to_string(source.size()) + " bytes");
      }
      ::fchmod(fd.fd, mode);
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
    fs::rename(temp, target);
  }

  static void read_file(const fs::path& source, const std::string& shown, sdk::ByteSink& sink,
                        const sdk::CancelToken& cancel) {
    struct stat st {};
    if (::lstat(source.c_str(), &st) != 0) {
      throw Error::not_found("no such file in the sandbox: " + shown);
    }
    if (!S_ISREG(st.st_mode)) {
      throw Error::invalid_argument(shown + " is not a regular file");
    }
    Fd fd(::open(source.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.fd < 0) throw Error::internal("open " + shown + ": " + errno_text());
    // Its size at the start, announced (ABI 1.3): that many bytes are sent, no more.
    uint64_t left = static_cast<uint64_t>(st.st_size);
    sink.expect_size(left);
    char buffer[65536];
    while (left > 0) {
      sdk::throw_if_cancelled(cancel);
      const ssize_t n = ::read(fd.fd, buffer, std::min<uint64_t>(sizeof(buffer), left));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error::internal("read " + shown + ": " + errno_text());
      if (n == 0) throw Error::internal(shown + " became shorter while it was read");
      sink.write(std::string_view(buffer, static_cast<size_t>(n)));
      left -= static_cast<uint64_t>(n);
    }
  }

  Config config_;
  sdk::Logger log_;
  std::atomic<int> renews_{0};  // with renew_gate
  // Terminals by sandbox id, then terminal id: any handle to the sandbox reaches them (in this
  // process: a tests-only shortcut).
  std::mutex terminals_mutex_;
  std::map<std::string, std::map<std::string, std::shared_ptr<LocalTerminal>>> terminals_;
  std::atomic<uint64_t> terminals_made_{0};
  sdk::ThreadPool pool_;  // last: joined first
};

}  // namespace
}  // namespace sbx::test_processes

// The version string: tests/core/reload_test.cpp builds a second copy with another one, to see a
// replaced plugin file really loaded again.
#ifndef SBX_TEST_PROCESSES_VERSION
#define SBX_TEST_PROCESSES_VERSION "0.1.0"
#endif

SBX_PLUGIN("test_processes", SBX_TEST_PROCESSES_VERSION,
           "Test-only provider: sandboxes as host processes",
           sbx::sdk::factory<sbx::test_processes::TestProcessesProvider>())
