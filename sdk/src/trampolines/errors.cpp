// Error conversion: any exception to an sdk::Error (through the one mapping of
// sbx/base/exceptions.hpp), and an sdk::Error to a synchronous call's error sink.

#include "internal.hpp"

#include <sbx/base/exceptions.hpp>

namespace sbx::sdk::detail {

Error exception_to_error(const std::exception_ptr& error) noexcept {
  return base::exception_to<Error>(error, [](sbx_status status, std::string message) {
    return Error(status, std::move(message));
  });
}

Error current_exception_to_error() noexcept {
  const std::exception_ptr error = std::current_exception();
  return error ? exception_to_error(error)
               : Error::internal("failed outside of an exception handler");
}

void report(const sbx_error_sink* sink, const Error& error) noexcept {
  if (sink && SBX_HAS_FIELD(sink, sbx_error_sink, report) && sink->report) {
    with_c_error(error, [&](const sbx_error* e) { sink->report(sink->ctx, e); });
  }
}

}  // namespace sbx::sdk::detail
