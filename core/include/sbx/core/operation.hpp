// Operation<T>: the asynchronous form of every sbx:: call. Start one (e.g. sandbox.exec_async),
// then wait for it, poll it, attach a continuation, or cancel it. The synchronous calls are
// `start(...).get()`.
//
// THREADING: an Operation may be shared between threads (copies share one state). Continuations
// run on the thread that completes the operation (usually a plugin thread): keep them short and do
// not block in them.
#pragma once

#include <sbx/core/detail/op_state.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace sbx {

template <class T>
class Operation {
  using Stored = std::conditional_t<std::is_void_v<T>, detail::Unit, T>;

 public:
  Operation() = default;
  explicit Operation(std::shared_ptr<detail::OpState<Stored>> state) : state_(std::move(state)) {}

  bool valid() const noexcept { return state_ != nullptr; }
  bool ready() const { return state_->ready(); }
  void wait() const { state_->wait(); }
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return state_->wait_until(std::chrono::steady_clock::now() + timeout);
  }

  // Waits, then returns the value or throws the sbx::Error subclass that ended the operation.
  // The value is moved out: call get() once.
  T get() {
    if constexpr (std::is_void_v<T>) {
      state_->take();
    } else {
      return state_->take();
    }
  }

  // Asks the provider to stop; the operation then ends with CancelledError unless it finished
  // first. Idempotent.
  void cancel() const { state_->cancel(); }

  // For an exec or a streamed download (sbx.flow/1, ABI 1.3; docs/flow-control.md): holds (true)
  // or releases (false) its output. While held, the provider stops reading it, so the command
  // waits on its output as on a terminal nobody reads (the download waits); at most 1 MiB already
  // read still reaches on_output (on_data). Returns false when the provider cannot hold it (its
  // output keeps coming). Any thread, also from inside on_output; nothing once the operation
  // ended.
  bool hold_output(bool hold) const { return state_->hold_output(hold); }

  // Runs `fn` once the operation is complete: immediately on this thread if it already is,
  // otherwise on the completing thread. Several continuations run in the order they were added.
  void then(std::function<void(Operation<T>&)> fn) const {
    state_->then([op = *this, fn = std::move(fn)]() mutable { fn(op); });
  }

 private:
  std::shared_ptr<detail::OpState<Stored>> state_;
};

}  // namespace sbx
