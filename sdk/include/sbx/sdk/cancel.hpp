// Cancellation as seen by provider code: the standard std::stop_token. The SDK requests a stop when
// the host cancels the operation; providers poll `stop_requested()` or register a
// std::stop_callback that interrupts what they are blocked on.
#pragma once

#include <sbx/sdk/error.hpp>

#include <stop_token>

namespace sbx::sdk {

using CancelToken = std::stop_token;

// Throws Error::cancelled() when cancellation has been requested.
inline void throw_if_cancelled(const CancelToken& token) {
  if (token.stop_requested()) throw Error::cancelled();
}

}  // namespace sbx::sdk
