// sbx shell: an interactive terminal in a sandbox (sbx.pty/1) on the user's terminal.
//
//   sbx shell ID                      a new terminal running the user's shell (or --command)
//   sbx shell ID --attach TERMINAL    back to a terminal opened before, replaying what it kept
//
// When stdin is a terminal it is put in raw mode (restored on every way out: the remote end, an
// error, a stop), so every key, Ctrl-C included, goes to the sandbox's terminal, whose line
// discipline makes it SIGINT there. The window size is sent at the start and on every SIGWINCH.
// The exit code is the remote process's own. A terminal this command opened is closed once its
// process has exited; one it leaves running (a stop, a takeover by another attach) stays for
// --attach. Exit codes otherwise: those of sbx exec (125 when the sandbox or the terminal is not
// found or the provider fails, 130 when stopped).

#include "commands.hpp"
#include "connected.hpp"
#include "output.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>

namespace sbx::cli {

namespace {

struct ShellFields {
  Target target;
  std::optional<std::string> attach;
  std::optional<std::string> command;
  std::optional<std::string> workdir;
  sbx::StringMap env;
};

// The user's terminal in raw mode while this lives.
class RawMode {
 public:
  RawMode() {
    if (!::isatty(STDIN_FILENO) || ::tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0;
  }
  ~RawMode() {
    if (active_) ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

// The user's window size, if stdin (else stdout) is a terminal.
std::optional<std::pair<uint16_t, uint16_t>> window_size() {
  winsize size{};
  for (int fd : {STDIN_FILENO, STDOUT_FILENO}) {
    if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_row > 0 && size.ws_col > 0) {
      return std::pair<uint16_t, uint16_t>{size.ws_row, size.ws_col};
    }
  }
  return std::nullopt;
}

// SIGWINCH as a file descriptor. Blocked before the host starts its threads (they inherit the
// mask), so that only the signalfd sees it.
struct WindowChanges {
  int fd = -1;
  WindowChanges() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGWINCH);
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  }
  ~WindowChanges() {
    if (fd >= 0) ::close(fd);
  }
};

int shell(ShellFields& f, const Global& g) {
  WindowChanges window_changes;
  return with_sandbox(
      f.target, g, "the terminal may still be running",
      [&](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        const auto size = window_size();
        const bool opened_here = !f.attach;
        sbx::Pty pty;
        if (f.attach) {
          pty = sandbox.pty(*f.attach);
        } else {
          sbx::PtyOptions options{.command = f.command, .cwd = f.workdir, .env = f.env};
          if (size) std::tie(options.rows, options.cols) = *size;
          if (!options.env.count("TERM")) {
            const char* term = std::getenv("TERM");
            options.env["TERM"] = term && *term ? term : "xterm-256color";
          }
          pty = interrupts.step(sandbox.open_pty_async(std::move(options)));
          std::cerr << "sbx: terminal " << pty.id() << " (sbx shell " << f.target.sandbox.id
                    << " --attach " << pty.id() << " comes back to it)\r\n";
        }

        // The end of the attachment wakes the loop below.
        const int ended = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        struct CloseFd {
          int fd;
          ~CloseFd() { ::close(fd); }
        } close_ended{ended};
        auto output_errno = std::make_shared<std::atomic<int>>(0);
        sbx::Operation<int32_t> attached = pty.attach_async(
            {.since = 0,
             .takeover = true,
             .on_output = [output_errno](sbx::OutputStream stream, uint64_t,
                                         std::string_view bytes) {
               if (*output_errno != 0) return;
               *output_errno = write_all(
                   stream == sbx::OutputStream::err ? STDERR_FILENO : STDOUT_FILENO, bytes);
             }});
        attached.then([ended](sbx::Operation<int32_t>&) {
          const uint64_t one = 1;
          [[maybe_unused]] auto n = ::write(ended, &one, sizeof(one));
        });
        if (f.attach && size) pty.resize(size->first, size->second);

        RawMode raw;
        bool stdin_open = true;
        char buffer[4096];
        while (!attached.ready()) {
          if (interrupts.stopped() || *output_errno != 0) {
            attached.cancel();  // a detach: the terminal goes on
            break;
          }
          // The slice bounds how late a stop (which has no descriptor here) is seen.
          pollfd fds[3] = {{stdin_open ? STDIN_FILENO : -1, POLLIN, 0},
                           {window_changes.fd, POLLIN, 0},
                           {ended, POLLIN, 0}};
          if (::poll(fds, 3, 100) < 0 && errno != EINTR) break;
          if (fds[1].revents & POLLIN) {
            signalfd_siginfo info;
            while (::read(window_changes.fd, &info, sizeof(info)) == sizeof(info)) {
            }
            if (const auto now = window_size()) pty.resize_async(now->first, now->second);
          }
          if (fds[0].revents & (POLLIN | POLLHUP)) {
            const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof(buffer));
            if (n > 0) {
              try {
                pty.write(std::string_view(buffer, static_cast<size_t>(n)));
              } catch (const sbx::FailedPreconditionError&) {
                // the process exited meanwhile: its attachment is about to end
              }
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
              stdin_open = false;  // input ended: wait for the process's own end
            }
          }
        }
        attached.wait();
        try {
          const int32_t code = attached.get();
          if (opened_here) pty.close();  // its process is gone: nothing to come back to
          return static_cast<int>(code);
        } catch (const sbx::CancelledError&) {
          if (*output_errno != 0) {
            return *output_errno == EPIPE ? kExitBrokenPipe : kExitLocalIo;
          }
          throw;
        } catch (const sbx::FailedPreconditionError& e) {
          if (e.reason() != "taken_over") throw;
          std::cerr << "\r\nsbx: another client took terminal " << pty.id() << " over\r\n";
          return kExitFailure;
        }
      });
}

}  // namespace

Command shell_command() {
  return make_command<ShellFields>({
      .name = "shell",
      .summary = "An interactive terminal in a sandbox made by sbx create",
      .usage = "[options] ID",
      .description =
          "Opens a terminal in the sandbox (sbx.pty/1) running the user's shell, or --command, "
          "and connects\nit to this one: raw mode (every key, Ctrl-C included, goes to the "
          "sandbox), the window size\nfollowed. It prints the terminal's id to stderr; --attach "
          "ID comes back to a terminal (also one\nanother client holds: it is taken over) and "
          "replays what the provider kept. Exits with the\nremote process's exit code; a "
          "terminal left running (stopped, taken over) stays for --attach.\n125 when the "
          "sandbox or the terminal is not found or the provider fails; 2 for usage "
          "errors;\n130 when stopped.\n",
      .options = target_options<ShellFields>({
          value<ShellFields>("--attach", "TERMINAL",
                             "Attach to this terminal instead of opening one",
                             [](ShellFields& f, const Arg& a) { f.attach = a.text; }),
          value<ShellFields>("--command", "CMD", "Run CMD (by sh -c) instead of the user's shell",
                             [](ShellFields& f, const Arg& a) { f.command = a.text; }),
          value<ShellFields>("--workdir", "DIR", "Working directory (default: the sandbox's)",
                             [](ShellFields& f, const Arg& a) { f.workdir = a.text; }),
          repeatable<ShellFields>("--env", "K=V", "Environment variable of the terminal",
                                  [](ShellFields& f, const Arg& a) {
                                    auto [k, v] = a.pair('=');
                                    f.env[k] = v;
                                  }),
      }),
      .positionals = {sandbox_argument<ShellFields>()},
      .check =
          [](ShellFields& f) {
            if (f.attach && (f.command || f.workdir || !f.env.empty())) {
              throw UsageError(
                  "--attach comes back to a running terminal: --command, --workdir "
                  "and --env are for a new one");
            }
          },
      .handler = shell,
  });
}

}  // namespace sbx::cli
