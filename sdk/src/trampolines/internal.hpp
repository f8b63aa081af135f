// What the trampolines' files share (sdk/src/trampolines/): the host's view of sandboxes and
// providers, the C error view, the contract checks, and the one template that starts every
// operation. Internal to the SDK; no exception leaves a C function of these files.
#pragma once

#include <sbx/abi/ext/connect.h>
#include <sbx/abi/ext/endpoint.h>
#include <sbx/abi/ext/flow.h>
#include <sbx/abi/ext/list_reap.h>
#include <sbx/abi/ext/pause.h>
#include <sbx/abi/ext/pty.h>
#include <sbx/abi/ext/renew.h>
#include <sbx/abi/ext/session.h>
#include <sbx/sdk/plugin.hpp>

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace sbx::sdk::detail {

// ---- Errors (errors.cpp) ------------------------------------------------------------------------

// Calls fn(const sbx_error*) with a borrowed view of `error`.
template <class F>
void with_c_error(const Error& error, F&& fn) noexcept {
  const std::string_view message = error.what();
  const sbx_error c{sizeof(sbx_error),
                    error.status(),
                    to_sbx(message),
                    error.retryable(),
                    error.http_status(),
                    error.request_id().empty() ? sbx_str{nullptr, 0} : to_sbx(error.request_id()),
                    error.reason().empty() ? sbx_str{nullptr, 0} : to_sbx(error.reason())};
  fn(&c);
}

// Hands `error` to a synchronous call's error sink, if the host gave a usable one.
void report(const sbx_error_sink* sink, const Error& error) noexcept;

// ---- Checks of the host's side of the contract (checks.cpp) -------------------------------------

namespace checks {

// SBX_SDK_CHECKS: "off" (nothing is logged), "strict" (report, then abort), anything else or unset
// (report: an ERROR line through the host's log, and the call fails where the ABI lets it).
// Whatever the mode, a sandbox handle the SDK does not know is never dereferenced.
enum class Mode { off, report, strict };
Mode mode() noexcept;
void set_mode(Mode mode) noexcept;  // for tests; the default comes from the environment

// Reports that the host broke the contract: `what` names the call and the fault. Logged through
// `host` when it can log, else to stderr; aborts in strict mode.
void violation(const sbx_host* host, std::string_view what) noexcept;

}  // namespace checks

// Gives back the memory of the table of live operation handles when no handle is live
// (operations.cpp); called by the last plugin_deinit, before the library may be unloaded.
void forget_handle_table() noexcept;

// ---- Sandboxes and providers as the host sees them ----------------------------------------------

struct ProviderBox;  // provider_table.cpp

// A sandbox handle: created when create or connect succeeds, deleted by release_sandbox.
struct SandboxBox {
  sbx_sandbox c{};
  std::unique_ptr<Sandbox> impl;

  explicit SandboxBox(std::unique_ptr<Sandbox> sandbox) : impl(std::move(sandbox)) {
    c.struct_size = sizeof(sbx_sandbox);
    c.id = to_sbx(impl->id());
    c.sandbox_data = this;
  }
};

// Hands a new sandbox to the host: registers it with the checks (provider_table.cpp). Throws
// (out of memory) with nothing registered.
SandboxBox* adopt_sandbox(const sbx_provider* p, std::unique_ptr<Sandbox> sandbox);

// The provider's Sandbox behind a handle from the host. Throws Error::failed_precondition (after
// reporting the violation) for a handle the provider did not give out or that was released.
Sandbox& sandbox_of(const sbx_provider* p, sbx_sandbox* s);

// The parts of a provider table entry's provider (provider_table.cpp).
ProviderBox& provider_of(const sbx_provider* p);
const Logger& log_of(const sbx_provider* p);
Provider& impl_of(const sbx_provider* p);
// The provider's sbx.session/1 and sbx.pty/1 (only called through their tables, which the host
// gets only when the provider offers them).
SessionExtension& session_of(const sbx_provider* p);
PtyExtension& pty_of(const sbx_provider* p);

// ---- Starting an operation ----------------------------------------------------------------------

// Reports (checks::violation) a start call of `what` without usable callbacks (checks.cpp).
void report_unusable_callbacks(const sbx_provider* p, const char* what) noexcept;

// A start call without usable callbacks cannot report anything: it starts nothing and returns NULL
// (and the checks report the host). Every callbacks struct ends with on_complete in ABI 1.0; a
// larger struct is from a later minor.
template <class Callbacks>
bool usable(const Callbacks* callbacks) {
  return callbacks && SBX_HAS_FIELD(callbacks, Callbacks, on_complete) && callbacks->on_complete;
}

// When not even the operation can be allocated, the host hears of it at once, with no handle. The
// callbacks differ only in what stands for "no result": nothing, NULL, or an unknown status.
template <class Callbacks>
void fail_unstarted(const Callbacks& cb, const sbx_error* e) {
  if constexpr (std::is_invocable_v<decltype(cb.on_complete), void*, const sbx_error*>) {
    cb.on_complete(cb.user_data, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_status_callbacks>) {
    cb.on_complete(cb.user_data, SBX_SANDBOX_UNKNOWN, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_renew_callbacks>) {
    cb.on_complete(cb.user_data, 0, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_pty_attach_callbacks>) {
    cb.on_complete(cb.user_data, 0, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_descriptor_callbacks> ||
                       std::is_same_v<Callbacks, sbx_session_callbacks>) {
    cb.on_complete(cb.user_data, sbx_str{nullptr, 0}, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_connect_callbacks>) {
    cb.on_complete(cb.user_data, nullptr, nullptr, e);
  } else {
    cb.on_complete(cb.user_data, nullptr, e);
  }
}

// The provider's Completion for an operation: Completion<T>, or for an exec ExecCompletion, whose
// operation is also the output sink (an overload in exec.cpp).
template <class T>
Completion<T> make_completion(Op<T>* op) {
  return Completion<T>(op);
}

// Starts one operation, the same way for every start function of the provider table:
// - refuses (NULL, reported as a host violation) callbacks that cannot report anything;
// - allocates the OpT (constructed from the callbacks and `op_args`), completing at once with
//   RESOURCE_EXHAUSTED and returning NULL when that fails;
// - hands the host its handle, runs `body(op, completion)` (which copies the borrowed arguments and
//   calls the provider) and turns a synchronous throw into the operation's error.
// `what` names the call in violation reports ("exec").
template <class OpT, class Callbacks, class Body, class... OpArgs>
sbx_operation* start_operation(const sbx_provider* p, const char* what, const Callbacks* cb,
                               Body&& body, OpArgs&&... op_args) noexcept {
  if (!usable(cb)) {
    report_unusable_callbacks(p, what);
    return nullptr;
  }
  OpT* op;
  try {
    op = new OpT(cb, std::forward<OpArgs>(op_args)...);
  } catch (...) {
    static const char kMessage[] = "out of memory starting the operation";
    const sbx_error e{sizeof(sbx_error),
                      SBX_STATUS_RESOURCE_EXHAUSTED,
                      {kMessage, sizeof(kMessage) - 1},
                      true,
                      0,
                      {nullptr, 0},
                      {nullptr, 0}};
    fail_unstarted(*cb, &e);
    return nullptr;
  }
  sbx_operation* handle = op->host_handle();
  std::exception_ptr error;
  try {
    body(*op, make_completion(op));
  } catch (...) {
    error = std::current_exception();
  }
  op->end_start(error);
  op->release();  // the trampoline's reference
  return handle;
}

// ---- Start functions defined in files of their own ----------------------------------------------

sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* req,
                                     const sbx_exec_callbacks* cb);  // exec.cpp
sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_upload_request* req,
                                       const sbx_done_callbacks* cb);  // streams.cpp
sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_download_request* req,
                                         const sbx_done_callbacks* cb);  // streams.cpp
sbx_operation* SBX_ABI session_run(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                   const sbx_exec_request* req,
                                   const sbx_exec_callbacks* cb);  // exec.cpp

// The extension tables of sbx.session/1 and sbx.pty/1 (terminals.cpp).
extern const sbx_provider_session kSessionTable;
extern const sbx_provider_pty kPtyTable;

}  // namespace sbx::sdk::detail
