// Connecting to a unix-domain socket whose directory someone you do not trust can write to
// (target sbx::sdk_http). A sandbox's own directory bind-mounted into it is the case in point:
// root inside can rename, delete and link there, and a plain connect() would follow a symbolic
// link it planted to any socket of the host (another sandbox's agent, the Docker daemon).
//
// open_socket_file() walks the path one component at a time from "/" (or the working directory),
// following no symbolic link, and checks that the last component is a socket; connect_unix()
// then connects to that very file through /proc/self/fd, so nothing renamed or swapped after the
// walk can move the connection elsewhere. Hard links cannot reach across mounts, so what a
// sandbox can put in its directory is a socket of its own (a process of its own listening:
// reaching it is reaching that sandbox, nothing else).
//
// The path's parent directories must then be real directories: give such a path in its canonical
// form (the SDK's callers resolve the part they own, e.g. with std::filesystem::weakly_canonical).
//
// THREADING: pure functions over file descriptors, any thread.
// ERRORS: sdk::Error::unavailable, not retryable, naming the path and what was found there ("a
// symbolic link (not followed)", "a directory", "no such file", "nothing accepts connections
// on it"). When what was found is not what a socket's path can be (a link anywhere, something
// other than a directory on the way, something other than a socket at the end, or no socket in
// a directory that exists) the error's reason is kUnixSocketRefused: someone changed the path,
// and it is not the peer merely being gone. Error::invalid_argument for a path that is empty or
// too long for a socket address.
#pragma once

#include <string>

namespace sbx::sdk {

// ErrorDetails::reason of a socket path that was changed under its owner (see ERRORS).
inline constexpr const char* kUnixSocketRefused = "unix_socket_refused";

// A file descriptor that closes itself. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// The socket file at `path` as an O_PATH descriptor (close-on-exec), reached without following a
// symbolic link in any component. Throws as ERRORS says.
UniqueFd open_socket_file(const std::string& path);

// A new stream socket connected to the socket file at `path`. `follow_links` true connects by
// path as connect() does (for sockets in directories only trusted users write); false walks the
// path as open_socket_file() does. The socket is close-on-exec, and non-blocking when
// `nonblocking` (the connect itself never blocks: a listener whose backlog is full is "nothing
// accepts connections on it").
UniqueFd connect_unix(const std::string& path, bool follow_links, bool nonblocking);

// "/proc/self/fd/N": a path that names the file behind descriptor `fd`, for connect().
std::string fd_path(int fd);

}  // namespace sbx::sdk
