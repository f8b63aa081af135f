// A complete sbx plugin in one file: each sandbox is a private temporary directory on the host,
// each command a host process (/bin/sh -c) run in it. There is NO isolation: a command can reach
// the whole host. It is an example of the SDK, not a sandbox.
//
// The sandbox's file system is its directory: the sandbox path "/work/x" is "<dir>/work/x" on the
// host, a relative path is relative to the spec's workdir, and a path that would leave the
// directory ("..") is refused; symbolic links are NOT resolved inside it (a link made by a command
// leads a transfer anywhere, as the command itself can go anywhere; a provider that isolates must
// do better: docs/sandbox-semantics.md, "Paths"). Commands start in the workdir (or the exec's cwd)
// with only the spec's and the exec's environment (plus PATH and HOME). What the ABI asks of every
// provider (paths, closed and gone sandboxes, cancellation, threading) is in
// docs/sandbox-semantics.md.
//
// The SDK's blocking adapter runs each method on a pool thread, several at once, also for one
// sandbox; a method returns its result or throws sbx::sdk::Error, and the SDK completes the
// operation exactly once. Declared honestly:
//   - `user` is not offered: an exec that names one fails with UNIMPLEMENTED;
//   - a TTL is kept by a watchdog process (`sleep TTL; rm -rf DIR`) in a session of its own, so the
//     sandbox ends on time also when the host process is gone; close stops the watchdog;
//   - a command still running when its sandbox is closed or expires is killed, and its exec ends
//     then with NOT_FOUND (the sandbox is gone), not with the kill's exit code;
//   - no extension (pause, connect, list-reap, renew) is offered.
#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/plugin.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

namespace fs = std::filesystem;
using namespace sbx::sdk;
// Timeouts are measured on the host's clock (sbx::sdk::now()), not on steady_clock, so that a test
// on the SDK's fake host can make them pass by advancing its clock (docs/writing-a-plugin.md).
using Clock = HostClock;

// Runs argv with the given cwd and environment in a session of its own (so that killing the
// process group kills everything it started), stdin from /dev/null, and no other file of this
// process open. Returns the pid or -1.
pid_t spawn(std::vector<std::string> argv, const std::vector<std::string>& env, const char* cwd,
            int out_fd, int err_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // none of the host's open files
  if (cwd) posix_spawn_file_actions_addchdir_np(&actions, cwd);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);  // a host that ignores SIGPIPE must not pass that on
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args, envp;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  for (const auto& e : env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

class HelloSandbox : public Sandbox {
 public:
  HelloSandbox(fs::path dir, const Spec& spec)
      : Sandbox(dir.string()),
        dir(std::move(dir)),
        workdir(spec.workdir.value_or("/")),
        env(spec.env) {}

  // The host path of sandbox path `path`, which must stay inside the sandbox's directory.
  fs::path host_path(const std::string& path) const {
    const fs::path absolute = fs::path(workdir) / path;  // `path` wins when it is absolute
    const fs::path inside = absolute.relative_path().lexically_normal();
    if (!inside.empty() && *inside.begin() == "..") {
      throw Error::invalid_argument("path " + path + " leaves the sandbox");
    }
    return dir / inside;
  }
  // Every call but status and close starts here: a sandbox that is gone (closed, expired) is
  // NOT_FOUND.
  void require_alive() const {
    if (gone()) throw Error::not_found("sandbox " + id() + " is gone");
  }
  // Closed, past its TTL (the watchdog may still be removing the directory), or removed.
  bool gone() const {
    return closed_ || (expires_at_ && std::chrono::steady_clock::now() >= *expires_at_) ||
           !fs::is_directory(dir);
  }
  // Commands of this sandbox by process group, so that close can kill them.
  bool track(pid_t group) {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    groups_.insert(group);
    return true;
  }
  void untrack(pid_t group) {
    std::lock_guard lock(mutex_);
    groups_.erase(group);
  }
  // Kills what runs in the sandbox, stops its TTL watchdog, removes its directory.
  void end() {
    pid_t watchdog = -1;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      for (pid_t g : groups_)
        kill(-g, SIGKILL);
      std::swap(watchdog, watchdog_);
    }
    if (watchdog > 0) {
      kill(-watchdog, SIGKILL);  // its session's group: the shell and its sleep
      waitpid(watchdog, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) throw Error::internal("removing " + dir.string() + ": " + ec.message());
  }
  void set_watchdog(pid_t pid, std::chrono::steady_clock::time_point expires_at) {
    std::lock_guard lock(mutex_);
    watchdog_ = pid;
    expires_at_ = expires_at;  // set once, at create, before any exec reads it
  }

  const fs::path dir;
  const std::string workdir;  // absolute sandbox path
  const KeyValues env;

 private:
  std::mutex mutex_;  // guards the fields below
  std::atomic<bool> closed_ = false;
  std::set<pid_t> groups_;
  pid_t watchdog_ = -1;
  std::optional<std::chrono::steady_clock::time_point> expires_at_;  // the watchdog's moment
};

class HelloProvider : public BlockingProvider {
 public:
  static constexpr const char* kId = "hello";
  static constexpr const char* kDescription = "Example: a temp directory per sandbox";
  static constexpr const char* kConfigSchema =
      R"({"type": "object", "additionalProperties": false})";

  HelloProvider(const ProviderContext& context, const boost::json::object& config)
      : log_(context.log) {
    json::ObjectReader(config).finish();  // no settings: any key is an error naming its path
  }

  std::unique_ptr<Sandbox> create(const Spec& spec, const CancelToken&) override {
    if (spec.workdir && !spec.workdir->starts_with('/')) {
      throw Error::invalid_argument("workdir must be an absolute path, got " + *spec.workdir);
    }
    std::string dir = (fs::temp_directory_path() / "hello-XXXXXX").string();
    if (!mkdtemp(dir.data())) throw Error::create_failed("mkdtemp failed");
    auto box = std::make_unique<HelloSandbox>(dir, spec);  // the sandbox id is its directory
    try {
      fs::create_directories(box->host_path(box->workdir));
      if (spec.ttl) start_watchdog(*box, *spec.ttl);
    } catch (...) {
      box->end();  // a failed create leaves nothing behind
      throw;
    }
    log_.info("created ", dir);
    return box;  // the SDK writes the spec's startup files next, with upload()
  }

  ExitStatus exec(Sandbox& s, const ExecRequest& req, OutputSink& out,
                  const CancelToken& cancel) override {
    auto& box = static_cast<HelloSandbox&>(s);
    box.require_alive();
    if (req.user) throw Error::unimplemented("hello runs commands as the host's user only");
    const fs::path cwd = box.host_path(req.cwd.value_or(box.workdir));
    if (!fs::is_directory(cwd)) return ExitStatus::sandbox_failure();  // cannot start it there

    KeyValues vars = box.env;
    for (const auto& [k, v] : req.env)
      vars[k] = v;  // the exec's values win
    std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin",
                                    "HOME=" + box.dir.string()};
    for (const auto& [k, v] : vars)
      env.push_back(k + "=" + v);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, wake[2] = {-1, -1};
    pid_t pid = -1;
    if (pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(err_pipe, O_CLOEXEC) == 0 &&
        pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
      pid = spawn({"/bin/sh", "-c", req.command}, env, cwd.c_str(), out_pipe[1], err_pipe[1]);
    }
    for (int fd : {out_pipe[1], err_pipe[1]})
      if (fd >= 0) ::close(fd);                           // the command has its own copies
    if (pid > 0 && !box.track(pid)) kill(-pid, SIGKILL);  // closed meanwhile
    // A cancel wakes the wait below by writing to `wake` (the callback is gone before it closes).
    std::optional<std::stop_callback<std::function<void()>>> on_cancel;
    if (pid > 0) on_cancel.emplace(cancel, [&] { (void)!::write(wake[1], "x", 1); });

    // Forward output as it arrives until both pipes end, the timeout passes, a cancel comes or
    // the sandbox goes (closed, expired); then the process group is killed (a command that closed
    // its output and went on ends too).
    const auto deadline = Clock::now() + req.timeout.value_or(std::chrono::minutes(10));
    bool timed_out = false;
    bool sandbox_gone = false;
    pollfd fds[3] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}, {wake[0], POLLIN, 0}};
    while (pid > 0 && (fds[0].fd >= 0 || fds[1].fd >= 0) && !cancel.stop_requested()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      if (box.gone()) {
        sandbox_gone = true;
        break;
      }
      // At most 100 ms at a time: a fake clock moves without waking the poll.
      if (poll(fds, 3, static_cast<int>(std::min<int64_t>(left.count(), 100))) < 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !fds[i].revents) continue;
        char buf[65536];
        const ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n > 0) {
          out.write(i == 0 ? StdStream::out : StdStream::err, {buf, size_t(n)});
        } else if (n == 0 || errno != EINTR) {
          fds[i].fd = -1;  // end of this stream (closed below)
        }
      }
    }
    int status = 0;
    if (pid > 0) {
      kill(-pid, SIGKILL);  // nothing the command started outlives the exec
      box.untrack(pid);     // before the reaping: then the group's id may be another's
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    on_cancel.reset();
    for (int fd : {out_pipe[0], err_pipe[0], wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
    if (pid <= 0) return ExitStatus::sandbox_failure();
    if (cancel.stop_requested()) throw Error::cancelled("exec cancelled");
    // Closed while it ran (close killed it, so its pipes ended) or expired: the sandbox is gone.
    if (sandbox_gone || box.gone()) {
      throw Error::not_found("sandbox " + box.id() + " went away while the command ran");
    }
    if (timed_out) return ExitStatus::timed_out();
    return ExitStatus::exited(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }

  // Writes a temporary file and renames it into place: a failed upload leaves nothing behind.
  void upload(Sandbox& s, const UploadRequest& req, ByteSource& in,
              const CancelToken& cancel) override {
    auto& box = static_cast<HelloSandbox&>(s);
    box.require_alive();
    const fs::path target = box.host_path(req.remote_path);
    fs::create_directories(target.parent_path());
    const fs::path temp = target.string() + ".hello-upload";
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw Error::internal("cannot write " + req.remote_path);
    try {
      char buf[65536];
      for (size_t n; (n = in.read(buf, sizeof buf)) > 0;) {
        throw_if_cancelled(cancel);
        if (::write(fd, buf, n) != static_cast<ssize_t>(n)) {
          throw Error::internal("writing " + req.remote_path + " failed");
        }
      }
      fchmod(fd, req.mode);  // the mode asked for, not the umask's idea
      if (::close(std::exchange(fd, -1)) != 0) {
        throw Error::internal("writing " + req.remote_path + " failed");
      }
      fs::rename(temp, target);
    } catch (...) {
      if (fd >= 0) ::close(fd);
      ::unlink(temp.c_str());
      throw;
    }
  }

  // Only a regular file is downloaded; a directory or a link is refused by name.
  void download(Sandbox& s, const std::string& path, ByteSink& sink,
                const CancelToken& cancel) override {
    auto& box = static_cast<HelloSandbox&>(s);
    box.require_alive();
    const fs::path source = box.host_path(path);
    struct stat st {};
    if (lstat(source.c_str(), &st) != 0) throw Error::not_found("no such file: " + path);
    if (!S_ISREG(st.st_mode)) {
      throw Error::invalid_argument(path + " is not a regular file (" +
                                    (S_ISDIR(st.st_mode)   ? "a directory"
                                     : S_ISLNK(st.st_mode) ? "a symbolic link"
                                                           : "not a file") +
                                    ")");
    }
    const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) throw Error::internal("cannot read " + path);
    try {
      char buf[65536];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        throw_if_cancelled(cancel);
        sink.write({buf, size_t(n)});
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }

  // A sandbox whose directory is gone (closed, expired) is stopped.
  SandboxStatus status(Sandbox& s, const CancelToken&) override {
    return fs::is_directory(static_cast<HelloSandbox&>(s).dir) ? SandboxStatus::running
                                                               : SandboxStatus::stopped;
  }

  // Closing a sandbox that is gone, or closing twice, is success.
  void close(Sandbox& s, const CancelToken&) override { static_cast<HelloSandbox&>(s).end(); }

 private:
  // The TTL promise holds when this process is gone: a watchdog in its own session removes the
  // directory at expiry, unless close stops it first.
  static void start_watchdog(HelloSandbox& box, std::chrono::milliseconds ttl) {
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    const auto seconds = std::chrono::ceil<std::chrono::seconds>(ttl).count();
    const pid_t pid = spawn({"/bin/sh", "-c", "sleep \"$1\" && rm -rf -- \"$2\"", "hello-ttl",
                             std::to_string(seconds), box.dir.string()},
                            {"PATH=/usr/bin:/bin"}, nullptr, devnull, devnull);
    ::close(devnull);
    if (pid <= 0) throw Error::create_failed("cannot start the TTL watchdog");
    box.set_watchdog(pid, std::chrono::steady_clock::now() + std::chrono::seconds(seconds));
  }

  Logger log_;
};

SBX_PLUGIN("hello", "1.0.0", "An example plugin", factory<HelloProvider>())
