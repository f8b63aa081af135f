// Implementation detail of operation.hpp: the state an Operation<T> handle shares with the host's
// side of the plugin call that completes it.
//
// An operation ends exactly once, whichever comes first: the plugin completes it, or the host
// abandons it (its deadline passed, or it was cancelled and the plugin did not confirm in time;
// see core/src/calls.cpp). What the plugin does after that is ignored.
#pragma once

#include <sbx/abi/provider.h>
#include <sbx/core/errors.hpp>

#include <atomic>
#include <chrono>
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

// What every operation's state has, whatever its value type. THREADING: all members are
// thread-safe.
class OpBase : public std::enable_shared_from_this<OpBase> {
 public:
  explicit OpBase(std::shared_ptr<Generation> generation, const char* kind);
  virtual ~OpBase();  // releases the plugin's handle
  OpBase(const OpBase&) = delete;
  OpBase& operator=(const OpBase&) = delete;

  const char* kind() const noexcept { return kind_; }
  const std::shared_ptr<Generation>& generation() const noexcept { return generation_; }

  // Attaches the plugin's handle (may be NULL) after the start call returned; applies a
  // cancellation requested before that.
  void attach(sbx_operation* handle);

  // Asks the plugin to stop. If the operation has not ended within the host's cancel grace, the
  // host abandons it with CancelledError. Idempotent.
  void cancel();
  // Asks the plugin to stop, without arming the cancel grace; false if the operation had ended.
  bool request_cancel();
  // sbx.flow/1 (ABI 1.3): asks the provider to hold (true) or release (false) the operation's
  // output. False when it cannot: the provider has no such extension, or this operation's output
  // cannot be held. A hold asked before the plugin's handle is known is applied when it is.
  // Nothing after the operation ended (true).
  bool hold_output(bool hold);

  // Ends the operation with `error` on the host's side, unless it has ended already; then runs the
  // abandon hook (which releases what the host lent the plugin, e.g. a download's temporary file).
  // Returns whether it ended the operation.
  bool abandon(const Error& error);
  // What abandon() must undo; set before the operation starts. Runs at most once, on the
  // abandoning thread, never under this state's lock.
  void on_abandon(std::function<void()> hook) { abandon_hook_ = std::move(hook); }
  bool abandoned() const noexcept { return abandoned_.load(); }

  // The id under which the host's deadline timer keeps this operation's entries (assigned on
  // first use), and taking them out once it has ended (calls.cpp).
  uint64_t arm_timer();
  uint64_t timer_id() const noexcept { return timer_id_.load(); }
  void disarm() noexcept;

  // For operations whose deadline counts from their last progress (file transfers).
  void touch() noexcept;
  std::chrono::steady_clock::time_point last_progress() const noexcept;

  bool ready() const;
  void wait() const;
  template <class Clock, class Duration>
  bool wait_until(std::chrono::time_point<Clock, Duration> deadline) const {
    std::unique_lock lock(mutex_);
    return cv_.wait_until(lock, deadline, [&] { return done_; });
  }
  void then(std::function<void()> fn);

  // Errors are kept as values and thrown anew by each get(): an exception object is never shared
  // between the completing thread and the waiting one.
  void fail(const Error& error) {
    finish([&] { store_error(error); });
  }
  void fail(const std::exception_ptr& error) { fail(to_error(error)); }

  // Errors of this operation end a create: they are raised as CreateError (errors.hpp). Set before
  // the operation starts.
  void mark_create() noexcept { create_ = true; }

 protected:
  // Stores the outcome and wakes the waiters, unless the operation has ended already (the first
  // outcome wins, e.g. a throwing output callback's error, or the host's abandonment).
  template <class F>
  bool finish(F&& store) {
    std::vector<std::function<void()>> continuations;
    {
      std::lock_guard lock(mutex_);
      if (done_) return false;
      store();
      done_ = true;
      continuations.swap(continuations_);
    }
    cv_.notify_all();
    disarm();
    for (auto& continuation : continuations)
      continuation();
    return true;
  }
  void store_error(const Error& error) {
    error_.emplace(error);
    if (create_) error_->set_create_failure();
  }
  // Under the lock: rethrows the stored error, if any.
  void throw_if_failed_locked() const {
    if (error_) throw_error(*error_);
  }

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;

 private:
  std::shared_ptr<Generation> generation_;  // keeps the plugin loaded while the handle lives
  const char* kind_;                        // "exec", "create", ... for messages
  sbx_operation* handle_ = nullptr;
  std::optional<bool> hold_;  // the last hold_output asked, applied at attach when asked before
  bool cancel_requested_ = false;
  bool cancel_grace_armed_ = false;
  bool create_ = false;
  bool done_ = false;
  std::optional<Error> error_;
  std::vector<std::function<void()>> continuations_;
  std::function<void()> abandon_hook_;
  std::atomic<bool> abandoned_{false};
  std::atomic<int64_t> last_progress_ns_{0};
  std::atomic<uint64_t> timer_id_{0};
};

template <class T>
class OpState final : public OpBase {
 public:
  using OpBase::OpBase;

  template <class... A>
  bool succeed(A&&... args) {
    return finish([&] { value_.emplace(std::forward<A>(args)...); });
  }

  // The outcome, once ready: moves the value out (once) or rethrows the error.
  T take() {
    wait();
    std::lock_guard lock(mutex_);
    throw_if_failed_locked();
    if (!value_) throw std::logic_error("sbx::Operation::get() called twice");
    T out = std::move(*value_);
    value_.reset();
    return out;
  }

 private:
  std::optional<T> value_;
};

struct Unit {};

}  // namespace sbx::detail
