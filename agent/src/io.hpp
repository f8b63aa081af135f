// Reading small files whole (users and groups, a token, the expiry file, a process's environment)
// without iostreams, which would double the size of the static binary. Reentrant; owns nothing.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <optional>
#include <string>

namespace sbx::agent {

/// The first `limit` bytes of the file at `path` (all of it when shorter); nothing when it cannot
/// be opened. Opened non-blocking, so a FIFO put in a file's place cannot stall the loop.
inline std::optional<std::string> read_fd(int fd, std::size_t limit);

inline std::optional<std::string> read_file(const std::string& path, std::size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  return read_fd(fd, limit);
}

/// The same for the file `name` in the directory open as `dir`, following no symbolic link there:
/// for a file whose directory was opened before anyone else could rename or replace it.
inline std::optional<std::string> read_file_at(int dir, const std::string& name,
                                               std::size_t limit) {
  const int fd = ::openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  return read_fd(fd, limit);
}

/// Reads `fd` (up to `limit` bytes) and closes it.
inline std::optional<std::string> read_fd(int fd, std::size_t limit) {
  std::string text;
  char buf[16384];
  while (text.size() < limit) {
    const std::size_t want = limit - text.size() < sizeof buf ? limit - text.size() : sizeof buf;
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace sbx::agent
