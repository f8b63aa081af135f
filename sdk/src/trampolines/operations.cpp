// Operations: the reference-counted state behind each sbx_operation handle and each Completion,
// and exactly-once delivery of the outcome. The op classes of the provider table are in
// operations.hpp; exec's in exec.cpp; upload's and download's in streams.cpp.

#include "internal.hpp"

#include <mutex>
#include <unordered_set>

#include "../immortal.hpp"

namespace sbx::sdk::detail {
namespace {

// The handles the host holds and has not released, for the checks: a handle is looked up here
// before it is dereferenced, so a released one is reported instead of touched.
struct LiveHandles {
  std::mutex mutex;
  std::unordered_set<const sbx_operation*> handles;
};
LiveHandles& live_handles() {
  return immortal<LiveHandles>();  // a host may release a handle while the process exits
}

}  // namespace

void forget_handle_table() noexcept {
  LiveHandles& live = live_handles();
  std::lock_guard lock(live.mutex);
  // Handles still live after the last deinit were never released: the host broke the contract,
  // and they stay known (leaked) rather than become unchecked.
  if (live.handles.empty()) std::unordered_set<const sbx_operation*>().swap(live.handles);
}

OpBase::OpBase() {
  handle_.struct_size = sizeof(sbx_operation);
  handle_.plugin_data = this;
  handle_.cancel = &OpBase::cancel_thunk;
  handle_.release = &OpBase::release_thunk;
}

sbx_operation* OpBase::host_handle() noexcept {
  add_ref();
  {
    LiveHandles& live = live_handles();
    std::lock_guard lock(live.mutex);
    try {
      live.handles.insert(&handle_);
    } catch (...) {  // out of memory: this handle goes unchecked
    }
  }
  return &handle_;
}

void OpBase::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

OpBase* OpBase::of_host_handle(sbx_operation* op, const char* call) noexcept {
  LiveHandles& live = live_handles();
  std::lock_guard lock(live.mutex);
  if (!op || !live.handles.count(op)) {
    checks::violation(plugin_host(), call);
    return nullptr;
  }
  // The host's reference keeps the op alive until its release, which must not race with this call.
  return static_cast<OpBase*>(op->plugin_data);
}

void SBX_ABI OpBase::cancel_thunk(sbx_operation* op) {
  {
    LiveHandles& live = live_handles();
    std::lock_guard lock(live.mutex);
    if (!live.handles.count(op)) {
      checks::violation(plugin_host(), "sbx_operation.cancel on a handle already released");
      return;
    }
  }
  // The host's reference keeps the op alive until its release, which must not race with this call.
  static_cast<OpBase*>(op->plugin_data)->stop_.request_stop();
}

void SBX_ABI OpBase::release_thunk(sbx_operation* op) {
  {
    LiveHandles& live = live_handles();
    std::lock_guard lock(live.mutex);
    if (live.handles.erase(op) == 0) {
      checks::violation(plugin_host(), "sbx_operation.release on a handle already released");
      return;
    }
  }
  static_cast<OpBase*>(op->plugin_data)->release();
}

void OpBase::on_dropped() noexcept {
  {
    std::lock_guard lock(start_mutex_);
    if (starting_) {
      dropped_ = true;  // reported by end_start(), where a thrown exception can take precedence
      return;
    }
  }
  fail(Error::internal("the provider dropped the operation without completing it"));
}

void OpBase::end_start(const std::exception_ptr& error) noexcept {
  bool dropped;
  {
    std::lock_guard lock(start_mutex_);
    starting_ = false;
    dropped = dropped_;
  }
  if (error) {
    fail(exception_to_error(error));
  } else if (dropped) {
    fail(Error::internal("the provider dropped the operation without completing it"));
  }
}

// ---- Completion ---------------------------------------------------------------------------------

CompletionBase::CompletionBase(OpBase* op) : op_(op) {
  op_->add_ref();
}

CompletionBase& CompletionBase::operator=(CompletionBase&& other) noexcept {
  if (this != &other) {
    reset();
    op_ = std::exchange(other.op_, nullptr);
  }
  return *this;
}

CompletionBase::~CompletionBase() {
  reset();
}

void CompletionBase::reset() noexcept {
  if (auto* op = std::exchange(op_, nullptr)) {
    op->on_dropped();
    op->release();
  }
}

void CompletionBase::fail(const Error& error) {
  auto* op = std::exchange(op_, nullptr);
  if (!op) return;  // already completed, or moved from
  op->fail(error);
  op->release();
}

void CompletionBase::fail_current_exception() {
  fail(current_exception_to_error());
}

CancelToken CompletionBase::cancel_token() const {
  return op_ ? op_->token() : CancelToken();
}

}  // namespace sbx::sdk::detail

namespace sbx::sdk {

Completion<void>::Completion(detail::Op<void>* op) : detail::CompletionBase(op) {}

void Completion<void>::succeed() {
  auto* op = static_cast<detail::Op<void>*>(take());
  if (!op) return;  // already completed, or moved from
  if (op->claim()) op->deliver_value();
  op->release();
}

}  // namespace sbx::sdk

namespace sbx::sdk {

namespace detail {
namespace {
thread_local bool t_writes_may_wait = false;
}  // namespace

WritesMayWait::WritesMayWait() noexcept : outer_(t_writes_may_wait) {
  t_writes_may_wait = true;
}
WritesMayWait::~WritesMayWait() {
  t_writes_may_wait = outer_;
}
bool WritesMayWait::here() noexcept {
  return t_writes_may_wait;
}

bool OutputFlow::hold(const OpBase& op, bool hold) noexcept {
  std::function<void(bool)> handler;
  {
    std::lock_guard lock(mutex_);
    held_ = hold;
    if (op.completed()) return true;
    if (!handler_ && !blocking_) return false;
    handler = handler_;
  }
  cv_.notify_all();
  if (!handler) return true;
  try {
    handler(hold);
    return true;
  } catch (...) {
    return false;
  }
}

void OutputFlow::set_hold_handler(std::function<void(bool)> fn) {
  bool held = false;
  {
    std::lock_guard lock(mutex_);
    handler_ = fn;
    held = held_;
  }
  if (held && fn) fn(true);  // the host held it before the provider could say how
}

void OutputFlow::set_blocking_hold() {
  std::lock_guard lock(mutex_);
  blocking_ = true;
}

void OutputFlow::wait_while_held(const OpBase& op) {
  if (!WritesMayWait::here()) return;  // never on a thread that serves others (an event loop)
  std::unique_lock lock(mutex_);
  if (!blocking_ || !held_) return;
  cv_.wait(lock, op.token(), [&] { return !held_ || op.completed(); });
}

void OutputFlow::release_writers() noexcept {
  { std::lock_guard lock(mutex_); }
  cv_.notify_all();
}
}  // namespace detail

void ExecCompletion::on_hold(std::function<void(bool hold)> fn) const {
  if (*this && flow_) flow_->set_hold_handler(std::move(fn));
}

void ExecCompletion::hold_by_blocking_writes() const {
  if (*this && flow_) flow_->set_blocking_hold();
}

}  // namespace sbx::sdk
