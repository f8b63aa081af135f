// sbx-fake-agent: what a hostile root inside a sandbox can put on the agent's socket in place of
// sbx-agent, for hostile_test.cpp. Static (it runs in the busybox image), single-threaded, plain
// POSIX.
//
//   sbx-fake-agent SOCKET MODE_FILE
//
// Removes SOCKET and listens there (as root in a sandbox can: `rm /.sbx/run/agent.sock` and
// bind), then for each connection reads the request's head and answers as the first word of
// MODE_FILE says (read at every connection, so a test changes the mode without restarting it;
// GET /files/info, asked before a transfer, is always answered as the agent answers it):
//   huge-frame    a frames stream whose first frame declares 4 GiB - 1 bytes, then 'A's forever
//   endless-head  a status line, then header lines forever
//   stall         nothing, ever (the connection stays open)
//   endless-body  a 200 chunked body of 'B's forever, without a Content-Length
//   overlong-body a 200 with Content-Length 10, then 'C's forever
//   bad-end       frames: "hi" on stdout, then an end {"exit_code": 1e300}
//   big-error     500 with a body of 'E's forever
//   pty-error     a WebSocket upgrade (a terminal's attach), then an error frame and a close
//                 frame with a reason, as execd ends a terminal whose shell could not start
//   echo          200, a frames stream saying "fake" on stdout and exit 0: a well-formed answer
// Each connection is served by a child process of its own, so a stalled or endless one never
// blocks the next. Exits when the listening socket fails.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool write_all(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

std::string chunk(const std::string& bytes) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  return size + bytes + "\r\n";
}

std::string frame(char kind, const std::string& payload) {
  std::string out(1, kind);
  const auto n = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    out += static_cast<char>((n >> shift) & 0xff);
  return out + payload;
}

std::string read_mode(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "echo";
  char text[64] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  std::string mode(text, n > 0 ? static_cast<size_t>(n) : 0);
  while (!mode.empty() && (mode.back() == '\n' || mode.back() == ' '))
    mode.pop_back();
  return mode.empty() ? "echo" : mode;
}

// Reads up to the end of the request's head (and whatever came with it); returns it.
std::string read_head(int fd) {
  std::string in;
  char buf[4096];
  while (in.find("\r\n\r\n") == std::string::npos && in.size() < 1 << 20) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return in;
    in.append(buf, static_cast<size_t>(n));
  }
  return in;
}

void forever(int fd, const std::string& piece) {
  while (write_all(fd, piece)) {
  }
}

void serve(int fd, const std::string& mode) {
  const std::string head = read_head(fd);
  // Asked whether it runs as root (before a file transfer): yes, as the agent says it, so that the
  // transfer itself meets the mode.
  if (head.starts_with("GET /files/info")) {
    const std::string body = R"({"/.sbx/run/agent.sock":{"owner":"0"}})";
    write_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body);
    return;
  }
  const std::string frames_head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.sbx.frames\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  if (mode == "huge-frame") {
    std::string first(1, 'o');
    first += "\xff\xff\xff\xff";
    write_all(fd, frames_head + chunk(first));
    forever(fd, chunk(std::string(64 * 1024, 'A')));
  } else if (mode == "endless-head") {
    write_all(fd, "HTTP/1.1 200 OK\r\n");
    forever(fd, "X-Filler: " + std::string(1000, 'x') + "\r\n");
  } else if (mode == "stall") {
    for (;;)
      ::pause();
  } else if (mode == "endless-body") {
    write_all(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    forever(fd, chunk(std::string(64 * 1024, 'B')));
  } else if (mode == "overlong-body") {
    write_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
    forever(fd, std::string(64 * 1024, 'C'));
  } else if (mode == "bad-end") {
    write_all(fd, frames_head + chunk(frame('o', "hi\n")) +
                      chunk(frame('x', "{\"exit_code\": 1e300}")) + "0\r\n\r\n");
  } else if (mode == "pty-error") {
    // Server frames are unmasked: FIN + opcode, a 7-bit length, the payload.
    const auto ws_frame = [](unsigned char opcode, const std::string& payload) {
      return std::string(1, static_cast<char>(0x80 | opcode)) +
             std::string(1, static_cast<char>(payload.size())) + payload;
    };
    write_all(fd,
              "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Accept: x\r\n\r\n" +
                  ws_frame(0x1, R"({"type":"error","error":"exec: bash: not found"})") +
                  ws_frame(0x8, std::string("\x03\xf3", 2) + "the shell could not start"));
  } else if (mode == "big-error") {
    write_all(fd, "HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n");
    forever(fd, chunk(std::string(64 * 1024, 'E')));
  } else {
    write_all(fd, frames_head + chunk(frame('o', "fake\n")) +
                      chunk(frame('x', "{\"exit_code\":0}")) + "0\r\n\r\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: sbx-fake-agent SOCKET MODE_FILE\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGCHLD, SIG_IGN);  // children are reaped by the kernel
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (std::strlen(argv[1]) >= sizeof address.sun_path) return 2;
  std::strcpy(address.sun_path, argv[1]);
  ::unlink(argv[1]);
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 ||
      ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 64) != 0) {
    std::perror("sbx-fake-agent");
    return 1;
  }
  std::printf("listening\n");
  std::fflush(stdout);
  for (;;) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return 1;
    }
    const std::string mode = read_mode(argv[2]);
    if (::fork() == 0) {
      ::close(listener);
      serve(fd, mode);
      ::_exit(0);
    }
    ::close(fd);
  }
}
