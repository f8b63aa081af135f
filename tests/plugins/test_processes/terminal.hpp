// test_processes' terminals (sbx.pty/1): a host process on a pseudo-terminal (or on pipes, in pipe
// mode) in its own session, with one reader thread that feeds an sdk::TerminalOutput. No isolation,
// as for the plugin's commands.
#pragma once

#include <sbx/sdk/terminal_output.hpp>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sbx::test_processes {

struct TerminalStart {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::vector<std::string> env;   // NAME=value
  std::filesystem::path cwd;
  bool tty = true;
  uint16_t rows = 24;
  uint16_t cols = 80;
};

class LocalTerminal {
 public:
  // Starts the process; throws sdk::Error when it cannot.
  explicit LocalTerminal(const TerminalStart& start);
  // Kills the process group, ends the attachment (NOT_FOUND), joins the reader.
  ~LocalTerminal();
  LocalTerminal(const LocalTerminal&) = delete;
  LocalTerminal& operator=(const LocalTerminal&) = delete;

  pid_t pid() const noexcept { return pid_; }
  sdk::TerminalOutput& output() noexcept { return output_; }
  // Sends input to the terminal (or stdin); FAILED_PRECONDITION once the process has exited.
  void write(std::string_view input);
  void resize(uint16_t rows, uint16_t cols);

 private:
  void read_loop();

  sdk::TerminalOutput output_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int master_ = -1;                  // TTY mode: the pseudo-terminal's master side
  int stdin_ = -1;                   // pipe mode (a socket)
  int stdout_ = -1;                  // pipe mode
  int stderr_ = -1;                  // pipe mode
  int wake_ = -1;                    // eventfd: the reader stops
  std::atomic<bool> reaped_{false};  // by the reader
  std::mutex write_mutex_;
  std::thread reader_;
};

}  // namespace sbx::test_processes
