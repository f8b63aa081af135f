// Helpers for calling through the C ABI from the host: borrowed views of host values and error
// conversion. How asynchronous calls are made is in calls.hpp.
#pragma once

#include "internal.hpp"

#include <sbx/base/abi_views.hpp>
#include <sbx/base/time.hpp>
#include <sbx/base/utf8.hpp>
#include <sbx/core/detail/op_state.hpp>
#include <sbx/core/errors.hpp>
#include <sbx/core/operation.hpp>

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::detail {

// Seconds as the ABI's milliseconds, rounded up and capped (base::kForever), so that no value
// overflows the int64_t or a plugin's deadline arithmetic.
inline sbx_opt_i64 to_abi_ms(const std::optional<double>& seconds) {
  if (!seconds) return {false, 0};
  return {true, static_cast<int64_t>(base::seconds_to_ms(*seconds).count())};
}

// The layer-neutral ABI views (sbx/base/abi_views.hpp) under the names the host uses.
inline sbx_str view_of(std::string_view s) {
  return base::to_sbx(s);
}
using base::copy_of;
using base::optional_view;
inline SandboxStatus to_status(int32_t status) {
  switch (status) {
    case SBX_SANDBOX_STARTING:
      return SandboxStatus::starting;
    case SBX_SANDBOX_RUNNING:
      return SandboxStatus::running;
    case SBX_SANDBOX_STOPPED:
      return SandboxStatus::stopped;
    case SBX_SANDBOX_ERROR:
      return SandboxStatus::error;
    case SBX_SANDBOX_PAUSED:
      return SandboxStatus::paused;
    default:
      return SandboxStatus::unknown;
  }
}

// sbx_kv entries viewing a StringMap (which must outlive the list).
using KvList = base::KvListView;

// Collects what a plugin reports through an sbx_error_sink during a synchronous call.
struct ErrorCollector {
  sbx_status status = SBX_STATUS_OK;
  std::string message;
  sbx_error_sink sink{sizeof(sbx_error_sink), this, &ErrorCollector::report};

  ErrorCollector() = default;
  ErrorCollector(const ErrorCollector&) = delete;
  ErrorCollector& operator=(const ErrorCollector&) = delete;

  static void SBX_ABI report(void* ctx, const sbx_error* error) {
    if (!error) return;
    auto* self = static_cast<ErrorCollector*>(ctx);
    if (!SBX_HAS_FIELD(error, sbx_error, request_id)) {
      self->status = SBX_STATUS_INTERNAL;
      self->message = "(the plugin reported an error in an sbx_error of " +
                      std::to_string(error->struct_size) + " bytes, smaller than ABI 1.0's)";
      return;
    }
    self->status = error->status;
    self->message = base::utf8::sanitize(copy_of(error->message));
  }
};

// Runs a callback body; an exception fails the operation instead of escaping into the plugin.
// Every callback thunk opens a CallbackScope as its first statement, so that everything released
// while it runs (its context included) is covered.
template <class State, class F>
void in_callback(State& state, F&& body) noexcept {
  try {
    body();
  } catch (...) {
    state.fail(std::current_exception());
  }
}

}  // namespace sbx::detail
