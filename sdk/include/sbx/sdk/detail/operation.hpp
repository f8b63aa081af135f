// Implementation detail of provider.hpp: the state of one operation, shared by the handle given to
// the host (sbx_operation), the provider's Completion and the trampoline that started it.
#pragma once

#include <sbx/abi/provider.h>
#include <sbx/sdk/error.hpp>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <stop_token>

namespace sbx::sdk::detail {

// Reference counted: one reference for the starting trampoline, one for the host's handle, one per
// live Completion. Completion is claimed exactly once (claim()).
class OpBase {
 public:
  OpBase();
  virtual ~OpBase() = default;
  OpBase(const OpBase&) = delete;
  OpBase& operator=(const OpBase&) = delete;

  // The handle for the host; takes the host's reference.
  sbx_operation* host_handle() noexcept;
  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  std::stop_token token() const noexcept { return stop_.get_token(); }
  // True for exactly one caller: the one that delivers the outcome.
  bool claim() noexcept { return !completed_.exchange(true, std::memory_order_acq_rel); }
  bool completed() const noexcept { return completed_.load(std::memory_order_acquire); }

  void fail(const Error& error) noexcept {
    if (claim()) deliver_error(error);
  }
  // A Completion was destroyed without completing.
  void on_dropped() noexcept;
  // The provider's start call returned (error == nullptr) or threw.
  void end_start(const std::exception_ptr& error) noexcept;

  // sbx.flow/1 (ABI 1.3): holds or releases this operation's output; false when it cannot be held
  // (only an exec's or a download's can: OutputFlow).
  virtual bool hold_output(bool /*hold*/) noexcept { return false; }
  // The operation behind a handle the host holds, or null (reported as the host's mistake, with
  // `what`) for a handle it released or never had.
  static OpBase* of_host_handle(sbx_operation* op, const char* call) noexcept;

 protected:
  virtual void deliver_error(const Error& error) noexcept = 0;

 private:
  static void SBX_ABI cancel_thunk(sbx_operation* op);
  static void SBX_ABI release_thunk(sbx_operation* op);

  sbx_operation handle_{};
  std::atomic<int> refs_{1};
  std::atomic<bool> completed_{false};
  std::stop_source stop_;
  std::mutex start_mutex_;
  bool starting_ = true;
  bool dropped_ = false;
};

// Marks, for its scope, the calling thread as one whose writes to an exec's output may wait while
// the host holds it (the blocking adapter's pool thread running a provider's exec). Writes from
// any other thread never wait.
class WritesMayWait {
 public:
  WritesMayWait() noexcept;
  ~WritesMayWait();
  WritesMayWait(const WritesMayWait&) = delete;
  WritesMayWait& operator=(const WritesMayWait&) = delete;
  static bool here() noexcept;

 private:
  bool outer_;
};

// How an operation's output (an exec's, a download's) is held, the way its provider said: by the
// provider's handler (ExecCompletion::on_hold, ByteSink::on_hold), or by its writes, which wait
// while held (hold_by_blocking_writes). Thread-safe.
class OutputFlow {
 public:
  // The host's hold_output for `op`: true when held (released), false when it cannot be.
  bool hold(const OpBase& op, bool hold) noexcept;
  void set_hold_handler(std::function<void(bool hold)> fn);
  void set_blocking_hold();
  // A write of a blocking hold, on a WritesMayWait thread: waits while the output is held, until
  // it is released, the operation is cancelled or it completed. Elsewhere returns at once.
  void wait_while_held(const OpBase& op);
  // The operation completed: writes waiting go on (and find it completed).
  void release_writers() noexcept;

 private:
  std::mutex mutex_;
  std::condition_variable_any cv_;
  bool held_ = false;
  bool blocking_ = false;
  std::function<void(bool)> handler_;
};

template <class T>
class Op : public OpBase {
 public:
  virtual void deliver_value(T&& value) noexcept = 0;
};

template <>
class Op<void> : public OpBase {
 public:
  virtual void deliver_value() noexcept = 0;
};

}  // namespace sbx::sdk::detail

namespace sbx::sdk {

template <class T>
Completion<T>::Completion(detail::Op<T>* op) : detail::CompletionBase(op) {}

template <class T>
void Completion<T>::succeed(T value) {
  auto* op = static_cast<detail::Op<T>*>(take());
  if (!op) return;  // already completed, or moved from
  if (op->claim()) op->deliver_value(std::move(value));
  op->release();
}

}  // namespace sbx::sdk
