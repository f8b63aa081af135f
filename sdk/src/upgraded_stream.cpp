// sbx::sdk::UpgradedStream (upgraded_stream.hpp): the connection, the upgrade request and its
// answer's head; then bytes both ways.

#include <sbx/sdk/unix_socket.hpp>
#include <sbx/sdk/upgraded_stream.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace sbx::sdk {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int e) {
  return std::strerror(e);
}

// Waits until `fd` is ready for `events` or `deadline`; false on the deadline.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the next call reports the error
  }
}

int connect_socket(const UpgradedStream::Endpoint& endpoint, Clock::time_point deadline,
                   std::string& where) {
  if (!endpoint.unix_socket.empty()) {
    where = endpoint.unix_socket;
    return connect_unix(endpoint.unix_socket, endpoint.follow_links, false).release();
  }
  where = endpoint.host + ":" + std::to_string(endpoint.port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw Error::unavailable("cannot resolve " + endpoint.host + ": " + ::gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (!wait_ready(fd, POLLOUT, deadline)) {
        ::close(fd);
        ::freeaddrinfo(found);
        throw Error::timeout("connecting to " + where + " timed out");
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      ::freeaddrinfo(found);
      const int flags = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
      int blocking = 0;
      ::ioctl(fd, FIONBIO, &blocking);
      return fd;
    }
    last = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw Error::unavailable("cannot connect to " + where + ": " + last);
}

// Sends all of `bytes`. A send that cannot go on for the socket's SO_SNDTIMEO (the peer does not
// read) fails Error::timeout; the bytes are then cut short, so the caller ends the connection.
void send_all(int fd, const std::string& where, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      throw Error::timeout(where + " does not read what is sent to it");
    if (n <= 0)
      throw Error::unavailable("the connection to " + where + " is gone: " + errno_text(errno));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void set_send_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

UpgradedStream UpgradedStream::open(const Endpoint& endpoint, const Request& request,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string where;
  const int fd = connect_socket(endpoint, deadline, where);
  set_send_timeout(fd, timeout);
  const std::string what = request.method + " " + request.target + " on " + where;
  try {
    std::string head = request.method + " " + request.target + " HTTP/1.1\r\nHost: " +
                       (endpoint.unix_socket.empty() ? where : std::string("localhost")) +
                       "\r\nConnection: Upgrade\r\nUpgrade: " + request.protocol + "\r\n";
    for (const auto& [k, v] : request.headers)
      head += k + ": " + v + "\r\n";
    if (!request.body.empty())
      head += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
    head += "\r\n";
    send_all(fd, where, head + request.body);
    // The answer's head, up to its blank line; what follows it is the new protocol's first bytes.
    std::string got;
    size_t end = std::string::npos;
    while ((end = got.find("\r\n\r\n")) == std::string::npos) {
      if (got.size() > 64 * 1024)
        throw Error::unavailable(what + ": the answer's head is too long");
      if (!wait_ready(fd, POLLIN, deadline)) throw Error::timeout(what + ": no answer in time");
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error::unavailable(what + ": the connection closed before an answer");
      got.append(buf, static_cast<size_t>(n));
    }
    const std::string answer = lower(got.substr(0, end));
    const bool switched =
        answer.starts_with("http/1.1 101") &&
        answer.find("\r\nupgrade: " + lower(request.protocol)) != std::string::npos;
    if (!switched) {
      const size_t eol = got.find("\r\n");
      const std::string body = got.substr(end + 4, 300);
      throw Error::unavailable(what + " was not upgraded: " + got.substr(0, eol) +
                               (body.empty() ? "" : ": " + body));
    }
    return UpgradedStream(fd, where, got.substr(end + 4));
  } catch (...) {
    ::close(fd);
    throw;
  }
}

UpgradedStream::UpgradedStream(UpgradedStream&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      where_(std::move(other.where_)),
      pending_(std::move(other.pending_)) {}

UpgradedStream::~UpgradedStream() {
  if (fd_ >= 0) ::close(fd_);
}

void UpgradedStream::send(std::string_view bytes) {
  try {
    send_all(fd_, where_, bytes);
  } catch (const Error&) {
    shutdown();  // cut short: nothing more can be said on this connection
    throw;
  }
}

bool UpgradedStream::read_some(std::string& into) {
  if (!pending_.empty()) {
    into.append(pending_);
    pending_.clear();
    return true;
  }
  for (;;) {
    char buf[16384];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    into.append(buf, static_cast<size_t>(n));
    return true;
  }
}

void UpgradedStream::shutdown_write() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void UpgradedStream::shutdown() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace sbx::sdk
