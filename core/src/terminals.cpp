// sbx::Session and sbx::Pty (sbx/core/terminal.hpp) through sbx.session/1 and sbx.pty/1: each
// call one operation on the extension's table, checked as every other (calls.hpp).

#include "sandbox_calls.hpp"

#include <sbx/abi/ext/pty.h>
#include <sbx/abi/ext/session.h>
#include <sbx/base/utf8.hpp>
#include <sbx/core/sandbox.hpp>
#include <sbx/core/terminal.hpp>

#include <algorithm>
#include <utility>

namespace sbx {
namespace detail {
namespace {

const sbx_provider_session& session_table(const Generation& g) {
  return extension<sbx_provider_session>(g, SBX_EXT_SESSION,
                                         SBX_FIELD_END(sbx_provider_session, close), "sessions");
}
const sbx_provider_pty& pty_table(const Generation& g) {
  return extension<sbx_provider_pty>(g, SBX_EXT_PTY, SBX_FIELD_END(sbx_provider_pty, close),
                                     "terminals");
}

// An id from the caller (Sandbox::session, Sandbox::pty) or from a plugin: ext/session.h's form.
bool valid_id(std::string_view id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == ':' || c == '-';
  });
}

// open_session and open_pty complete with an id, made into a Session or a Pty.
template <CallKind K, class Handle>
struct OpenCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = K;
  OpenCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<Handle>> state;
  static void SBX_ABI on_complete(void* token, sbx_str id, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<OpenCtx> ctx = calls::complete<OpenCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    const Generation& g = *ctx->sandbox->generation;
    in_callback(*ctx->state, [&] {
      if (error || !id.data) return ctx->state->fail(plugin_error(g, error, call_kind_name(K)));
      const std::string text = copy_of(id);
      if (!valid_id(text)) {
        return ctx->state->fail(InternalError(
            describe(g) + " made an id that is not 1 to 128 bytes of [A-Za-z0-9_.:-]: \"" +
            base::utf8::sanitize(text.substr(0, 140)) + "\""));
      }
      ctx->state->succeed(Handle(ctx->sandbox, text));
    });
  }
};

struct AttachCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::pty_attach;
  AttachCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<int32_t>> state;
  std::function<void(OutputStream, uint64_t, std::string_view)> on_output;
  std::function<void()> on_attached;

  // A callback that throws ends the attachment with that error.
  void call(const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      state->cancel();
      state->fail(error);
    }
  }
  static void SBX_ABI attached(void* token) {
    CallbackScope scope;
    const std::shared_ptr<AttachCtx> ctx = calls::find<AttachCtx>(token, "on_attached");
    if (!ctx || ctx->state->ready() || ctx->state->abandoned() || !ctx->on_attached) return;
    ctx->call(std::exchange(ctx->on_attached, nullptr));  // once, whatever the plugin does
  }

  // As exec's: a callback that throws ends the attachment with that error.
  static void SBX_ABI output(void* token, int32_t stream, uint64_t offset, sbx_bytes data) {
    CallbackScope scope;
    const std::shared_ptr<AttachCtx> ctx = calls::find<AttachCtx>(token, "on_output");
    if (!ctx || ctx->state->ready() || ctx->state->abandoned()) return;
    if (!data.data && data.len > 0) return;
    ctx->call([&] {
      ctx->on_output(stream == SBX_STREAM_STDERR ? OutputStream::err : OutputStream::out, offset,
                     std::string_view(reinterpret_cast<const char*>(data.data), data.len));
    });
  }
  static void SBX_ABI on_complete(void* token, int32_t exit_code, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<AttachCtx> ctx = calls::complete<AttachCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (error) return ctx->state->fail(plugin_error(*ctx->sandbox->generation, error, "attach"));
      ctx->state->succeed(exit_code);
    });
  }
};

void require_id(const std::string& id, const char* what) {
  if (!valid_id(id)) {
    throw InvalidArgumentError(std::string(what) +
                               " id must be 1 to 128 bytes of [A-Za-z0-9_.:-], got \"" +
                               base::utf8::sanitize(id.substr(0, 140)) + "\"");
  }
}

template <CallKind K, class Start>
Operation<void> done_call(const std::shared_ptr<SandboxState>& s, Start&& start) {
  using Ctx = PlainDoneCtx<K>;
  auto ctx = std::make_shared<Ctx>();
  ctx->sandbox = s;
  const auto& g = s->generation;
  return start_operation<Unit>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token, &done_thunk<Ctx>};
    return start(callbacks);
  });
}

}  // namespace
}  // namespace detail

using detail::require_open;

// ---- Sandbox ------------------------------------------------------------------------------------

Operation<Session> Sandbox::open_session_async(SessionOptions options) {
  require_open(state_);
  const auto& g = state_->generation;
  const auto& ext = detail::session_table(*g);
  if (!options.cwd) options.cwd = state_->workdir;
  const detail::KvList env(options.env);
  const sbx_session_request request{sizeof(sbx_session_request), detail::optional_view(options.cwd),
                                    env.list(), detail::optional_view(options.user)};
  using Ctx = detail::OpenCtx<detail::CallKind::session_open, Session>;
  auto ctx = std::make_shared<Ctx>();
  ctx->sandbox = state_;
  return detail::start_operation<
      Session>(g, std::move(ctx), detail::call_deadline(*g), [&](void* token) {
    const sbx_session_callbacks callbacks{sizeof(sbx_session_callbacks), token, &Ctx::on_complete};
    return ext.open(g->provider, state_->handle, &request, &callbacks);
  });
}
Session Sandbox::open_session(SessionOptions options) {
  return open_session_async(std::move(options)).get();
}
Session Sandbox::session(std::string id) {
  require_open(state_);
  detail::session_table(*state_->generation);
  detail::require_id(id, "a session");
  return Session(state_, std::move(id));
}

Operation<Pty> Sandbox::open_pty_async(PtyOptions options) {
  require_open(state_);
  const auto& g = state_->generation;
  const auto& ext = detail::pty_table(*g);
  if (options.command) detail::require_utf8(*options.command, "the terminal's command");
  if (options.rows == 0 || options.cols == 0) {
    throw InvalidArgumentError("a terminal's rows and cols must be at least 1");
  }
  if (!options.cwd) options.cwd = state_->workdir;
  const detail::KvList env(options.env);
  const sbx_pty_request request{sizeof(sbx_pty_request),
                                detail::optional_view(options.command),
                                detail::optional_view(options.cwd),
                                env.list(),
                                detail::optional_view(options.user),
                                options.rows,
                                options.cols,
                                options.tty};
  using Ctx = detail::OpenCtx<detail::CallKind::pty_open, Pty>;
  auto ctx = std::make_shared<Ctx>();
  ctx->sandbox = state_;
  return detail::start_operation<
      Pty>(g, std::move(ctx), detail::call_deadline(*g), [&](void* token) {
    const sbx_session_callbacks callbacks{sizeof(sbx_session_callbacks), token, &Ctx::on_complete};
    return ext.open(g->provider, state_->handle, &request, &callbacks);
  });
}
Pty Sandbox::open_pty(PtyOptions options) {
  return open_pty_async(std::move(options)).get();
}
Pty Sandbox::pty(std::string id) {
  require_open(state_);
  detail::pty_table(*state_->generation);
  detail::require_id(id, "a terminal");
  return Pty(state_, std::move(id));
}

// ---- Session ------------------------------------------------------------------------------------

Session::Session(std::shared_ptr<detail::SandboxState> sandbox, std::string id)
    : sandbox_(std::move(sandbox)), id_(std::move(id)) {}

Operation<ExecResult> Session::run_async(std::string command, ExecOptions options) {
  require_open(sandbox_);
  options.validate();
  detail::require_utf8(command, "the command");
  const auto& g = sandbox_->generation;
  const auto& ext = detail::session_table(*g);
  auto ctx = std::make_shared<detail::ExecCtx>();
  ctx->sandbox = sandbox_;
  ctx->on_output = std::move(options.on_output);
  const bool streamed = static_cast<bool>(ctx->on_output);
  const detail::KvList env(options.env);
  const sbx_exec_request request{sizeof(sbx_exec_request),
                                 detail::view_of(command),
                                 detail::optional_view(options.cwd),
                                 env.list(),
                                 detail::to_abi_ms(options.timeout_s),
                                 {nullptr, 0},
                                 {nullptr, 0}};
  detail::OpDeadline deadline{g->deadlines.exec(), detail::OpDeadline::From::start,
                              "the host's limit for an exec without a timeout"};
  if (options.timeout_s) {
    deadline.after = Deadlines::ms(*options.timeout_s) + g->deadlines.grace();
    deadline.why = "its timeout plus the host's grace";
  }
  return detail::start_operation<ExecResult>(g, std::move(ctx), deadline, [&](void* token) {
    const sbx_exec_callbacks callbacks{sizeof(sbx_exec_callbacks), token,
                                       streamed ? &detail::ExecCtx::output : nullptr,
                                       &detail::ExecCtx::on_complete};
    return ext.run(g->provider, sandbox_->handle, detail::view_of(id_), &request, &callbacks);
  });
}
ExecResult Session::run(std::string_view command, ExecOptions options) {
  return run_async(std::string(command), std::move(options)).get();
}

Operation<void> Session::close_async() {
  require_open(sandbox_);
  const auto& ext = detail::session_table(*sandbox_->generation);
  return detail::done_call<detail::CallKind::session_close>(
      sandbox_, [&](const sbx_done_callbacks& cb) {
        return ext.close(sandbox_->generation->provider, sandbox_->handle, detail::view_of(id_),
                         &cb);
      });
}
void Session::close() {
  close_async().get();
}

// ---- Pty ----------------------------------------------------------------------------------------

Pty::Pty(std::shared_ptr<detail::SandboxState> sandbox, std::string id)
    : sandbox_(std::move(sandbox)), id_(std::move(id)) {}

Operation<int32_t> Pty::attach_async(PtyAttachOptions options) {
  require_open(sandbox_);
  if (!options.on_output) throw InvalidArgumentError("attach_pty needs an on_output callback");
  const auto& g = sandbox_->generation;
  const auto& ext = detail::pty_table(*g);
  auto ctx = std::make_shared<detail::AttachCtx>();
  ctx->sandbox = sandbox_;
  ctx->on_output = std::move(options.on_output);
  // A plugin built before ABI 1.3 never says the attachment is in place: it is taken to be once
  // the attach has started.
  const sbx_version abi = g->library->plugin().abi_version;
  const bool says_attached = abi.major > 1 || abi.minor >= 3;
  std::function<void()> started;
  (says_attached ? ctx->on_attached : started) = std::move(options.on_attached);
  const bool wants_attached = static_cast<bool>(ctx->on_attached);
  const uint64_t since = options.since.value_or(SBX_PTY_LIVE);
  const detail::OpDeadline deadline{std::nullopt, detail::OpDeadline::From::start,
                                    "an attachment lasts until it is cancelled"};
  auto op = detail::start_operation<int32_t>(g, std::move(ctx), deadline, [&](void* token) {
    const sbx_pty_attach_callbacks callbacks{
        sizeof(sbx_pty_attach_callbacks), token, &detail::AttachCtx::output,
        &detail::AttachCtx::on_complete, wants_attached ? &detail::AttachCtx::attached : nullptr};
    return ext.attach(g->provider, sandbox_->handle, detail::view_of(id_), since, options.takeover,
                      &callbacks);
  });
  if (started && !op.ready()) started();
  return op;
}

Operation<void> Pty::write_async(std::string input) {
  require_open(sandbox_);
  const auto& ext = detail::pty_table(*sandbox_->generation);
  return detail::done_call<detail::CallKind::pty_write>(
      sandbox_, [&](const sbx_done_callbacks& cb) {
        const sbx_bytes bytes{reinterpret_cast<const uint8_t*>(input.data()), input.size()};
        return ext.write(sandbox_->generation->provider, sandbox_->handle, detail::view_of(id_),
                         bytes, &cb);
      });
}
void Pty::write(std::string_view input) {
  write_async(std::string(input)).get();
}

Operation<void> Pty::resize_async(uint16_t rows, uint16_t cols) {
  require_open(sandbox_);
  if (rows == 0 || cols == 0) {
    throw InvalidArgumentError("a terminal's rows and cols must be at least 1");
  }
  const auto& ext = detail::pty_table(*sandbox_->generation);
  return detail::done_call<detail::CallKind::pty_resize>(
      sandbox_, [&](const sbx_done_callbacks& cb) {
        return ext.resize(sandbox_->generation->provider, sandbox_->handle, detail::view_of(id_),
                          rows, cols, &cb);
      });
}
void Pty::resize(uint16_t rows, uint16_t cols) {
  resize_async(rows, cols).get();
}

Operation<void> Pty::close_async() {
  require_open(sandbox_);
  const auto& ext = detail::pty_table(*sandbox_->generation);
  return detail::done_call<detail::CallKind::pty_close>(
      sandbox_, [&](const sbx_done_callbacks& cb) {
        return ext.close(sandbox_->generation->provider, sandbox_->handle, detail::view_of(id_),
                         &cb);
      });
}
void Pty::close() {
  close_async().get();
}

}  // namespace sbx
