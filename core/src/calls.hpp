// The host's side of every call into a plugin's asynchronous functions: how a plugin's callback
// finds the operation it belongs to, and how long the host waits for it.
//
// A plugin gets a token as callback `user_data`, never a pointer: the token is looked up in a
// process-wide table, so a completion called twice, a callback after completion, or a token of
// another kind of operation is reported (naming the plugin) and ignored, never a use-after-free.
//
// Every operation has a host-side deadline derived from its own timeouts (Deadlines). When it
// passes, the host asks the plugin to cancel; if the operation still has not ended after the
// cancel grace, the host abandons it: the caller gets a clear error at once, and whatever the
// plugin does later is ignored. The context stays in the table until the plugin completes (maybe
// never), so the streams and sandbox the host lent the plugin stay valid.
#pragma once

#include "internal.hpp"

#include <sbx/core/detail/op_state.hpp>
#include <sbx/core/operation.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace sbx::detail {

// The kinds of callbacks a token may be used with.
enum class CallKind {
  create,
  exec,
  upload,
  download,
  status,
  close,
  endpoint,
  list,
  reap,
  pause,
  resume,
  serialize,
  connect,
  renew,
  session_open,
  session_close,
  pty_open,
  pty_attach,
  pty_write,
  pty_resize,
  pty_close
};
const char* call_kind_name(CallKind kind) noexcept;

// What a plugin's callback reaches through its token. One per started operation.
struct CallCtx {
  explicit CallCtx(CallKind kind) : kind(kind) {}
  virtual ~CallCtx() = default;
  CallCtx(const CallCtx&) = delete;
  CallCtx& operator=(const CallCtx&) = delete;

  // Called once if the host abandons the operation, before the caller hears of it: from then on
  // the context refuses the plugin's late work (writes, reads) and releases what it holds.
  virtual void on_abandoned() {}

  const CallKind kind;
  std::shared_ptr<OpBase> op;
};

// When the host gives up on an operation, counted from its start (or, for transfers, from its
// last progress).
struct OpDeadline {
  enum class From { start, progress };
  std::optional<std::chrono::milliseconds> after;  // none: only cancellation bounds it
  From from = From::start;
  std::string why;  // e.g. "its timeout of 2 s plus 30 s of grace", for the message
};

namespace calls {

// Registers `ctx` (whose `op` is set) and returns the token to pass as user_data.
void* enroll(std::shared_ptr<CallCtx> ctx);

// The context of a callback that comes before completion (on_output, on_item); null when the
// token is unknown or of another kind (reported once per plugin and kind of mistake).
template <class Ctx>
std::shared_ptr<Ctx> find(void* token, const char* callback);

// The context of a completion, taken out of the table; null when the operation completed before
// (a second completion) or the token is unknown or of another kind (reported, naming the plugin).
template <class Ctx>
std::shared_ptr<Ctx> complete(void* token, const char* callback);

// The generation a token was made for, while it lives (for a sandbox handed over by a completion
// that came too often: it must be closed).
std::shared_ptr<Generation> generation_of(void* token);

// True (and logged) when a completion arrives for an operation the host abandoned: its outcome
// is dropped (a created sandbox is closed by the caller of this check).
bool late(const CallCtx& ctx);

// Arms the host-side deadline of a started operation.
void arm(const std::shared_ptr<OpBase>& op, const OpDeadline& deadline);

// Schedules the abandonment of a cancelled operation after the provider's cancel grace.
void abandon_after_cancel(const std::shared_ptr<OpBase>& op);

std::shared_ptr<CallCtx> find_any(void* token, CallKind kind, const char* callback);
std::shared_ptr<CallCtx> complete_any(void* token, CallKind kind, const char* callback);

}  // namespace calls

template <class Ctx>
std::shared_ptr<Ctx> calls::find(void* token, const char* callback) {
  return std::static_pointer_cast<Ctx>(find_any(token, Ctx::kKind, callback));
}

template <class Ctx>
std::shared_ptr<Ctx> calls::complete(void* token, const char* callback) {
  return std::static_pointer_cast<Ctx>(complete_any(token, Ctx::kKind, callback));
}

// "provider 'docker' (plugin /path/local_docker.so)", for messages about a plugin's behaviour.
std::string describe(const Generation& generation);

// The error a plugin reported, checked: an sbx_error smaller than ABI 1.0 defines, or none at all
// where one was due, is the plugin's bug and reported as INTERNAL naming it. Invalid UTF-8 in the
// message is replaced, so logs and JSON stay valid.
Error plugin_error(const Generation& generation, const sbx_error* error, const char* call);

// Starts an operation: `start(token)` calls the plugin's start function and returns its handle.
// `ctx` is registered before the call (the plugin may complete inside it); the deadline is armed
// after it.
template <class T, class Ctx, class Start>
Operation<std::conditional_t<std::is_same_v<T, Unit>, void, T>> start_operation(
    std::shared_ptr<Generation> generation, std::shared_ptr<Ctx> ctx, const OpDeadline& deadline,
    Start&& start) {
  auto state = std::make_shared<OpState<T>>(std::move(generation), call_kind_name(Ctx::kKind));
  if constexpr (Ctx::kKind == CallKind::create) state->mark_create();
  ctx->state = state;
  ctx->op = state;
  state->on_abandon([weak = std::weak_ptr<Ctx>(ctx)] {
    if (auto c = weak.lock()) c->on_abandoned();
  });
  void* token = calls::enroll(ctx);
  ctx.reset();
  state->attach(start(token));
  calls::arm(state, deadline);
  return Operation<std::conditional_t<std::is_same_v<T, Unit>, void, T>>(state);
}

}  // namespace sbx::detail
