// LocalTerminal: posix_spawn (no fork in a threaded host) with POSIX_SPAWN_SETSID, then the
// pseudo-terminal's slave opened as fd 0 in the child: a session leader's first terminal becomes
// its controlling terminal, so Ctrl-C (0x03) is SIGINT and a resize is SIGWINCH, as at a real one.

#include "terminal.hpp"

#include <sbx/sdk/error.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace sbx::test_processes {
namespace {

using sdk::Error;

std::string errno_text() {
  return std::strerror(errno);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

LocalTerminal::LocalTerminal(const TerminalStart& start) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int child_in = -1, child_out = -1, child_err = -1;
  auto cleanup = [&] {
    posix_spawn_file_actions_destroy(&actions);
    close_fd(child_in);
    close_fd(child_out);
    close_fd(child_err);
  };
  std::string slave_name;
  if (start.tty) {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0 || ::grantpt(master_) != 0 || ::unlockpt(master_) != 0) {
      cleanup();
      throw Error::internal("opening a pseudo-terminal: " + errno_text());
    }
    char name[128];
    if (::ptsname_r(master_, name, sizeof(name)) != 0) {
      cleanup();
      throw Error::internal("ptsname: " + errno_text());
    }
    slave_name = name;
    const winsize size{start.rows, start.cols, 0, 0};
    ::ioctl(master_, TIOCSWINSZ, &size);
    // Opened after setsid (glibc's order), without O_NOCTTY: the child's controlling terminal.
    posix_spawn_file_actions_addopen(&actions, 0, slave_name.c_str(), O_RDWR, 0);
    posix_spawn_file_actions_adddup2(&actions, 0, 1);
    posix_spawn_file_actions_adddup2(&actions, 0, 2);
  } else {
    // stdin is a socket, so that a write after the process went away is EPIPE, never SIGPIPE.
    int in[2], out[2], err[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
      throw Error::internal("socketpair: " + errno_text());
    }
    ::shutdown(in[1], SHUT_RD);
    child_in = in[0];
    stdin_ = in[1];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      cleanup();
      throw Error::internal("pipe: " + errno_text());
    }
    stdout_ = out[0];
    child_out = out[1];
    if (::pipe2(err, O_CLOEXEC) != 0) {
      cleanup();
      throw Error::internal("pipe: " + errno_text());
    }
    stderr_ = err[0];
    child_err = err[1];
    posix_spawn_file_actions_adddup2(&actions, child_in, 0);
    posix_spawn_file_actions_adddup2(&actions, child_out, 1);
    posix_spawn_file_actions_adddup2(&actions, child_err, 2);
  }
  posix_spawn_file_actions_addchdir_np(&actions, start.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  std::vector<std::string> argv_text = start.argv, env_text = start.env;
  std::vector<char*> argv, envp;
  for (auto& a : argv_text)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_text)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const int rc = ::posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  cleanup();
  if (rc != 0) {
    close_fd(master_);
    close_fd(stdin_);
    close_fd(stdout_);
    close_fd(stderr_);
    throw Error::failed_precondition("the terminal's process could not start: " +
                                     std::string(std::strerror(rc)));
  }
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  for (int fd : {master_, stdin_, stdout_, stderr_}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  reader_ = std::thread([this] { read_loop(); });
}

LocalTerminal::~LocalTerminal() {
  output_.close();
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_, &one, sizeof(one));
  if (reader_.joinable()) reader_.join();
  // Only a process not reaped yet: a reaped one's id (its group's) may be another's by now.
  if (pid_ > 0 && !reaped_) {
    ::kill(-pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  for (int* fd : {&master_, &stdin_, &stdout_, &stderr_, &wake_, &pidfd_})
    close_fd(*fd);
}

void LocalTerminal::read_loop() {
  char buffer[65536];
  // Reads what `fd` has now; false at its end (EOF, or EIO: the slave side has no holder left).
  auto drain = [&](int& fd, sdk::StdStream stream) {
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        output_.append(stream, std::string_view(buffer, static_cast<size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      return false;
    }
  };
  int& out = master_ >= 0 ? master_ : stdout_;
  bool out_open = true, err_open = stderr_ >= 0;
  for (;;) {
    pollfd fds[4] = {{out_open ? out : -1, POLLIN, 0},
                     {err_open ? stderr_ : -1, POLLIN, 0},
                     {pidfd_, POLLIN, 0},
                     {wake_, POLLIN, 0}};
    if (::poll(fds, 4, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[3].revents) return;  // the terminal is going away
    if (fds[0].revents && !drain(out, sdk::StdStream::out)) out_open = false;
    if (fds[1].revents && !drain(stderr_, sdk::StdStream::err)) err_open = false;
    if (fds[2].revents) break;  // exited
  }
  // What the process wrote before it ended is read, then its status reported.
  if (out_open) drain(out, sdk::StdStream::out);
  if (err_open) drain(stderr_, sdk::StdStream::err);
  // What is left of its group goes with it, while its id is still its own (unreaped).
  ::kill(-pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  output_.exited(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

void LocalTerminal::write(std::string_view input) {
  std::lock_guard lock(write_mutex_);
  if (output_.exit_code()) throw Error::failed_precondition("the terminal's process has exited");
  const int fd = master_ >= 0 ? master_ : stdin_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!input.empty()) {
    const ssize_t n = master_ >= 0 ? ::write(fd, input.data(), input.size())
                                   : ::send(fd, input.data(), input.size(), MSG_NOSIGNAL);
    if (n > 0) {
      input.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw Error::timeout("the terminal's process has not read its input for 10 s");
      }
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    throw Error::failed_precondition("writing to the terminal: " + errno_text());
  }
}

void LocalTerminal::resize(uint16_t rows, uint16_t cols) {
  if (master_ < 0) return;  // pipe mode: nothing to resize
  const winsize size{rows, cols, 0, 0};
  if (::ioctl(master_, TIOCSWINSZ, &size) != 0) {
    throw Error::internal("resizing the terminal: " + errno_text());
  }
}

}  // namespace sbx::test_processes
