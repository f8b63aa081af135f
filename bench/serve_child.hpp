// `sbx serve` as a child process of a benchmark: started on 127.0.0.1:0 with a config file (and,
// optionally, more arguments and environment variables), its port (and the sbx.run label of the
// sandboxes it creates) read from its first line on stdout, its stderr in a log file, stopped with
// SIGTERM (a graceful stop: the server closes what it created). Also what a benchmark reads of the
// server process in /proc: a field of its status (VmRSS, Threads), its open file count, the files
// it maps. Header-only, shared by the benchmarks that measure through the gateway.
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
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace sbx::bench {

class ServeChild {
 public:
  struct Options {
    std::string provider = "docker";
    std::vector<std::string> args;  // more arguments, e.g. {"--api-key-env", "VAR"}
    std::vector<std::string> env;   // "NAME=VALUE": set in the server's environment
  };

  // Runs `sbx serve --config CONFIG --provider PROVIDER --listen 127.0.0.1:0`, its stderr to
  // `log`. Throws std::runtime_error when it does not come up.
  ServeChild(const std::filesystem::path& sbx, const std::filesystem::path& config,
             const std::filesystem::path& log, const std::string& provider = "docker")
      : ServeChild(sbx, config, log, Options{.provider = provider}) {}

  // The same with `options.args` after those arguments and `options.env` in its environment.
  ServeChild(const std::filesystem::path& sbx, const std::filesystem::path& config,
             const std::filesystem::path& log, const Options& options) {
    // argv and envp are made before the fork: the child only calls async-signal-safe functions.
    // The benchmarks put hundreds of commands on one sandbox at once: the per-sandbox command
    // cap (8 running, 24 waiting by default; docs/serve.md "Limits") is raised so that they time
    // the server, not its refusals, and so is the count of finished records kept (50), which
    // they read back.
    std::vector<std::string> args{sbx.string(),
                                  "serve",
                                  "--config",
                                  config.string(),
                                  "--provider",
                                  options.provider,
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--max-commands",
                                  "4096",
                                  "--max-queued-commands",
                                  "100000",
                                  "--kept-commands",
                                  "100000"};
    args.insert(args.end(), options.args.begin(), options.args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('=') + 1);
      bool replaced = false;
      for (const auto& set : options.env)
        replaced = replaced || set.starts_with(name);
      if (!replaced) env.push_back(entry);
    }
    env.insert(env.end(), options.env.begin(), options.env.end());
    std::vector<char*> argv, envp;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env)
      envp.push_back(e.data());
    envp.push_back(nullptr);
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
      execve(argv[0], argv.data(), envp.data());
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

// A field of /proc/PID/status as a number: "VmRSS" (KiB), "Threads". Throws when it is absent.
inline double proc_status(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == field + ":") {
      double value = 0;
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  throw std::runtime_error("no " + field + " for pid " + std::to_string(pid));
}

// The resident set of a process, KiB.
inline double rss_kib(pid_t pid) {
  return proc_status(pid, "VmRSS");
}

// How many files a process has open (the entries of /proc/PID/fd).
inline int open_files(pid_t pid) {
  const std::filesystem::path fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(fd_dir))
    ++n;
  return n;
}

// How many mappings a process has (the lines of /proc/PID/maps). A thread's stack is two (the
// stack and its guard page) until the thread is joined or, detached, has exited.
inline size_t mapping_count(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);)
    ++n;
  return n;
}

// The distinct files a process maps whose path starts with `prefix` (as /proc/PID/maps names
// them: a file unlinked since ends in " (deleted)").
inline std::set<std::string> mapped_files(pid_t pid, const std::string& prefix) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::set<std::string> out;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.compare(slash, prefix.size(), prefix) == 0)
      out.insert(line.substr(slash));
  }
  return out;
}

}  // namespace sbx::bench
