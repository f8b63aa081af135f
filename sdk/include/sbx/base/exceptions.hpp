// The one mapping from a C++ exception to an ABI status, shared by the host (sbx::Error) and the
// SDK (sbx::sdk::Error), which each plug in their own error type. Layer-neutral (sbx::base).
// THREADING: pure; copies what it keeps of the exception.
#pragma once

#include <sbx/abi/types.h>
#include <sbx/base/json.hpp>

#include <exception>
#include <new>
#include <string>

namespace sbx::base {

// Maps the exception `error` to a value of the layer's error type `E`:
// - an `E` as it is;
// - a base::json::Error (a refused JSON value) to SBX_STATUS_INVALID_ARGUMENT;
// - std::bad_alloc to SBX_STATUS_RESOURCE_EXHAUSTED ("out of memory");
// - any other std::exception to SBX_STATUS_INTERNAL with its what();
// - anything else to SBX_STATUS_INTERNAL ("unknown exception").
// `make(sbx_status, std::string)` builds an `E`. If building the message itself throws (out of
// memory) the result is make(SBX_STATUS_RESOURCE_EXHAUSTED, {}) — an E whose construction must not
// throw then; both layers' errors hold an empty std::string without allocating.
template <class E, class Make>
E exception_to(const std::exception_ptr& error, Make&& make) noexcept {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const E& e) {
      return e;
    } catch (const json::Error& e) {
      return make(SBX_STATUS_INVALID_ARGUMENT, std::string(e.what()));
    } catch (const std::bad_alloc&) {
      return make(SBX_STATUS_RESOURCE_EXHAUSTED, std::string("out of memory"));
    } catch (const std::exception& e) {
      return make(SBX_STATUS_INTERNAL, std::string(e.what()));
    } catch (...) {
      return make(SBX_STATUS_INTERNAL, std::string("unknown exception"));
    }
  } catch (...) {
    return make(SBX_STATUS_RESOURCE_EXHAUSTED, std::string());
  }
}

}  // namespace sbx::base
