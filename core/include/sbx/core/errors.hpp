// Exceptions of the sbx:: host API. They mirror NeMo Gym's errors: CreateError is
// SandboxCreateError, CreateVerificationError is SandboxCreateVerificationError; invalid values
// raise InvalidArgumentError (Python's ValueError). Every error from a plugin arrives as the
// subclass matching its ABI status code, with the plugin's message and details.
#pragma once

#include <sbx/abi/types.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sbx {

class Error : public std::runtime_error {
 public:
  Error(sbx_status status, const std::string& message, bool retryable = false,
        int32_t http_status = 0, std::string request_id = {});

  const char* what() const noexcept override { return message_.c_str(); }
  sbx_status status() const noexcept { return status_; }
  std::string_view status_name() const noexcept;
  bool retryable() const noexcept { return retryable_; }
  int32_t http_status() const noexcept { return http_status_; }
  const std::string& request_id() const noexcept { return request_id_; }
  // Why, within status(), for a program to match (sbx_error.reason, ABI 1.2): an SBX_REASON_*
  // of sbx/abi/types.h (e.g. "image_pull_failed") or the backend's own code; empty when the
  // plugin gave none (a 1.0 or 1.1 plugin never does).
  const std::string& reason() const noexcept { return reason_; }
  void set_reason(std::string reason) { reason_ = std::move(reason); }
  // The errno of the host's own file or stream operation that caused this error (a full disk
  // during a download, a file that could not be read for an upload), or 0 when the cause lies
  // elsewhere. `sbx` exits 74 for these.
  int local_errno() const noexcept { return local_errno_; }
  void set_local_errno(int error_number) noexcept { local_errno_ = error_number; }
  // True when this error ended a create (or connect): it is raised as CreateError or a subclass,
  // whatever its status, as NeMo Gym raises SandboxCreateError for every failure of create.
  bool create_failure() const noexcept { return create_failure_; }
  void set_create_failure() noexcept { create_failure_ = true; }

 private:
  // The message lives in a plain std::string, not in std::runtime_error: libstdc++ shares
  // runtime_error's copy-on-write buffer between copies with reference counts ThreadSanitizer
  // cannot see, and errors travel from plugin threads to the caller's.
  std::string message_;
  sbx_status status_;
  bool retryable_;
  int32_t http_status_;
  std::string request_id_;
  std::string reason_;
  int local_errno_ = 0;
  bool create_failure_ = false;
};

#define SBX_DEFINE_ERROR(Name, Base, Status)                                                   \
  class Name : public Base {                                                                   \
   public:                                                                                     \
    explicit Name(const std::string& message, bool retryable = false, int32_t http_status = 0, \
                  std::string request_id = {})                                                 \
        : Base(Status, message, retryable, http_status, std::move(request_id)) {}              \
                                                                                               \
   protected:                                                                                  \
    Name(sbx_status status, const std::string& message, bool retryable, int32_t http_status,   \
         std::string request_id)                                                               \
        : Base(status, message, retryable, http_status, std::move(request_id)) {}              \
  };

SBX_DEFINE_ERROR(InvalidArgumentError, Error, SBX_STATUS_INVALID_ARGUMENT)
SBX_DEFINE_ERROR(NotFoundError, Error, SBX_STATUS_NOT_FOUND)
SBX_DEFINE_ERROR(TimeoutError, Error, SBX_STATUS_TIMEOUT)
SBX_DEFINE_ERROR(CancelledError, Error, SBX_STATUS_CANCELLED)
SBX_DEFINE_ERROR(UnavailableError, Error, SBX_STATUS_UNAVAILABLE)
SBX_DEFINE_ERROR(ResourceExhaustedError, Error, SBX_STATUS_RESOURCE_EXHAUSTED)
SBX_DEFINE_ERROR(FailedPreconditionError, Error, SBX_STATUS_FAILED_PRECONDITION)
SBX_DEFINE_ERROR(UnimplementedError, Error, SBX_STATUS_UNIMPLEMENTED)
SBX_DEFINE_ERROR(PermissionDeniedError, Error, SBX_STATUS_PERMISSION_DENIED)
SBX_DEFINE_ERROR(InternalError, Error, SBX_STATUS_INTERNAL)
// NeMo Gym's SandboxCreateError: every failure of a create. status() is CREATE_FAILED, or the
// specific reason when the provider gave one (UNAVAILABLE: the backend could not be reached;
// NOT_FOUND: no such image; PERMISSION_DENIED: a pull was refused; TIMEOUT; INVALID_ARGUMENT: an
// option the provider refused; ...). A spec the host refuses before any provider is called is an
// InvalidArgumentError, not a CreateError; a cancelled create is a CancelledError.
class CreateError : public Error {
 public:
  explicit CreateError(const std::string& message, bool retryable = false, int32_t http_status = 0,
                       std::string request_id = {})
      : Error(SBX_STATUS_CREATE_FAILED, message, retryable, http_status, std::move(request_id)) {
    set_create_failure();
  }
  CreateError(sbx_status reason, const std::string& message, bool retryable, int32_t http_status,
              std::string request_id)
      : Error(reason, message, retryable, http_status, std::move(request_id)) {
    set_create_failure();
  }
};
SBX_DEFINE_ERROR(CreateVerificationError, CreateError, SBX_STATUS_CREATE_VERIFICATION_FAILED)
// A bad config file: the message names the file and the JSON path of the offending value.
SBX_DEFINE_ERROR(ConfigError, InvalidArgumentError, SBX_STATUS_INVALID_ARGUMENT)
// A plugin file the host refuses (not a plugin, corrupt, other ABI major, failed init).
SBX_DEFINE_ERROR(PluginLoadError, FailedPreconditionError, SBX_STATUS_FAILED_PRECONDITION)
// A reload the host refused as a whole (Host::reload): the message names the provider block, the
// step that failed (load, config, init, canary) and why; nothing was changed.
SBX_DEFINE_ERROR(ReloadError, FailedPreconditionError, SBX_STATUS_FAILED_PRECONDITION)

#undef SBX_DEFINE_ERROR

// The error a plugin reported, as a value (status and details kept).
Error to_error(const sbx_error& error);
// An sbx_error's reason (ABI 1.2): empty when its writer's struct has none, or when it is longer
// than 128 bytes or holds a byte other than [A-Za-z0-9_.:/-] (not a reason a program can match).
std::string reason_of(const sbx_error& error);
// Any exception as an Error: sbx::Error as is, other exceptions as INTERNAL with their what().
Error to_error(const std::exception_ptr& exception);

// Throws a new exception of the sbx:: class matching the status, with the same details.
[[noreturn]] void throw_error(const Error& error);
[[noreturn]] void throw_error(const sbx_error& error);
[[noreturn]] void throw_error(sbx_status status, const std::string& message);

// An error of the host's own file I/O: "<what>: <strerror>", its status from the errno (ENOSPC
// RESOURCE_EXHAUSTED, EACCES PERMISSION_DENIED, ENOENT NOT_FOUND, else INTERNAL), local_errno set.
Error local_io_error(const std::string& what, int error_number);

}  // namespace sbx
