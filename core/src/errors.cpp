#include <sbx/base/abi_views.hpp>
#include <sbx/base/exceptions.hpp>
#include <sbx/core/errors.hpp>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

namespace sbx {

Error::Error(sbx_status status, const std::string& message, bool retryable, int32_t http_status,
             std::string request_id)
    : std::runtime_error(std::string()),
      message_(message),
      status_(status),
      retryable_(retryable),
      http_status_(http_status),
      request_id_(std::move(request_id)) {}

std::string_view Error::status_name() const noexcept {
  return sbx_status_name(status_);
}

namespace {

template <class E>
[[noreturn]] void raise(const Error& source) {
  E error(source.what(), source.retryable(), source.http_status(), source.request_id());
  error.set_reason(source.reason());
  error.set_local_errno(source.local_errno());
  if (source.create_failure()) error.set_create_failure();
  throw error;
}

[[noreturn]] void raise_status(const Error& e) {
  // A failed create is a CreateError whatever the reason (the seed's rule); the reason stays in
  // status(). Readiness failures keep their subclass, cancellations stay CancelledError.
  if (e.create_failure() && e.status() != SBX_STATUS_CANCELLED &&
      e.status() != SBX_STATUS_CREATE_VERIFICATION_FAILED) {
    CreateError error(e.status(), e.what(), e.retryable(), e.http_status(), e.request_id());
    error.set_reason(e.reason());
    error.set_local_errno(e.local_errno());
    throw error;
  }
  switch (e.status()) {
    case SBX_STATUS_INVALID_ARGUMENT:
      raise<InvalidArgumentError>(e);
    case SBX_STATUS_NOT_FOUND:
      raise<NotFoundError>(e);
    case SBX_STATUS_TIMEOUT:
      raise<TimeoutError>(e);
    case SBX_STATUS_CANCELLED:
      raise<CancelledError>(e);
    case SBX_STATUS_UNAVAILABLE:
      raise<UnavailableError>(e);
    case SBX_STATUS_RESOURCE_EXHAUSTED:
      raise<ResourceExhaustedError>(e);
    case SBX_STATUS_FAILED_PRECONDITION:
      raise<FailedPreconditionError>(e);
    case SBX_STATUS_UNIMPLEMENTED:
      raise<UnimplementedError>(e);
    case SBX_STATUS_PERMISSION_DENIED:
      raise<PermissionDeniedError>(e);
    case SBX_STATUS_CREATE_FAILED:
      raise<CreateError>(e);
    case SBX_STATUS_CREATE_VERIFICATION_FAILED:
      raise<CreateVerificationError>(e);
    default:
      raise<InternalError>(e);
  }
}

}  // namespace

Error to_error(const sbx_error& error) {
  // ABI 1.0 defines every field but `reason` (1.2); a smaller struct keeps what it has.
  Error e(error.status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : error.status,
          SBX_HAS_FIELD(&error, sbx_error, message) ? base::copy_of(error.message) : "",
          SBX_HAS_FIELD(&error, sbx_error, retryable) && error.retryable,
          SBX_HAS_FIELD(&error, sbx_error, http_status) ? error.http_status : 0,
          SBX_HAS_FIELD(&error, sbx_error, request_id) ? base::copy_of(error.request_id) : "");
  e.set_reason(reason_of(error));
  return e;
}

std::string reason_of(const sbx_error& error) {
  if (!SBX_HAS_FIELD(&error, sbx_error, reason) || error.reason.len > 128) return {};
  std::string reason = base::copy_of(error.reason);
  for (const char c : reason) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
    if (!ok) return {};
  }
  return reason;
}

Error to_error(const std::exception_ptr& exception) {
  return base::exception_to<Error>(
      exception, [](sbx_status status, std::string message) { return Error(status, message); });
}

void throw_error(const Error& error) {
  raise_status(error);
}

void throw_error(const sbx_error& error) {
  throw_error(to_error(error));
}

void throw_error(sbx_status status, const std::string& message) {
  raise_status(Error(status, message));
}

Error local_io_error(const std::string& what, int error_number) {
  sbx_status status = SBX_STATUS_INTERNAL;
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
      status = SBX_STATUS_RESOURCE_EXHAUSTED;
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      status = SBX_STATUS_PERMISSION_DENIED;
      break;
    case ENOENT:
    case ENOTDIR:
      status = SBX_STATUS_NOT_FOUND;
      break;
    default:
      break;
  }
  Error error(status, what + ": " + std::strerror(error_number));
  error.set_local_errno(error_number);
  return error;
}

}  // namespace sbx
