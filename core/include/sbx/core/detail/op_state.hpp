// Implementation detail of operation.hpp: the shared state between an Operation<T> handle and the
// C callback that completes it.
#pragma once

#include <sbx/abi/provider.h>
#include <sbx/core/errors.hpp>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace sbx::detail {

struct Generation;

// Marks the current thread as running inside a plugin callback while alive. Objects whose last
// reference drops on such a thread (a provider, a library) are destroyed later on a host thread,
// because a provider may not be destroyed from inside its own callbacks.
class CallbackScope {
 public:
  CallbackScope() noexcept;
  ~CallbackScope();
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  static bool active() noexcept;
};

template <class T>
class OpState {
 public:
  explicit OpState(std::shared_ptr<Generation> generation) : generation_(std::move(generation)) {}
  ~OpState() {
    if (handle_) handle_->release(handle_);
  }
  OpState(const OpState&) = delete;
  OpState& operator=(const OpState&) = delete;

  // Keeps the state alive until complete() runs (the plugin holds `this` as user_data).
  void hold(std::shared_ptr<OpState> self) { self_ = std::move(self); }

  // Attaches the plugin's handle (may be NULL) after the start call returned; applies a
  // cancellation requested before that.
  void attach(sbx_operation* handle) {
    bool cancel_now;
    {
      std::lock_guard lock(mutex_);
      handle_ = handle;
      cancel_now = cancel_requested_ && handle_ && !done_;
    }
    if (cancel_now) handle_->cancel(handle_);
  }

  void cancel() {
    sbx_operation* handle;
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      cancel_requested_ = true;
      handle = handle_;
    }
    // Not under the lock: a plugin may complete the operation from inside cancel().
    if (handle) handle->cancel(handle);
  }

  template <class... A>
  void succeed(A&&... args) {
    finish([&] { value_.emplace(std::forward<A>(args)...); });
  }
  // Errors are kept as values and thrown anew by each get(): an exception object is never shared
  // between the completing thread and the waiting one.
  void fail(const Error& error) {
    finish([&] { error_.emplace(error); });
  }
  void fail(const std::exception_ptr& error) { fail(to_error(error)); }
  void fail(const sbx_error& error) { fail(to_error(error)); }

  bool ready() const {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void wait() const {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
  }
  template <class Clock, class Duration>
  bool wait_until(std::chrono::time_point<Clock, Duration> deadline) const {
    std::unique_lock lock(mutex_);
    return cv_.wait_until(lock, deadline, [&] { return done_; });
  }

  // The outcome, once ready: moves the value out (once) or rethrows the error.
  T take() {
    wait();
    std::lock_guard lock(mutex_);
    if (error_) throw_error(*error_);
    if (!value_) throw std::logic_error("sbx::Operation::get() called twice");
    T out = std::move(*value_);
    value_.reset();
    return out;
  }

  void then(std::function<void()> fn) {
    {
      std::lock_guard lock(mutex_);
      if (!done_) {
        continuations_.push_back(std::move(fn));
        return;
      }
    }
    fn();
  }

 private:
  template <class F>
  void finish(F&& store) {
    std::vector<std::function<void()>> continuations;
    std::shared_ptr<OpState> self;
    {
      std::lock_guard lock(mutex_);
      if (done_) return;  // the first outcome wins (e.g. a throwing output callback's error)
      store();
      done_ = true;
      continuations.swap(continuations_);
      self = std::move(self_);
    }
    cv_.notify_all();
    for (auto& continuation : continuations)
      continuation();
    // `self` drops here, possibly destroying this state (and releasing the plugin's handle).
  }

  std::shared_ptr<Generation> generation_;  // keeps the plugin loaded while the handle lives
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  sbx_operation* handle_ = nullptr;
  bool cancel_requested_ = false;
  bool done_ = false;
  std::optional<T> value_;
  std::optional<Error> error_;
  std::vector<std::function<void()>> continuations_;
  std::shared_ptr<OpState> self_;
};

struct Unit {};

}  // namespace sbx::detail
