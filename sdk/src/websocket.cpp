// sbx::sdk::WebSocket (websocket.hpp): the handshake and RFC 6455's framing, client side (every
// frame masked with a fresh key).

#include <sbx/sdk/websocket.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>

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

int connect_socket(const WebSocket::Endpoint& endpoint, Clock::time_point deadline,
                   std::string& where) {
  if (!endpoint.unix_socket.empty()) {
    where = endpoint.unix_socket;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (endpoint.unix_socket.size() >= sizeof addr.sun_path)
      throw Error::invalid_argument("socket path too long: " + endpoint.unix_socket);
    std::memcpy(addr.sun_path, endpoint.unix_socket.data(), endpoint.unix_socket.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw Error::unavailable("socket: " + errno_text(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error::unavailable("cannot connect to " + where + ": " + errno_text(e));
    }
    return fd;
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
// read) fails Error::timeout; the frame is then cut, so the caller ends the connection.
void send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      throw Error::timeout("the WebSocket's peer does not read what is sent to it");
    if (n <= 0) throw Error::unavailable("the WebSocket connection is gone: " + errno_text(errno));
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

std::string random_key() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::random_device rd;
  std::array<uint8_t, 16> raw{};
  for (auto& b : raw)
    b = static_cast<uint8_t>(rd());
  std::string out;  // base64 of 16 bytes: 22 characters and "=="
  for (size_t i = 0; i < raw.size(); i += 3) {
    const uint32_t n = (uint32_t{raw[i]} << 16) | (i + 1 < raw.size() ? raw[i + 1] << 8 : 0) |
                       (i + 2 < raw.size() ? raw[i + 2] : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < raw.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < raw.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

}  // namespace

WebSocket WebSocket::open(const Endpoint& endpoint, const std::string& target,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string where;
  const int fd = connect_socket(endpoint, deadline, where);
  set_send_timeout(fd, timeout);
  try {
    std::string request =
        "GET " + target +
        " HTTP/1.1\r\nHost: " + (endpoint.unix_socket.empty() ? where : std::string("localhost")) +
        "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + random_key() +
        "\r\nSec-WebSocket-Version: 13\r\n";
    for (const auto& [k, v] : headers)
      request += k + ": " + v + "\r\n";
    request += "\r\n";
    send_all(fd, request);
    // The response's head, up to its blank line; what follows it is the first frames' bytes.
    std::string got;
    size_t end = std::string::npos;
    while ((end = got.find("\r\n\r\n")) == std::string::npos) {
      if (got.size() > 64 * 1024) throw Error::unavailable(where + ": response head too long");
      if (!wait_ready(fd, POLLIN, deadline))
        throw Error::timeout("the WebSocket handshake with " + where + " timed out");
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error::unavailable(where + " closed the connection during the handshake");
      got.append(buf, static_cast<size_t>(n));
    }
    const std::string head = lower(got.substr(0, end));
    const bool switched = head.starts_with("http/1.1 101") &&
                          head.find("\r\nupgrade: websocket") != std::string::npos;
    if (!switched) {
      const size_t eol = got.find("\r\n");
      std::string body = got.substr(end + 4, 300);
      throw Error::unavailable("GET " + target + " on " + where + " was not upgraded: " +
                               got.substr(0, eol) + (body.empty() ? "" : ": " + body));
    }
    return WebSocket(fd, got.substr(end + 4));
  } catch (...) {
    ::close(fd);
    throw;
  }
}

WebSocket::WebSocket(WebSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      in_(std::move(other.in_)),
      close_sent_(other.close_sent_) {}

WebSocket::~WebSocket() {
  if (fd_ >= 0) ::close(fd_);
}

void WebSocket::send(uint8_t opcode, std::string_view payload) {
  std::string frame;
  frame.reserve(payload.size() + 14);
  frame += static_cast<char>(0x80 | opcode);
  if (payload.size() < 126) {
    frame += static_cast<char>(0x80 | payload.size());
  } else if (payload.size() <= 0xffff) {
    frame += static_cast<char>(0x80 | 126);
    frame += static_cast<char>(payload.size() >> 8);
    frame += static_cast<char>(payload.size() & 0xff);
  } else {
    frame += static_cast<char>(0x80 | 127);
    for (int shift = 56; shift >= 0; shift -= 8)
      frame += static_cast<char>((uint64_t{payload.size()} >> shift) & 0xff);
  }
  thread_local std::mt19937 random(std::random_device{}());
  const uint32_t key = static_cast<uint32_t>(random());
  const char mask[4] = {static_cast<char>(key >> 24), static_cast<char>(key >> 16),
                        static_cast<char>(key >> 8), static_cast<char>(key)};
  frame.append(mask, 4);
  for (size_t i = 0; i < payload.size(); ++i)
    frame += static_cast<char>(payload[i] ^ mask[i & 3]);
  std::lock_guard lock(send_mutex_);
  if (close_sent_) throw Error::unavailable("the WebSocket connection is closing");
  if (opcode == 0x8) close_sent_ = true;
  try {
    send_all(fd_, frame);
  } catch (const Error&) {
    close_sent_ = true;  // a frame cut short: nothing more can be said on this connection
    ::shutdown(fd_, SHUT_RDWR);
    throw;
  }
}

void WebSocket::close(uint16_t code) {
  const char payload[2] = {static_cast<char>(code >> 8), static_cast<char>(code & 0xff)};
  try {
    send(0x8, std::string_view(payload, 2));
  } catch (const Error&) {  // already closing or gone: nothing more to say
  }
}

void WebSocket::shutdown() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool WebSocket::fill(size_t want) {
  while (in_.size() < want) {
    char buf[16384];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
  }
  return true;
}

std::optional<WebSocket::Message> WebSocket::receive(size_t max_message) {
  for (;;) {
    if (!fill(2)) return std::nullopt;
    const auto b0 = static_cast<uint8_t>(in_[0]);
    const auto b1 = static_cast<uint8_t>(in_[1]);
    const uint8_t opcode = b0 & 0x0f;
    const bool fin = (b0 & 0x80) != 0;
    if ((b0 & 0x70) != 0 || (b1 & 0x80) != 0 || !fin || opcode == 0x0) {
      close(1002);  // reserved bits, a masked server frame or a fragment
      return std::nullopt;
    }
    size_t header = 2;
    uint64_t length = b1 & 0x7f;
    if (length == 126) {
      header = 4;
      if (!fill(header)) return std::nullopt;
      length = (uint64_t{static_cast<uint8_t>(in_[2])} << 8) | static_cast<uint8_t>(in_[3]);
    } else if (length == 127) {
      header = 10;
      if (!fill(header)) return std::nullopt;
      length = 0;
      for (int i = 0; i < 8; ++i)
        length = (length << 8) | static_cast<uint8_t>(in_[2 + i]);
    }
    if (length > max_message) {
      close(1009);
      return std::nullopt;
    }
    if (!fill(header + length)) return std::nullopt;
    std::string payload = in_.substr(header, length);
    in_.erase(0, header + length);
    switch (opcode) {
      case 0x1:
        return Message{Message::Kind::text, std::move(payload), 0};
      case 0x2:
        return Message{Message::Kind::binary, std::move(payload), 0};
      case 0x8: {
        Message m{Message::Kind::close, {}, 1005};
        if (payload.size() >= 2) {
          m.close_code = static_cast<uint16_t>((static_cast<uint8_t>(payload[0]) << 8) |
                                               static_cast<uint8_t>(payload[1]));
          m.payload = payload.substr(2);
        }
        close(m.close_code == 1005 ? 1000 : m.close_code);
        ::shutdown(fd_, SHUT_WR);  // both closes are out: the peer may end the connection now
        return m;
      }
      case 0x9:
        try {
          send(0xA, payload);
        } catch (const Error&) {  // gone: the next read says so
        }
        continue;
      case 0xA:
        continue;
      default:
        close(1002);
        return std::nullopt;
    }
  }
}

}  // namespace sbx::sdk
