#include <sbx/sdk/error.hpp>

#include <utility>

namespace sbx::sdk {
namespace {
ErrorDetails retryable_if(bool retryable) {
  ErrorDetails details;
  details.retryable = retryable;
  return details;
}
}  // namespace

Error::Error(sbx_status status, std::string message, ErrorDetails details)
    : std::runtime_error(std::string()),
      message_(std::move(message)),
      status_(status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : status),
      details_(std::move(details)) {}

Error Error::invalid_argument(std::string m) {
  return {SBX_STATUS_INVALID_ARGUMENT, std::move(m)};
}
Error Error::not_found(std::string m) {
  return {SBX_STATUS_NOT_FOUND, std::move(m)};
}
Error Error::timeout(std::string m) {
  return {SBX_STATUS_TIMEOUT, std::move(m), retryable_if(true)};
}
Error Error::cancelled(std::string m) {
  return {SBX_STATUS_CANCELLED, std::move(m)};
}
Error Error::unavailable(std::string m, bool retryable) {
  return {SBX_STATUS_UNAVAILABLE, std::move(m), retryable_if(retryable)};
}
Error Error::failed_precondition(std::string m) {
  return {SBX_STATUS_FAILED_PRECONDITION, std::move(m)};
}
Error Error::unimplemented(std::string m) {
  return {SBX_STATUS_UNIMPLEMENTED, std::move(m)};
}
Error Error::internal(std::string m) {
  return {SBX_STATUS_INTERNAL, std::move(m)};
}
Error Error::create_failed(std::string m, bool retryable) {
  return {SBX_STATUS_CREATE_FAILED, std::move(m), retryable_if(retryable)};
}
Error Error::create_verification_failed(std::string m) {
  return {SBX_STATUS_CREATE_VERIFICATION_FAILED, std::move(m), retryable_if(true)};
}

std::string_view status_name(sbx_status status) noexcept {
  switch (status) {
    case SBX_STATUS_OK:
      return "OK";
    case SBX_STATUS_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case SBX_STATUS_NOT_FOUND:
      return "NOT_FOUND";
    case SBX_STATUS_TIMEOUT:
      return "TIMEOUT";
    case SBX_STATUS_CANCELLED:
      return "CANCELLED";
    case SBX_STATUS_UNAVAILABLE:
      return "UNAVAILABLE";
    case SBX_STATUS_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case SBX_STATUS_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case SBX_STATUS_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case SBX_STATUS_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case SBX_STATUS_CREATE_FAILED:
      return "CREATE_FAILED";
    case SBX_STATUS_CREATE_VERIFICATION_FAILED:
      return "CREATE_VERIFICATION_FAILED";
    default:
      return "INTERNAL";
  }
}

}  // namespace sbx::sdk
