// Stopping a command that drives a sandbox (stop.hpp).

#include "stop.hpp"

#include "shared.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace sbx::cli {

Interrupts::Interrupts(std::chrono::milliseconds stop_timeout) : stop_timeout_(stop_timeout) {
  sigemptyset(&set_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1})  // SIGUSR1 stops the watcher
    sigaddset(&set_, sig);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || sig == SIGUSR1) return;
      if (stopped() != 0) {
        give_up();
      } else {
        stop(kExitInterrupted);
      }
    }
  });
}

Interrupts::~Interrupts() {
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
  if (fifo_fd_ >= 0) ::close(fifo_fd_);
}

bool Interrupts::wait_for_fifo_reader(const std::string& local) {
  if (fifo_fd_ >= 0) {
    ::close(fifo_fd_);
    fifo_fd_ = -1;
  }
  struct stat st {};
  if (::stat(local.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) return true;
  // A FIFO without a reader refuses a non-blocking open (ENXIO); a blocking one would wait in the
  // kernel, deaf to a stop. Asked again every 50 ms, as the steps' waits notice a stop.
  for (;;) {
    fifo_fd_ = ::open(local.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fifo_fd_ >= 0 || errno != ENXIO) return true;  // other errors: the download reports them
    if (stopped() != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Interrupts::stop(int exit_code) {
  std::function<void()> cancel;
  {
    std::lock_guard lock(mutex_);
    if (exit_code_ == 0) {
      exit_code_ = exit_code;
      give_up_at_ = std::chrono::steady_clock::now() + stop_timeout_;
    }
    cancel = cancel_;
  }
  if (cancel) cancel();
}

void Interrupts::give_up() {
  std::lock_guard lock(mutex_);
  given_up_ = true;
}

int Interrupts::stopped() const {
  std::lock_guard lock(mutex_);
  return exit_code_;
}

bool Interrupts::past_give_up() const {
  std::lock_guard lock(mutex_);
  return given_up_ || (give_up_at_ && std::chrono::steady_clock::now() >= *give_up_at_);
}

void leave_now(int exit_code, const std::string& provider, const std::string& what_is_left) {
  std::cerr << "sbx: stopped waiting for provider '" << provider << "'; " << what_is_left << "\n";
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

std::string created_sandbox_left(const sbx::Host& host, const std::string& provider,
                                 const std::string& sandbox_id) {
  const auto run = host.labels().find("sbx.run");
  return (sandbox_id.empty() ? std::string("a sandbox it was creating") : "sandbox " + sandbox_id) +
         " may still exist. Remove it with: sbx reap --provider " + provider +
         " --label sbx.run=" + (run == host.labels().end() ? "?" : run->second);
}

}  // namespace sbx::cli
