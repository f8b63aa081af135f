// What sbx::Sandbox's calls share (sandbox.cpp, terminals.cpp): the sandbox reference every
// operation holds, the contexts of exec and of value-less operations, the deadlines, the checks of
// a sandbox handle and the lookup of an extension table.
#pragma once

#include "abi_glue.hpp"
#include "calls.hpp"

#include <sbx/core/sandbox.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace sbx::detail {

inline OpDeadline call_deadline(const Generation& g) {
  return {g.deadlines.call(), OpDeadline::From::start, "the host's limit for this call"};
}

// Every operation on a sandbox keeps its state (and so the plugin's handle) alive until it
// completes: a handle is released only when no operation on it is pending.
struct SandboxRef {
  std::shared_ptr<SandboxState> sandbox;
};

// Operations without a value (upload, download, close) complete through one thunk; each context
// says in finish() what success and failure mean for it.
template <class Ctx>
void SBX_ABI done_thunk(void* token, const sbx_error* error) {
  CallbackScope scope;
  const std::shared_ptr<Ctx> ctx = calls::complete<Ctx>(token, "on_complete");
  if (!ctx || calls::late(*ctx)) return;
  in_callback(*ctx->state, [&] { ctx->finish(error); });
}

struct DoneCtx : CallCtx, SandboxRef {
  using CallCtx::CallCtx;
  std::shared_ptr<OpState<Unit>> state;
  void finish(const sbx_error* error) {
    if (error) {
      state->fail(plugin_error(*sandbox->generation, error, state->kind()));
      return;
    }
    state->succeed();
  }
};

// Operations that complete like close without touching the sandbox's state (pause, resume, and
// the calls on sessions and terminals), one context kind each.
template <CallKind K>
struct PlainDoneCtx : DoneCtx {
  static constexpr CallKind kKind = K;
  PlainDoneCtx() : DoneCtx(kKind) {}
};

struct ExecCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::exec;
  ExecCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<ExecResult>> state;
  std::function<void(OutputStream, std::string_view)> on_output;

  // A caller's callback that throws ends the exec with that error: the command is cancelled and
  // the callback sees no further output (the caller may have returned from exec() already).
  static void SBX_ABI output(void* token, int32_t stream, sbx_bytes chunk) {
    CallbackScope scope;
    const std::shared_ptr<ExecCtx> ctx = calls::find<ExecCtx>(token, "on_output");
    if (!ctx || ctx->state->ready() || ctx->state->abandoned()) return;
    if (!chunk.data && chunk.len > 0) return;  // nothing to read; the completion will tell
    try {
      ctx->on_output(stream == SBX_STREAM_STDERR ? OutputStream::err : OutputStream::out,
                     std::string_view(reinterpret_cast<const char*>(chunk.data), chunk.len));
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      ctx->state->cancel();  // before fail(): a completed state ignores cancel
      ctx->state->fail(error);
    }
  }
  static void SBX_ABI on_complete(void* token, const sbx_exec_result* result,
                                  const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<ExecCtx> ctx = calls::complete<ExecCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    const Generation& g = *ctx->sandbox->generation;
    in_callback(*ctx->state, [&] {
      if (!result) return ctx->state->fail(plugin_error(g, error, "exec"));
      if (!SBX_HAS_FIELD(result, sbx_exec_result, stderr_bytes)) {
        return ctx->state->fail(InternalError(
            describe(g) + " completed an exec with an sbx_exec_result of " +
            std::to_string(result->struct_size) + " bytes; ABI 1.0 defines " +
            std::to_string(offsetof(sbx_exec_result, stderr_bytes) + sizeof(sbx_bytes))));
      }
      if ((!result->stdout_bytes.data && result->stdout_bytes.len) ||
          (!result->stderr_bytes.data && result->stderr_bytes.len)) {
        return ctx->state->fail(
            InternalError(describe(g) + " completed an exec with output bytes at NULL"));
      }
      ExecResult r;
      r.stdout_text.assign(reinterpret_cast<const char*>(result->stdout_bytes.data),
                           result->stdout_bytes.len);
      r.stderr_text.assign(reinterpret_cast<const char*>(result->stderr_bytes.data),
                           result->stderr_bytes.len);
      r.return_code = result->return_code;
      if (result->error_type.data) r.error_type = base::utf8::sanitize(copy_of(result->error_type));
      ctx->state->succeed(std::move(r));
    });
  }
};

// The seed's message for a Sandbox with no handle (never created, moved from, or detached).
[[noreturn]] inline void not_started() {
  throw FailedPreconditionError("Sandbox has not been started");
}

inline const SandboxState& started(const std::shared_ptr<SandboxState>& s) {
  if (!s) not_started();
  return *s;
}

inline void require_open(const std::shared_ptr<SandboxState>& s) {
  if (started(s).closed.load()) throw FailedPreconditionError("Sandbox " + s->id + " is closed");
}

// The extension table `id` of the sandbox's provider, when it reaches `last_field_end` (the end of
// the last field of the extension's first revision), or UnimplementedError naming what is missing.
template <class Table>
const Table& extension(const Generation& g, const char* id, size_t last_field_end,
                       const char* what) {
  const auto* table = static_cast<const Table*>(g.extension(id));
  if (!table || table->struct_size < last_field_end) {
    throw UnimplementedError("provider '" + g.name + "' does not support " + what + " (" + id +
                             ")");
  }
  return *table;
}
#define SBX_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

}  // namespace sbx::detail
