// `sbx serve` as a child process of a benchmark: started on 127.0.0.1:0 with a config file, its
// port (and the sbx.run label of the sandboxes it creates) read from its first line on stdout, its
// stderr in a log file, stopped with SIGTERM (a graceful stop: the server closes what it created).
// Header-only, shared by the benchmarks that measure through the gateway.
//
// THREADING: one thread uses a ServeChild; the destructor stops the server.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace sbx::bench {

class ServeChild {
 public:
  // Runs `sbx serve --config CONFIG --provider PROVIDER --listen 127.0.0.1:0`, its stderr to
  // `log`. Throws std::runtime_error when it does not come up.
  ServeChild(const std::filesystem::path& sbx, const std::filesystem::path& config,
             const std::filesystem::path& log, const std::string& provider = "docker") {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (err < 0) throw std::runtime_error("cannot open " + log.string());
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Should the benchmark die without stopping it, the server gets SIGTERM all the same.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      dup2(out[1], 1);
      dup2(err, 2);
      execl(sbx.c_str(), sbx.c_str(), "serve", "--config", config.c_str(), "--provider",
            provider.c_str(), "--listen", "127.0.0.1:0", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    close(err);
    stdout_fd_ = out[0];
    // "sbx serve: listening on http://127.0.0.1:PORT (provider P, sbx.run=RUN)"
    std::string line;
    char c = 0;
    while (read(stdout_fd_, &c, 1) == 1 && c != '\n')
      line.push_back(c);
    const auto at = line.find("127.0.0.1:");
    if (at == std::string::npos) {
      stop();
      throw std::runtime_error("sbx serve did not start: '" + line + "' (its log: " + log.string() +
                               ")");
    }
    port_ = std::stoi(line.substr(at + 10));
    if (const auto run = line.find("sbx.run="); run != std::string::npos)
      run_label_ = line.substr(run + 8, line.find(')', run) - run - 8);
  }
  ~ServeChild() { stop(); }
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // The sbx.run label of every sandbox this server creates (empty if it did not say).
  const std::string& run_label() const { return run_label_; }

  // SIGTERM (a graceful stop: the server closes what it created) and its exit status; -1 when it
  // was already stopped or did not exit normally.
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    close(stdout_fd_);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  std::string run_label_;
};

}  // namespace sbx::bench
