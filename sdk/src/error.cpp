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
Error Error::sandbox_gone(std::string m) {
  return {SBX_STATUS_NOT_FOUND, std::move(m), ErrorDetails{.reason = SBX_REASON_SANDBOX_GONE}};
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
Error Error::resource_exhausted(std::string m, bool retryable) {
  return {SBX_STATUS_RESOURCE_EXHAUSTED, std::move(m), retryable_if(retryable)};
}
Error Error::failed_precondition(std::string m) {
  return {SBX_STATUS_FAILED_PRECONDITION, std::move(m)};
}
Error Error::unimplemented(std::string m) {
  return {SBX_STATUS_UNIMPLEMENTED, std::move(m)};
}
Error Error::permission_denied(std::string m) {
  return {SBX_STATUS_PERMISSION_DENIED, std::move(m)};
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
  return sbx_status_name(status);
}

}  // namespace sbx::sdk
