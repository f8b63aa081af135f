// sbx/sdk/unix_socket.hpp: a socket file reached without following links, and connected to by
// descriptor.

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/unix_socket.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace sbx::sdk {
namespace {

// `changed`: what was found is not what the socket's path can be (kUnixSocketRefused).
Error refused(const std::string& path, const std::string& why, bool changed = false) {
  return Error(SBX_STATUS_UNAVAILABLE, "the unix socket " + path + " cannot be used: " + why,
               ErrorDetails{.retryable = false, .reason = changed ? kUnixSocketRefused : ""});
}

// What a component that is not what it should be turned out to be.
std::string kind_of(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link (not followed)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  return "not a socket";
}

sockaddr_un address_of(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty()) throw Error::invalid_argument("the unix socket path is empty");
  if (path.size() >= sizeof address.sun_path) {
    throw Error::invalid_argument(
        "the unix socket path " + path + " is " + std::to_string(path.size()) +
        " bytes; a socket address holds at most " + std::to_string(sizeof address.sun_path - 1));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string fd_path(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}

UniqueFd open_socket_file(const std::string& path) {
  if (path.empty()) throw Error::invalid_argument("the unix socket path is empty");
  const bool absolute = path.front() == '/';
  UniqueFd dir(::open(absolute ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir)
    throw refused(path, std::string("cannot open its first directory: ") + std::strerror(errno));
  std::string_view rest(path);
  std::string walked = absolute ? "" : ".";
  for (;;) {
    while (!rest.empty() && rest.front() == '/')
      rest.remove_prefix(1);
    if (rest.empty()) throw refused(path, "it names a directory");
    const size_t slash = rest.find('/');
    const std::string name(rest.substr(0, slash));
    rest.remove_prefix(slash == std::string_view::npos ? rest.size() : slash);
    while (!rest.empty() && rest.front() == '/')
      rest.remove_prefix(1);
    const bool last = rest.empty();
    walked += "/" + name;
    // O_PATH with O_NOFOLLOW opens a symbolic link itself, which fstat then shows as one.
    UniqueFd next(::openat(dir.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      const int error = errno;
      // The socket missing from a directory that is there: removed by someone else.
      throw refused(path, walked + ": " + (error == ENOENT ? "no such file" : std::strerror(error)),
                    last && error == ENOENT);
    }
    struct stat st {};
    if (::fstat(next.get(), &st) != 0) {
      throw refused(path, walked + ": " + std::strerror(errno));
    }
    if (last) {
      if (!S_ISSOCK(st.st_mode)) throw refused(path, "it is " + kind_of(st.st_mode), true);
      return next;
    }
    if (!S_ISDIR(st.st_mode)) throw refused(path, walked + " is " + kind_of(st.st_mode), true);
    dir = std::move(next);
  }
}

UniqueFd connect_unix(const std::string& path, bool follow_links, bool nonblocking) {
  const sockaddr_un by_path = address_of(path);  // the same limit either way: callers use paths
  UniqueFd file;
  sockaddr_un address = by_path;
  if (!follow_links) {
    file = open_socket_file(path);
    address = address_of(fd_path(file.get()));
  }
  UniqueFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket) throw Error::unavailable(std::string("socket: ") + std::strerror(errno));
  if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const int error = errno;
    if (error == EAGAIN)
      throw refused(path, "nothing accepts connections on it (its backlog is full)");
    if (error == ECONNREFUSED) throw refused(path, "nothing accepts connections on it");
    if (error == ENOENT) throw refused(path, "no such file");
    throw refused(path, std::strerror(error));
  }
  if (!nonblocking) {
    const int flags = ::fcntl(socket.get(), F_GETFL);
    if (flags < 0 || ::fcntl(socket.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
      throw Error::unavailable(std::string("fcntl: ") + std::strerror(errno));
    }
  }
  return socket;
}

}  // namespace sbx::sdk
