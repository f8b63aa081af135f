// Stopping a command that drives a sandbox (docs/decisions.md, 40 and 65): run, create, exec, cp,
// status, pause, resume and close all take their steps through an Interrupts object, so that
// SIGINT, SIGTERM and SIGHUP (exit 130), output nobody reads any more (141) and output that cannot
// be written (74) cancel the step in progress, the command ends within --stop-timeout, and a
// second signal ends the wait at once.
#pragma once

#include <sbx/sbx.hpp>

#include <signal.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace sbx::cli {

// Thrown by a step when the stop timeout passed (or a second signal came) before the provider
// finished what the stop asked of it. The command then calls leave_now.
struct GaveUp {};

// Signals are blocked in every thread and taken by sigwait in a thread of this object's, so no
// handler races with the rest of the program. Make it before the sbx::Host: the provider's threads
// must inherit the blocked signals. The step in progress is cancelled; a step that starts after the
// stop is cancelled as soon as it registers. From the first stop on, the steps that remain (the
// cancellation, closing the sandbox) have --stop-timeout between them; a second signal ends the
// wait at once.
class Interrupts {
 public:
  explicit Interrupts(std::chrono::milliseconds stop_timeout);
  ~Interrupts();
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;

  // Stops the command with `exit_code` (the first stop's code is kept): cancels the step in
  // progress and starts the stop timeout.
  void stop(int exit_code);
  // Ends the wait for the provider at once (a second signal).
  void give_up();
  // The exit code of the stop, or 0 while running.
  int stopped() const;

  // Runs one step of the command; a stop cancels it (and one that came before cancels it at
  // once). Throws GaveUp when the stop timeout passes first.
  template <class T>
  T step(sbx::Operation<T> op) {
    {
      std::lock_guard lock(mutex_);
      cancel_ = [op] { op.cancel(); };
    }
    if (stopped()) op.cancel();
    struct Clear {
      Interrupts& self;
      ~Clear() {
        std::lock_guard lock(self.mutex_);
        self.cancel_ = nullptr;
      }
    } clear{*this};
    return wait(std::move(op));
  }

  // For a download to `local`: when it is (or a link leads to) a FIFO, waits until a reader has it
  // open, as cp does, but ends the wait at a stop (false then). It keeps a write end open until
  // this object's next such call or its end, so the download's own open does not wait and the
  // reader sees no end of file before the download's. True at once for anything else.
  bool wait_for_fifo_reader(const std::string& local);

  // Waits for a step that a stop must not cancel (closing the sandbox), within the stop timeout
  // once there was a stop. Throws GaveUp when that passes first.
  template <class T>
  T wait(sbx::Operation<T> op) {
    // The operation's own wait wakes at its completion; the slices bound how late a give-up is
    // noticed. (No continuation on the operation: it could run after this object is gone.)
    while (!op.wait_for(std::chrono::milliseconds(50))) {
      if (past_give_up()) throw GaveUp{};
    }
    return op.get();
  }

 private:
  bool past_give_up() const;

  std::chrono::milliseconds stop_timeout_;
  sigset_t set_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::function<void()> cancel_;
  int exit_code_ = 0;
  bool given_up_ = false;
  std::optional<std::chrono::steady_clock::time_point> give_up_at_;
  int fifo_fd_ = -1;  // wait_for_fifo_reader's write end
};

// Leaves at once, without waiting for the provider any more: its threads may still be working on
// what was abandoned, so no destructor runs. Prints "sbx: stopped waiting for provider 'P'; " and
// `what_is_left`, flushes, and exits with `exit_code`.
[[noreturn]] void leave_now(int exit_code, const std::string& provider,
                            const std::string& what_is_left);

// What leave_now says of a sandbox this process created and could not close: that it may still
// exist and the `sbx reap` command (by this process's sbx.run label) that removes it.
std::string created_sandbox_left(const sbx::Host& host, const std::string& provider,
                                 const std::string& sandbox_id);

}  // namespace sbx::cli
