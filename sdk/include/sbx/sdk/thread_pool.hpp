// An elastic thread pool: it starts threads on demand up to `max_threads` and lets idle ones exit
// after `idle_timeout`. The blocking adapter (blocking.hpp) runs provider methods on one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace sbx::sdk {

// A move-only `void()` callable (std::function needs copyable targets).
class Task {
 public:
  Task() = default;
  template <class F>
  Task(F f) : impl_(std::make_unique<Impl<F>>(std::move(f))) {}  // NOLINT(implicit)
  void operator()() { impl_->run(); }
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void run() = 0;
  };
  template <class F>
  struct Impl final : Base {
    explicit Impl(F f) : fn(std::move(f)) {}
    void run() override { fn(); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

class ThreadPool {
 public:
  struct Options {
    size_t max_threads = 64;
    std::chrono::milliseconds idle_timeout{30'000};
  };

  explicit ThreadPool(Options options);
  // Runs every queued task, then joins every thread. Must not be called from a pool thread.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues a task. [thread-safe] A task must not throw (the adapter's tasks catch everything).
  // If no thread can be started the task waits for a live one; if there is none, submit throws
  // std::system_error and the task is destroyed unrun.
  void submit(Task task);

  size_t thread_count() const;
  bool on_pool_thread() const;

 private:
  struct Worker {
    std::thread thread;
    bool finished = false;
  };
  void run_worker(std::list<Worker>::iterator self);
  void reap_finished_locked(std::list<Worker>& out);

  Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  std::list<Worker> workers_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace sbx::sdk
