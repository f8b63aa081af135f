// What `sbx` writes (output.hpp).

#include "output.hpp"

#include "shared.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>

namespace sbx::cli {

int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

std::function<void(sbx::OutputStream, std::string_view)> stream_output(Interrupts& interrupts) {
  // Set once, by the callback (the provider calls it one call at a time); shared by its copies.
  auto output_errno = std::make_shared<int>(0);
  return [&interrupts, output_errno](sbx::OutputStream stream, std::string_view bytes) {
    if (*output_errno != 0) return;
    *output_errno =
        write_all(stream == sbx::OutputStream::err ? STDERR_FILENO : STDOUT_FILENO, bytes);
    if (*output_errno == EPIPE) {
      interrupts.stop(kExitBrokenPipe);  // nobody reads the output: stop the command
    } else if (*output_errno != 0) {
      std::cerr << "sbx: writing the command's "
                << (stream == sbx::OutputStream::err ? "stderr" : "stdout")
                << " failed: " << std::strerror(*output_errno) << "; stopping the command\n";
      interrupts.stop(kExitLocalIo);
    }
  };
}

int exit_status_of(const sbx::ExecResult& result) {
  int code = result.return_code;
  if (code < 0 || code > 255) {
    std::cerr << "sbx: the provider reported return code " << result.return_code
              << ", which no exit status can carry\n";
    code = kExitFailure;
  }
  if (result.error_type) {
    std::cerr << "sbx: "
              << (result.timed_out() ? "the command timed out"
                                     : "the sandbox could not run the command")
              << " (error_type=" << *result.error_type << ")\n";
  }
  return code;
}

}  // namespace sbx::cli
