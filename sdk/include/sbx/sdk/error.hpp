// The SDK's exception type. A provider throws sbx::sdk::Error (or anything else); the SDK's
// trampolines catch every exception and turn it into an sbx_error, so nothing crosses the C ABI.
#pragma once

#include <sbx/abi/types.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sbx::sdk {

// Extra detail carried with an error; all optional.
struct ErrorDetails {
  bool retryable = false;
  int32_t http_status = 0;
  std::string request_id;
  // The request may have taken effect before the failure: it was (possibly) sent and the
  // connection failed or timed out before the answer (see sbx::sdk::http). Repeating it may do
  // the work twice, so such an error is never `retryable`. Not carried across the C ABI: a
  // plugin reads it and decides (e.g. checks whether the sandbox exists before creating again).
  bool may_have_run = false;
  // Why, within the status, for a program to match (sbx_error.reason, ABI 1.2): an SBX_REASON_*
  // (sbx/abi/types.h) or the backend's own code; empty when there is none. A host older than 1.2
  // never sees it.
  std::string reason;
};

// An error with an ABI status code (SBX_STATUS_*) and the sbx_error details.
class Error : public std::runtime_error {
 public:
  Error(sbx_status status, std::string message, ErrorDetails details = {});

  const char* what() const noexcept override { return message_.c_str(); }

  sbx_status status() const noexcept { return status_; }
  bool retryable() const noexcept { return details_.retryable; }
  int32_t http_status() const noexcept { return details_.http_status; }
  const std::string& request_id() const noexcept { return details_.request_id; }
  bool may_have_run() const noexcept { return details_.may_have_run; }
  const std::string& reason() const noexcept { return details_.reason; }
  const ErrorDetails& details() const noexcept { return details_; }

  // Shorthands for the statuses (SBX_STATUS_*, sbx/abi/types.h), one each. `retryable` is set
  // for timeout and create_verification_failed, and where the parameter says so.
  static Error invalid_argument(std::string message);
  static Error not_found(std::string message);
  // NOT_FOUND with the reason SBX_REASON_SANDBOX_GONE (ABI 1.3): the call's sandbox no longer runs
  // (closed, expired, removed, its main process ended), as opposed to a missing file or terminal.
  static Error sandbox_gone(std::string message);
  static Error timeout(std::string message);
  static Error cancelled(std::string message = "operation cancelled");
  static Error unavailable(std::string message, bool retryable = true);
  // Quota, rate limit, disk full: retryable when waiting may help (a rate limit), not otherwise.
  static Error resource_exhausted(std::string message, bool retryable = false);
  static Error failed_precondition(std::string message);
  static Error unimplemented(std::string message);
  static Error permission_denied(std::string message);
  static Error internal(std::string message);
  static Error create_failed(std::string message, bool retryable = false);
  static Error create_verification_failed(std::string message);

 private:
  // The message lives in a plain std::string, not in std::runtime_error: libstdc++ shares
  // runtime_error's copy-on-write buffer between copies with reference counts ThreadSanitizer
  // cannot see, and errors are copied from one thread to another all the time.
  std::string message_;
  sbx_status status_;
  ErrorDetails details_;
};

// The name of a status code, e.g. "INVALID_ARGUMENT"; "UNKNOWN(<n>)" style text is not returned:
// unknown codes give "INTERNAL".
std::string_view status_name(sbx_status status) noexcept;

namespace detail {
// Maps an exception to an Error: sdk::Error as is, std::bad_alloc to RESOURCE_EXHAUSTED, any other
// exception to INTERNAL. The second form takes the exception being handled (INTERNAL if none).
Error exception_to_error(const std::exception_ptr& error) noexcept;
Error current_exception_to_error() noexcept;
}  // namespace detail

}  // namespace sbx::sdk
