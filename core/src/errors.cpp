#include <sbx/core/errors.hpp>

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
[[noreturn]] void raise(const std::string& message, bool retryable, int32_t http,
                        std::string request_id) {
  throw E(message, retryable, http, std::move(request_id));
}

[[noreturn]] void raise_status(sbx_status status, const std::string& message, bool retryable,
                               int32_t http, std::string rid) {
  switch (status) {
    case SBX_STATUS_INVALID_ARGUMENT:
      raise<InvalidArgumentError>(message, retryable, http, rid);
    case SBX_STATUS_NOT_FOUND:
      raise<NotFoundError>(message, retryable, http, rid);
    case SBX_STATUS_TIMEOUT:
      raise<TimeoutError>(message, retryable, http, rid);
    case SBX_STATUS_CANCELLED:
      raise<CancelledError>(message, retryable, http, rid);
    case SBX_STATUS_UNAVAILABLE:
      raise<UnavailableError>(message, retryable, http, rid);
    case SBX_STATUS_RESOURCE_EXHAUSTED:
      raise<ResourceExhaustedError>(message, retryable, http, rid);
    case SBX_STATUS_FAILED_PRECONDITION:
      raise<FailedPreconditionError>(message, retryable, http, rid);
    case SBX_STATUS_UNIMPLEMENTED:
      raise<UnimplementedError>(message, retryable, http, rid);
    case SBX_STATUS_PERMISSION_DENIED:
      raise<PermissionDeniedError>(message, retryable, http, rid);
    case SBX_STATUS_CREATE_FAILED:
      raise<CreateError>(message, retryable, http, rid);
    case SBX_STATUS_CREATE_VERIFICATION_FAILED:
      raise<CreateVerificationError>(message, retryable, http, rid);
    default:
      raise<InternalError>(message, retryable, http, rid);
  }
}

std::string copy(sbx_str s) {
  return s.data ? std::string(s.data, s.len) : std::string();
}

}  // namespace

Error to_error(const sbx_error& error) {
  // ABI 1.0 defines every field; a smaller struct keeps what it has.
  return Error(error.status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : error.status,
               SBX_HAS_FIELD(&error, sbx_error, message) ? copy(error.message) : "",
               SBX_HAS_FIELD(&error, sbx_error, retryable) && error.retryable,
               SBX_HAS_FIELD(&error, sbx_error, http_status) ? error.http_status : 0,
               SBX_HAS_FIELD(&error, sbx_error, request_id) ? copy(error.request_id) : "");
}

Error to_error(const std::exception_ptr& exception) {
  try {
    std::rethrow_exception(exception);
  } catch (const Error& e) {
    return e;
  } catch (const std::bad_alloc&) {
    return Error(SBX_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Error(SBX_STATUS_INTERNAL, e.what());
  } catch (...) {
    return Error(SBX_STATUS_INTERNAL, "unknown exception");
  }
}

void throw_error(const Error& error) {
  raise_status(error.status(), error.what(), error.retryable(), error.http_status(),
               error.request_id());
}

void throw_error(const sbx_error& error) {
  throw_error(to_error(error));
}

void throw_error(sbx_status status, const std::string& message) {
  raise_status(status, message, false, 0, {});
}

}  // namespace sbx
