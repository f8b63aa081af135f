#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/sdk/http.hpp>
#include <sbx/sdk/unix_socket.hpp>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
namespace http = sbx::sdk::http;
using namespace std::chrono_literals;
using sbx::sdk::Error;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;

uint64_t fnv1a(std::string_view bytes, uint64_t hash = kFnvOffset) {
  for (unsigned char c : bytes)
    hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// ---- A small HTTP/1.1 server ----------------------------------------------------------------
//
// One thread accepts; each connection gets a thread that serves requests until the peer closes
// (keep-alive). Routes:
//   /fixed                          200 "hello" with Content-Length
//   /status?code=N                  that status, body "status N"
//   /echo                           reads the body (Content-Length or chunked) and answers
//                                   "method=.. size=.. hash=.. te=.. cl=.. expect=.. conn=.."
//   /chunked?n=N&delay_ms=D         a chunked response of N chunks "chunk-i\n"
//   /hijack?n=N&delay_ms=D          Docker-style stream: no length, N parts, then close
//   /slow?ms=M                      answers "slow" after M ms (or when the client goes away)
//   /headers                        the request's headers, one "name: value" line each
//   /once                           answers on a new connection; on a reused one it reads the
//                                   request and closes without answering (a server that closed
//                                   the idle socket just as the request came)
//   /drop                           reads the request and closes without answering
//   /big-error?n=N                  500 with an N-byte body
//   /range?status=S&cr=V            status S with "Content-Range: V", body "ranged"; echoes the
//                                   request's Range header as X-Range
//   /multipart                      parses a multipart/form-data body; one line per part:
//                                   "name=.. filename=.. type=.. size=.. hash=.."
// Any request with ?read_delay_ms=D waits D ms before reading its body.
class TestServer {
 public:
  // TCP on 127.0.0.1 with an ephemeral port, or a unix socket at `unix_path`.
  // With `idle_close_ms`, a connection idle that long between requests is closed by the server,
  // as uvicorn does after about 5 s.
  explicit TestServer(std::string unix_path = "", int idle_close_ms = 0)
      : unix_path_(std::move(unix_path)), idle_close_ms_(idle_close_ms) {
    if (unix_path_.empty()) {
      fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
      socklen_t len = sizeof addr;
      REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
      port_ = ntohs(addr.sin_port);
    } else {
      fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      REQUIRE(unix_path_.size() < sizeof addr.sun_path);
      std::strcpy(addr.sun_path, unix_path_.c_str());
      REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    }
    REQUIRE(listen(fd_, 256) == 0);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~TestServer() {
    stopping_ = true;
    shutdown(fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mutex_);
      for (int fd : open_)
        shutdown(fd, SHUT_RDWR);
      workers.swap(workers_);
    }
    for (auto& worker : workers)
      worker.join();
    close(fd_);
    if (!unix_path_.empty()) unlink(unix_path_.c_str());
  }

  std::string base_url() const {
    return unix_path_.empty() ? "http://127.0.0.1:" + std::to_string(port_) : "http://localhost";
  }
  http::ClientOptions options() const {
    http::ClientOptions options;
    options.base_url = base_url();
    options.unix_socket = unix_path_;
    return options;
  }
  int accepted() const { return accepted_; }
  int requests() const { return requests_; }
  int dropped() const { return dropped_; }
  int idle_closed() const { return idle_closed_; }

 private:
  struct Request {
    std::string method, path;
    std::map<std::string, std::string> query, headers;  // header names lowercased
    uint64_t body_size = 0, body_hash = kFnvOffset;
    bool keep_body = false;
    std::string body;  // when keep_body
  };

  struct Connection {
    int fd;
    int id;
    std::string buffer;
    int served = 0;  // requests read on this connection

    bool fill() {
      char chunk[64 * 1024];
      ssize_t n = recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
      return true;
    }
    bool read_line(std::string& line) {
      size_t end;
      while ((end = buffer.find("\r\n")) == std::string::npos) {
        if (!fill()) return false;
      }
      line = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      return true;
    }
    bool read_body(uint64_t size, Request& request) {
      while (size > 0) {
        if (buffer.empty() && !fill()) return false;
        size_t n = static_cast<size_t>(std::min<uint64_t>(size, buffer.size()));
        request.body_hash = fnv1a(std::string_view(buffer).substr(0, n), request.body_hash);
        request.body_size += n;
        if (request.keep_body) request.body.append(buffer, 0, n);
        buffer.erase(0, n);
        size -= n;
      }
      return true;
    }
    void send_all(std::string_view data) const {
      while (!data.empty()) {
        ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n <= 0) return;
        data.remove_prefix(static_cast<size_t>(n));
      }
    }
  };

  void accept_loop() {
    for (int id = 0;; ++id) {
      int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stopping_) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      ++accepted_;
      if (unix_path_.empty()) {  // no Nagle delay between a response's separate writes
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      std::lock_guard lock(mutex_);
      open_.insert(fd);
      workers_.emplace_back([this, fd, id] { serve(Connection{fd, id, ""}); });
    }
  }

  void serve(Connection connection) {
    Request request;
    auto idle_closed = [&] {
      if (idle_close_ms_ <= 0 || !connection.buffer.empty()) return false;
      pollfd p{connection.fd, POLLIN, 0};
      if (poll(&p, 1, idle_close_ms_) != 0) return false;
      ++idle_closed_;
      return true;
    };
    while (!stopping_ && !idle_closed() && read_request(connection, request)) {
      ++requests_;
      ++connection.served;
      if (!respond(connection, request)) break;
    }
    std::lock_guard lock(mutex_);
    open_.erase(connection.fd);
    close(connection.fd);
  }

  static bool read_request(Connection& c, Request& request) {
    request = Request{};
    std::string line;
    if (!c.read_line(line)) return false;
    std::istringstream start(line);
    std::string target;
    start >> request.method >> target;
    size_t question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) {
      std::istringstream query(target.substr(question + 1));
      for (std::string pair; std::getline(query, pair, '&');) {
        size_t eq = pair.find('=');
        request.query[pair.substr(0, eq)] = eq == std::string::npos ? "" : pair.substr(eq + 1);
      }
    }
    while (c.read_line(line) && !line.empty()) {
      size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (auto& ch : name)
        ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      size_t value = line.find_first_not_of(' ', colon + 1);
      request.headers[name] = value == std::string::npos ? "" : line.substr(value);
    }
    request.keep_body = request.path == "/multipart";
    if (auto delay = request.query.find("read_delay_ms"); delay != request.query.end()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(delay->second)));
    }
    if (request.headers.count("transfer-encoding")) {
      for (;;) {  // chunks: "<hex size>\r\n<data>\r\n", ending with a 0 chunk and trailers
        if (!c.read_line(line)) return false;
        uint64_t size = std::stoull(line, nullptr, 16);
        if (size == 0) break;
        if (!c.read_body(size, request) || !c.read_line(line)) return false;
      }
      while (c.read_line(line) && !line.empty()) {
      }
      return true;
    }
    if (request.headers.count("content-length")) {
      return c.read_body(std::stoull(request.headers["content-length"]), request);
    }
    return true;
  }

  static std::string percent_decode(const std::string& text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '%' && i + 2 < text.size()) {
        out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        out += text[i] == '+' ? ' ' : text[i];
      }
    }
    return out;
  }

  // A strict multipart/form-data reader: any framing error answers "bad: why".
  static std::string parse_multipart(const std::string& content_type, const std::string& body) {
    const std::string marker = "multipart/form-data; boundary=";
    if (!content_type.starts_with(marker)) return "bad: content type " + content_type;
    const std::string delimiter = "--" + content_type.substr(marker.size());
    if (!body.starts_with(delimiter)) return "bad: no first delimiter";
    std::string out;
    size_t at = delimiter.size();
    for (;;) {
      if (body.compare(at, 4, "--\r\n") == 0) {
        return at + 4 == body.size() ? out : "bad: bytes after the end";
      }
      if (body.compare(at, 2, "\r\n") != 0) return "bad: no CRLF after a delimiter";
      const size_t head_end = body.find("\r\n\r\n", at);
      if (head_end == std::string::npos) return "bad: part head not ended";
      const std::string head = body.substr(at + 2, head_end + 2 - (at + 2));
      const size_t data = head_end + 4;
      const size_t next = body.find("\r\n" + delimiter, data);
      if (next == std::string::npos) return "bad: part not ended";
      auto param = [&](const std::string& key) -> std::string {
        const size_t p = head.find("; " + key + "=\"");
        if (p == std::string::npos) return "none";
        const size_t from = p + key.size() + 4;
        return head.substr(from, head.find('"', from) - from);
      };
      std::string type = "none";
      if (size_t p = head.find("Content-Type: "); p != std::string::npos) {
        type = head.substr(p + 14, head.find("\r\n", p) - p - 14);
      }
      if (!head.starts_with("Content-Disposition: form-data; name=\"")) return "bad: head " + head;
      const std::string_view bytes = std::string_view(body).substr(data, next - data);
      out += "name=" + param("name") + " filename=" + param("filename") + " type=" + type +
             " size=" + std::to_string(bytes.size()) + " hash=" + std::to_string(fnv1a(bytes)) +
             "\n";
      at = next + 2 + delimiter.size();
    }
  }

  static std::string header_or(const Request& request, const std::string& name) {
    auto it = request.headers.find(name);
    return it == request.headers.end() ? "none" : it->second;
  }

  static int query_int(const Request& request, const std::string& key, int fallback) {
    auto it = request.query.find(key);
    return it == request.query.end() ? fallback : std::stoi(it->second);
  }

  static std::string fixed(int status, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) +
           " X\r\nContent-Length: " + std::to_string(body.size()) + "\r\nX-Test: yes\r\n\r\n" +
           body;
  }

  // Waits `ms`, but returns early (false) when the server stops or the client hangs up.
  bool wait_unless_gone(const Connection& c, int ms) const {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      if (stopping_) return false;
      pollfd p{c.fd, POLLRDHUP, 0};
      if (poll(&p, 1, 10) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) return false;
    }
    return true;
  }

  // Answers one request; false closes the connection.
  bool respond(Connection& c, const Request& request) {
    const int delay = query_int(request, "delay_ms", 0);
    if (request.path == "/fixed") {
      c.send_all(fixed(200, "hello"));
    } else if (request.path == "/status") {
      int code = query_int(request, "code", 500);
      c.send_all(fixed(code, "status " + std::to_string(code)));
    } else if (request.path == "/echo") {
      c.send_all(fixed(
          200, "method=" + request.method + " size=" + std::to_string(request.body_size) +
                   " hash=" + std::to_string(request.body_hash) +
                   " te=" + header_or(request, "transfer-encoding") +
                   " cl=" + header_or(request, "content-length") +
                   " expect=" + header_or(request, "expect") + " conn=" + std::to_string(c.id)));
    } else if (request.path == "/chunked") {
      c.send_all("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
      for (int i = 0; i < query_int(request, "n", 3); ++i) {
        if (delay && !wait_unless_gone(c, delay)) return false;
        std::string chunk = "chunk-" + std::to_string(i) + "\n";
        std::ostringstream size;
        size << std::hex << chunk.size();
        c.send_all(size.str() + "\r\n" + chunk + "\r\n");
      }
      c.send_all("0\r\n\r\n");
    } else if (request.path == "/hijack") {
      // What Docker does for POST /exec/{id}/start: headers, then raw bytes until it closes.
      c.send_all("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n");
      for (int i = 0; i < query_int(request, "n", 3); ++i) {
        if (delay && !wait_unless_gone(c, delay)) return false;
        c.send_all("part-" + std::to_string(i) + "\n");
      }
      shutdown(c.fd, SHUT_WR);
      return false;
    } else if (request.path == "/bytes") {
      // A raw stream of `n` bytes counting 0..255 over and over, then close.
      c.send_all("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n");
      std::string block(64 * 1024, '\0');
      for (size_t i = 0; i < block.size(); ++i)
        block[i] = static_cast<char>(i % 256);
      for (int left = query_int(request, "n", 0); left > 0;) {
        const int n = std::min<int>(left, static_cast<int>(block.size()));
        c.send_all(block.substr(0, static_cast<size_t>(n)));
        left -= n;
      }
      shutdown(c.fd, SHUT_WR);
      return false;
    } else if (request.path == "/headers") {
      std::string lines;
      for (const auto& [name, value] : request.headers)
        lines += name + ": " + value + "\n";
      c.send_all(fixed(200, lines));
    } else if (request.path == "/once") {
      if (c.served > 1) {
        ++dropped_;
        return false;
      }
      c.send_all(fixed(200, "fresh conn=" + std::to_string(c.id)));
    } else if (request.path == "/drop") {
      ++dropped_;
      return false;
    } else if (request.path == "/big-error") {
      c.send_all(fixed(500, std::string(static_cast<size_t>(query_int(request, "n", 0)), 'e')));
    } else if (request.path == "/range") {
      const int status = query_int(request, "status", 206);
      const auto cr = request.query.find("cr");
      c.send_all("HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Length: 6\r\n" +
                 (cr == request.query.end()
                      ? ""
                      : "Content-Range: " + percent_decode(cr->second) + "\r\n") +
                 "X-Range: " + header_or(request, "range") + "\r\n\r\nranged");
    } else if (request.path == "/multipart") {
      c.send_all(fixed(200, parse_multipart(header_or(request, "content-type"), request.body)));
    } else if (request.path == "/slow") {
      if (!wait_unless_gone(c, query_int(request, "ms", 5000))) return false;
      c.send_all(fixed(200, "slow"));
    } else {
      c.send_all(fixed(404, "no route"));
    }
    return true;
  }

  std::string unix_path_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> requests_{0};
  std::atomic<int> dropped_{0};
  std::atomic<int> idle_closed_{0};
  int idle_close_ms_ = 0;
  std::thread acceptor_;
  std::mutex mutex_;
  std::set<int> open_;
  std::vector<std::thread> workers_;
};

// A temporary directory for unix sockets, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "sbx-http-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { fs::remove_all(path); }
};

template <typename Fn>
Error error_of(Fn&& fn) {
  return sbx::testing::error_of<Error>(std::forward<Fn>(fn));
}

http::Request get(std::string target) {
  http::Request request;
  request.target = std::move(target);
  return request;
}

http::Request post(std::string target, std::string body) {
  http::Request request;
  request.method = "POST";
  request.target = std::move(target);
  request.body = std::move(body);
  return request;
}

std::string echo_expect(const std::string& method, std::string_view body, const std::string& te,
                        const std::string& cl) {
  return "method=" + method + " size=" + std::to_string(body.size()) +
         " hash=" + std::to_string(fnv1a(body)) + " te=" + te + " cl=" + cl + " expect=none";
}

// Deterministic pseudo-random bytes produced piecewise, for streamed uploads.
struct ByteStream {
  uint64_t state = 88172645463325252ull;
  uint64_t left;
  uint64_t hash = kFnvOffset;
  explicit ByteStream(uint64_t size) : left(size) {}
  size_t fill(char* buffer, size_t capacity) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(capacity, left));
    for (size_t i = 0; i < n; i += 8) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      std::memcpy(buffer + i, &state, std::min<size_t>(8, n - i));
    }
    hash = fnv1a({buffer, n}, hash);
    left -= n;
    return n;
  }
};

}  // namespace

TEST_CASE("GET and POST over TCP; any HTTP status is a response") {
  TestServer server;
  http::Client client(server.options());

  http::Response response = client.send(get("/fixed"));
  CHECK(response.status == 200);
  CHECK(response.body == "hello");
  CHECK(response.header("x-test") == "yes");
  CHECK(response.header("CONTENT-LENGTH") == "5");
  CHECK(response.header("missing").empty());

  response = client.send(get("/status?code=404"));
  CHECK(response.status == 404);
  CHECK(response.body == "status 404");

  const std::string body = "{\"Image\": \"busybox\"}";
  response = client.send(post("/echo", body));
  CHECK(response.status == 200);
  CHECK(response.body.starts_with(echo_expect("POST", body, "none", std::to_string(body.size()))));

  // A POST without a body still says Content-Length: 0; other methods pass through.
  CHECK(client.send(post("/echo", "")).body.starts_with(echo_expect("POST", "", "none", "0")));
  http::Request put = post("/echo", "abc");
  put.method = "PUT";
  CHECK(client.send(put).body.starts_with(echo_expect("PUT", "abc", "none", "3")));
  http::Request del = get("/echo");
  del.method = "DELETE";
  CHECK(client.send(del).body.starts_with("method=DELETE size=0"));
  http::Request head = get("/fixed");
  head.method = "HEAD";
  response = client.send(head);
  CHECK(response.status == 200);
  CHECK(response.body.empty());
}

TEST_CASE("requests over a unix socket, with keep-alive reuse") {
  TempDir tmp;
  TestServer server((tmp.path / "api.sock").string());
  http::Client client(server.options());
  for (int i = 0; i < 20; ++i) {
    http::Response response = client.send(post("/echo", std::string(i * 100, 'x')));
    CHECK(response.status == 200);
    CHECK(response.body.starts_with(
        echo_expect("POST", std::string(i * 100, 'x'), "none", std::to_string(i * 100))));
  }
  CHECK(server.requests() == 20);
  CHECK(server.accepted() == 1);
}

TEST_CASE("unix_socket_follow_links false: no link anywhere on the path is followed") {
  // A sandbox's directory (decision 251): whatever is put at the socket's path, the client reaches
  // the socket file there or nothing.
  TempDir tmp;
  const auto real = fs::weakly_canonical(tmp.path);
  TestServer server((real / "agent.sock").string());
  fs::create_directory(real / "sandbox");
  http::ClientOptions options = server.options();
  options.unix_socket_follow_links = false;
  http::Client client(options);
  auto get_via = [&](const fs::path& socket) {
    http::Request request = get("/fixed");
    request.unix_socket = socket.string();
    return client.send(std::move(request));
  };
  CHECK(get_via(real / "agent.sock").status == 200);  // the real socket, by a path without links

  auto refused = [&](const fs::path& socket, const std::string& why) {
    try {
      get_via(socket);
      FAIL("connected through " << socket);
    } catch (const sbx::sdk::Error& e) {
      CHECK(e.status() == SBX_STATUS_UNAVAILABLE);
      CHECK_FALSE(e.retryable());
      CHECK(std::string(e.what()).find(why) != std::string::npos);
      return e.details().reason;
    }
    return std::string();
  };
  // A symbolic link in the socket's place, to a socket that answers: not followed.
  fs::create_symlink(real / "agent.sock", real / "sandbox" / "link.sock");
  CHECK(refused(real / "sandbox" / "link.sock", "a symbolic link (not followed)") ==
        sbx::sdk::kUnixSocketRefused);
  // A link on the way.
  fs::create_directory_symlink(real / "sandbox", real / "linkdir");
  CHECK(refused(real / "linkdir" / "link.sock", "a symbolic link") == sbx::sdk::kUnixSocketRefused);
  // A directory, a regular file, a FIFO where the socket should be.
  fs::create_directory(real / "sandbox" / "dir.sock");
  CHECK(refused(real / "sandbox" / "dir.sock", "a directory") == sbx::sdk::kUnixSocketRefused);
  { std::ofstream(real / "sandbox" / "file.sock") << "x"; }
  CHECK(refused(real / "sandbox" / "file.sock", "a regular file") == sbx::sdk::kUnixSocketRefused);
  REQUIRE(::mkfifo((real / "sandbox" / "fifo.sock").c_str(), 0600) == 0);
  CHECK(refused(real / "sandbox" / "fifo.sock", "a FIFO") == sbx::sdk::kUnixSocketRefused);
  // Nothing in a directory that exists: removed by someone (the reason says so); a directory
  // missing on the way is a sandbox that is gone (no reason).
  CHECK(refused(real / "sandbox" / "none.sock", "no such file") == sbx::sdk::kUnixSocketRefused);
  CHECK(refused(real / "gone" / "agent.sock", "no such file").empty());
  // A socket file nobody listens on.
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, (real / "sandbox" / "dead.sock").c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(fd);
  }
  // The socket file is found; the connection itself is refused, as any refused connection is.
  try {
    get_via(real / "sandbox" / "dead.sock");
    FAIL("connected to a socket nobody listens on");
  } catch (const sbx::sdk::Error& e) {
    CHECK(e.status() == SBX_STATUS_UNAVAILABLE);
    CHECK(std::string(e.what()).find("Connection refused") != std::string::npos);
    CHECK(e.details().reason.empty());
  }
  // Following links (the default) still reaches the socket through the link.
  http::Client following(server.options());
  http::Request request = get("/fixed");
  request.unix_socket = (real / "sandbox" / "link.sock").string();
  CHECK(following.send(std::move(request)).status == 200);
}

TEST_CASE("a unix socket path too long for an address is refused, naming it") {
  const std::string path = "/tmp/" + std::string(200, 'x') + "/agent.sock";
  http::Client client(http::ClientOptions{.unix_socket = path});
  try {
    client.send(get("/"));
    FAIL("sent");
  } catch (const sbx::sdk::Error& e) {
    CHECK(e.status() == SBX_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
}

TEST_CASE("an answer's head that never ends is refused past kMaxHeaderBytes") {
  TempDir tmp;
  const std::string socket = (tmp.path / "endless.sock").string();
  const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket.c_str());
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    char buf[4096];
    (void)::read(fd, buf, sizeof buf);
    std::string line = "HTTP/1.1 200 OK\r\n";
    const std::string filler = "X-Filler: " + std::string(1000, 'x') + "\r\n";
    size_t sent = 0;
    while (!stop && ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) > 0) {
      sent += line.size();
      line = filler;
      if (sent > 64 * sbx::sdk::http::kMaxHeaderBytes) break;  // a bound for the test itself
    }
    ::close(fd);
  });
  http::Client client(http::ClientOptions{.unix_socket = socket});
  try {
    client.send(get("/"));
    FAIL("answered");
  } catch (const sbx::sdk::Error& e) {
    CHECK(e.status() == SBX_STATUS_RESOURCE_EXHAUSTED);
    CHECK(std::string(e.what()).find("head") != std::string::npos);
  }
  stop = true;
  peer.join();
  ::close(listener);
}

TEST_CASE("sequential requests reuse one TCP connection") {
  TestServer server;
  http::Client client(server.options());
  for (int i = 0; i < 20; ++i) {
    CHECK(client.send(get(i % 2 ? "/fixed" : "/chunked?n=2")).status == 200);
  }
  CHECK(server.requests() == 20);
  CHECK(server.accepted() == 1);
}

TEST_CASE("streamed uploads: exact Content-Length, or chunked, and never Expect") {
  TempDir tmp;
  TestServer server((tmp.path / "s.sock").string());
  http::Client client(server.options());

  const uint64_t size = 32ull << 20;
  ByteStream source(size);
  http::Request request;
  request.method = "POST";
  request.target = "/echo";
  request.body_size = static_cast<int64_t>(size);
  request.body_source = [&](char* buffer, size_t capacity) {
    return source.fill(buffer, capacity);
  };
  http::Response response = client.send(std::move(request));
  CHECK(source.left == 0);
  CHECK(response.body.starts_with("method=POST size=" + std::to_string(size) +
                                  " hash=" + std::to_string(source.hash) +
                                  " te=none cl=" + std::to_string(size) + " expect=none"));

  ByteStream chunked_source(5 << 20);
  http::Request chunked;
  chunked.method = "PUT";
  chunked.target = "/echo";
  chunked.body_source = [&](char* b, size_t c) { return chunked_source.fill(b, c); };
  response = client.send(std::move(chunked));
  CHECK(response.body.starts_with("method=PUT size=" + std::to_string(5 << 20) +
                                  " hash=" + std::to_string(chunked_source.hash) +
                                  " te=chunked cl=none expect=none"));
}

TEST_CASE("a Docker-style hijacked stream is delivered through on_body as it arrives") {
  TestServer server;
  http::Client client(server.options());
  std::vector<std::pair<Clock::duration, std::string>> pieces;  // loop thread only until done
  Clock::duration headers_at{}, completed_at{};
  long header_status = 0;
  std::string content_type;
  const auto started = Clock::now();

  http::Request request = post("/hijack?n=5&delay_ms=150", "");
  request.on_headers = [&](long status, const http::Headers& headers) {
    headers_at = Clock::now() - started;
    header_status = status;
    for (const auto& [name, value] : headers) {
      if (name == "Content-Type") content_type = value;
    }
  };
  request.on_body = [&](std::string_view bytes) {
    pieces.emplace_back(Clock::now() - started, std::string(bytes));
  };
  http::Call call = client.start(std::move(request), [&](http::Response*, const Error*) {
    completed_at = Clock::now() - started;
  });
  http::Response response = call.get();

  CHECK(response.status == 200);
  CHECK(header_status == 200);
  CHECK(content_type == "application/vnd.docker.raw-stream");
  CHECK(response.body.empty());  // it went to on_body
  std::string all;
  for (const auto& piece : pieces)
    all += piece.second;
  CHECK(all == "part-0\npart-1\npart-2\npart-3\npart-4\n");
  REQUIRE(pieces.size() >= 2);
  CHECK(headers_at <= pieces.front().first);
  // The first bytes came long before the end: streamed, not buffered until close.
  CHECK(completed_at - pieces.front().first >= 300ms);
  CHECK(pieces.back().first - pieces.front().first >= 300ms);
}

TEST_CASE("a pulled body pauses its transfer while unread; the client's other requests go on") {
  TestServer server;
  http::Client client(server.options());
  constexpr int kTotal = 8 * 1024 * 1024;
  constexpr size_t kLimit = 64 * 1024;
  http::Request request = post("/bytes?n=" + std::to_string(kTotal), "");
  request.pull_body_limit = kLimit;
  http::Call call = client.start(std::move(request));

  // Nobody reads for a while: the transfer pauses instead of buffering megabytes, and the
  // client's loop is free for other requests meanwhile.
  std::this_thread::sleep_for(300ms);
  CHECK(client.send(get("/fixed")).body == "hello");

  std::string chunk;
  size_t received = 0, largest = 0;
  bool in_order = true, done = false;
  while (!done) {
    done = call.read_body(chunk, Clock::now() + 10s);
    largest = std::max(largest, chunk.size());
    for (char c : chunk)
      in_order = in_order && static_cast<unsigned char>(c) == received++ % 256;
  }
  CHECK(call.get().status == 200);
  CHECK(call.get().body.empty());
  CHECK(received == static_cast<size_t>(kTotal));
  CHECK(in_order);
  CHECK(largest <= kLimit + CURL_MAX_WRITE_SIZE);  // never more than the limit plus one write
}

TEST_CASE("chunked responses stream too, and leave the connection reusable") {
  TestServer server;
  http::Client client(server.options());
  std::vector<Clock::time_point> times;
  std::string all;
  http::Request request = get("/chunked?n=4&delay_ms=100");
  request.on_body = [&](std::string_view bytes) {
    times.push_back(Clock::now());
    all += bytes;
  };
  http::Response response = client.send(std::move(request));
  auto done = Clock::now();
  CHECK(all == "chunk-0\nchunk-1\nchunk-2\nchunk-3\n");
  REQUIRE(!times.empty());
  CHECK(done - times.front() >= 200ms);
  CHECK(client.send(get("/fixed")).body == "hello");
  CHECK(server.accepted() == 1);
}

TEST_CASE("a buffered response body has a cap; a peer that never stops cannot eat the memory") {
  TestServer server;
  http::Client client(server.options());
  http::Request request = get("/bytes?n=10000000");
  request.max_body_bytes = 1024 * 1024;
  Error error = error_of([&] { client.send(std::move(request)); });
  CHECK(error.status() == SBX_STATUS_RESOURCE_EXHAUSTED);
  CHECK(std::string(error.what()).find("larger than 1048576 bytes") != std::string::npos);
  // Within the cap, or streamed, the same body is fine.
  http::Request fits = get("/bytes?n=100000");
  fits.max_body_bytes = 1024 * 1024;
  CHECK(client.send(std::move(fits)).body.size() == 100000);
  size_t streamed = 0;
  http::Request stream = get("/bytes?n=10000000");
  stream.max_body_bytes = 1024;
  stream.on_body = [&](std::string_view bytes) { streamed += bytes.size(); };
  client.send(std::move(stream));
  CHECK(streamed == 10000000);
}

TEST_CASE("the request deadline fails with Error::timeout") {
  TestServer server;
  http::Client client(server.options());
  http::Request request = get("/slow?ms=5000");
  request.timeout = 200ms;
  auto started = Clock::now();
  Error error = error_of([&] { client.send(std::move(request)); });
  auto elapsed = Clock::now() - started;
  CHECK(error.status() == SBX_STATUS_TIMEOUT);
  CHECK(std::string(error.what()).find("/slow") != std::string::npos);
  CHECK(elapsed >= 200ms);
  CHECK(elapsed < 2s);
  // A deadline that is not reached changes nothing.
  http::Request quick = get("/slow?ms=10");
  quick.timeout = 5s;
  CHECK(client.send(std::move(quick)).body == "slow");
}

TEST_CASE("Call::cancel from another thread fails the call with Error::cancelled") {
  TestServer server;
  http::Client client(server.options());
  http::Call call = client.start(get("/slow?ms=10000"));
  CHECK_FALSE(call.wait_until(Clock::now() + 50ms));
  CHECK_FALSE(call.done());
  auto started = Clock::now();
  std::jthread canceller([call] {
    std::this_thread::sleep_for(100ms);
    call.cancel();
    call.cancel();  // idempotent
  });
  Error error = error_of([&] { call.get(); });
  CHECK(error.status() == SBX_STATUS_CANCELLED);
  CHECK(std::string(error.what()) == "GET " + server.base_url() + "/slow?ms=10000: cancelled");
  CHECK(Clock::now() - started < 2s);
  CHECK(call.done());
  CHECK(call.wait_until(Clock::now()));
  // Cancelling a finished call has no effect; the client keeps working.
  http::Call finished = client.start(get("/fixed"));
  CHECK(finished.get().body == "hello");
  finished.cancel();
  CHECK(finished.get().body == "hello");
}

TEST_CASE("send() honours a stop_token") {
  TestServer server;
  http::Client client(server.options());
  std::stop_source source;
  std::jthread canceller([&] {
    std::this_thread::sleep_for(100ms);
    source.request_stop();
  });
  auto started = Clock::now();
  Error error = error_of([&] { client.send(get("/slow?ms=10000"), source.get_token()); });
  CHECK(error.status() == SBX_STATUS_CANCELLED);
  CHECK(Clock::now() - started < 2s);

  // Already cancelled: nothing is sent.
  const int before = server.requests();
  CHECK(error_of([&] { client.send(get("/fixed"), source.get_token()); }).status() ==
        SBX_STATUS_CANCELLED);
  CHECK(client.send(get("/fixed")).status == 200);
  CHECK(server.requests() == before + 1);
}

TEST_CASE("connection failures are Error::unavailable naming the socket or URL") {
  TempDir tmp;
  const std::string missing = (tmp.path / "nobody-here.sock").string();
  http::ClientOptions options;
  options.unix_socket = missing;
  http::Client unix_client(options);
  Error error = error_of([&] { unix_client.send(get("/_ping")); });
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK(error.retryable());
  CHECK(std::string(error.what()).starts_with("cannot connect to " + missing + ": "));
  CHECK(std::string(error.what()).find(std::generic_category().message(ENOENT)) !=
        std::string::npos);

  // A bound but not listening port refuses connections.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  http::ClientOptions tcp_options;
  tcp_options.base_url = url;
  http::Client tcp_client(tcp_options);
  error = error_of([&] { tcp_client.send(get("/x")); });
  close(fd);
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK(std::string(error.what()).starts_with("cannot connect to " + url + "/x: "));
  CHECK(std::string(error.what()).find(std::generic_category().message(ECONNREFUSED)) !=
        std::string::npos);
}

TEST_CASE("200 concurrent requests from several threads each complete exactly once") {
  TestServer server;
  http::Client client(server.options());
  constexpr int kThreads = 4, kPerThread = 50, kTotal = kThreads * kPerThread;
  std::vector<std::atomic<int>> completions(kTotal);
  std::vector<http::Call> calls(kTotal);
  std::vector<std::string> bodies(kTotal);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t * kPerThread; i < (t + 1) * kPerThread; ++i) {
          bodies[i] = "request " + std::to_string(i);
          http::Request request = i % 5 == 0 ? get("/slow?ms=20") : post("/echo", bodies[i]);
          calls[i] =
              client.start(std::move(request),
                           [&completions, i](http::Response*, const Error*) { completions[i]++; });
        }
      });
    }
  }
  for (int i = 0; i < kTotal; ++i) {
    CAPTURE(i);
    http::Response response = calls[i].get();
    CHECK(response.status == 200);
    if (i % 5 == 0) {
      CHECK(response.body == "slow");
    } else {
      CHECK(response.body.starts_with(
          echo_expect("POST", bodies[i], "none", std::to_string(bodies[i].size()))));
    }
  }
  for (int i = 0; i < kTotal; ++i)
    CHECK(completions[i] == 1);
  CHECK(server.requests() == kTotal);
  CHECK(server.accepted() <= 64);  // ClientOptions::max_connections
}

TEST_CASE("max_connections caps open connections; the rest wait their turn") {
  TestServer server;
  http::ClientOptions options = server.options();
  options.max_connections = 2;
  http::Client client(options);
  std::vector<http::Call> calls;
  for (int i = 0; i < 8; ++i)
    calls.push_back(client.start(get("/slow?ms=50")));
  for (auto& call : calls)
    CHECK(call.get().body == "slow");
  CHECK(server.requests() == 8);
  CHECK(server.accepted() <= 2);
}

TEST_CASE("destroying the client cancels what is in flight, each exactly once") {
  TestServer server;
  constexpr int kCalls = 10;
  std::vector<std::atomic<int>> completions(kCalls);
  std::vector<std::atomic<int>> cancelled(kCalls);
  std::vector<http::Call> calls;
  auto client = std::make_unique<http::Client>(server.options());
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(
        client->start(get("/slow?ms=20000"), [&, i](http::Response* response, const Error* error) {
          completions[i]++;
          if (!response && error && error->status() == SBX_STATUS_CANCELLED) {
            cancelled[i]++;
          }
        }));
  }
  std::this_thread::sleep_for(100ms);  // let them reach the server
  auto started = Clock::now();
  client.reset();
  CHECK(Clock::now() - started < 2s);
  for (int i = 0; i < kCalls; ++i) {
    CAPTURE(i);
    CHECK(completions[i] == 1);
    CHECK(cancelled[i] == 1);
    CHECK(calls[i].done());
    CHECK(error_of([&] { calls[i].get(); }).status() == SBX_STATUS_CANCELLED);
    calls[i].cancel();  // the client is gone: still safe, still no effect
  }
  CHECK(server.accepted() == kCalls);
}

TEST_CASE(
    "after(): functions run on the loop thread once due, in due order; a request they start "
    "goes out") {
  TestServer server;
  http::Client client(server.options());
  std::mutex mutex;
  std::vector<int> order;
  std::vector<double> waited_ms;
  std::atomic<int> statuses{0};
  const auto started = Clock::now();
  auto note = [&](int which) {
    std::lock_guard lock(mutex);
    order.push_back(which);
    waited_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - started).count());
  };
  client.after(300ms, [&] { note(3); });
  client.after(100ms, [&] {
    note(1);
    // From the loop thread, as a retry would: a request started here completes normally.
    client.start(get("/fixed"), [&](http::Response* response, const Error*) {
      if (response && response->status == 200) statuses++;
    });
  });
  client.after(200ms, [&] { note(2); });
  client.after(0ms, [] { throw std::runtime_error("ignored"); });
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    {
      std::lock_guard lock(mutex);
      if (order.size() == 3 && statuses == 1) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard lock(mutex);
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(statuses == 1);
  REQUIRE(waited_ms.size() == 3);
  CHECK(waited_ms[0] >= 100);
  CHECK(waited_ms[2] >= 300);
}

TEST_CASE(
    "after(): what is pending when the client is destroyed runs then; its requests are "
    "cancelled") {
  TestServer server;
  auto client = std::make_unique<http::Client>(server.options());
  std::atomic<int> ran{0};
  std::atomic<int> cancelled{0};
  client->after(60s, [&, c = client.get()] {
    ran++;
    c->start(get("/fixed"), [&](http::Response* response, const Error* error) {
      if (!response && error && error->status() == SBX_STATUS_CANCELLED) cancelled++;
    });
  });
  const auto started = Clock::now();
  client.reset();
  CHECK(Clock::now() - started < 2s);
  CHECK(ran == 1);
  CHECK(cancelled == 1);
}

TEST_CASE("errors thrown by request callbacks abort the request and propagate") {
  TestServer server;
  http::Client client(server.options());

  int body_calls = 0;
  http::Request request = get("/hijack?n=20&delay_ms=100");
  request.on_body = [&](std::string_view) {
    ++body_calls;
    throw Error::not_found("container went away");
  };
  auto started = Clock::now();
  Error error = error_of([&] { client.send(std::move(request)); });
  CHECK(error.status() == SBX_STATUS_NOT_FOUND);
  CHECK(std::string(error.what()) == "container went away");
  CHECK(body_calls == 1);
  CHECK(Clock::now() - started < 1s);  // it did not wait for the 2 s stream to end

  http::Request headers = get("/fixed");
  headers.on_headers = [](long, const http::Headers&) {
    throw Error::failed_precondition("wrong content type");
  };
  error = error_of([&] { client.send(std::move(headers)); });
  CHECK(error.status() == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(std::string(error.what()) == "wrong content type");

  http::Request upload;
  upload.method = "POST";
  upload.target = "/echo";
  upload.body_size = 1 << 20;
  upload.body_source = [](char*, size_t) -> size_t { throw Error::invalid_argument("bad file"); };
  error = error_of([&] { client.send(std::move(upload)); });
  CHECK(error.status() == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(error.what()) == "bad file");

  http::Request other = get("/fixed");
  other.on_body = [](std::string_view) { throw std::runtime_error("plain exception"); };
  error = error_of([&] { client.send(std::move(other)); });
  CHECK(error.status() == SBX_STATUS_INTERNAL);
  CHECK(std::string(error.what()) == "plain exception");

  // The client is still healthy afterwards.
  CHECK(client.send(get("/fixed")).body == "hello");
}

TEST_CASE("send() from a request callback fails instead of deadlocking") {
  TestServer server;
  http::Client client(server.options());
  std::optional<sbx_status> status;
  http::Call call = client.start(get("/fixed"), [&](http::Response*, const Error*) {
    try {
      client.send(get("/fixed"));
    } catch (const Error& error) {
      status = error.status();
    }
  });
  CHECK(call.get().body == "hello");
  CHECK(status == SBX_STATUS_INTERNAL);
}

TEST_CASE("url_encode keeps unreserved characters only") {
  CHECK(http::url_encode("abcXYZ019-._~") == "abcXYZ019-._~");
  CHECK(http::url_encode("a b/c?d=e&f") == "a%20b%2Fc%3Fd%3De%26f");
  CHECK(http::url_encode("{\"label\":[\"x=1\"]}") == "%7B%22label%22%3A%5B%22x%3D1%22%5D%7D");
  CHECK(http::url_encode("\xC3\xA9") == "%C3%A9");
  CHECK(http::url_encode("").empty());
}

// ---- Transport features for HTTP plugins (issue 11) -------------------------------------------

TEST_CASE("keep-alive expiry: a connection idle past keepalive_expiry is not reused") {
  TestServer server;
  http::ClientOptions options = server.options();
  options.keepalive_expiry = 1s;
  http::Client client(options);
  CHECK(client.send(get("/fixed")).status == 200);
  std::this_thread::sleep_for(300ms);
  CHECK(client.send(get("/fixed")).status == 200);
  CHECK(server.accepted() == 1);  // idle 0.3 s: reused
  std::this_thread::sleep_for(1300ms);
  CHECK(client.send(get("/fixed")).status == 200);
  CHECK(server.accepted() == 2);  // idle 1.3 s: a new connection
  CHECK(server.requests() == 3);

  // 0: never reused.
  TestServer fresh;
  http::ClientOptions never = fresh.options();
  never.keepalive_expiry = 0ms;
  http::Client no_reuse(never);
  for (int i = 0; i < 3; ++i)
    CHECK(no_reuse.send(get("/fixed")).status == 200);
  CHECK(fresh.accepted() == 3);
}

TEST_CASE("a server that closes idle connections after 1.5 s: no request fails") {
  TestServer server("", 1500);
  http::ClientOptions options = server.options();
  options.keepalive_expiry = 1s;
  http::Client client(options);
  for (auto gap : {0ms, 200ms, 1100ms, 300ms, 1800ms, 100ms}) {
    std::this_thread::sleep_for(gap);
    CHECK(client.send(post("/echo", "x")).status == 200);  // a POST: never resent
  }
  CHECK(server.requests() == 6);
  CHECK(server.accepted() == 3);  // new connections after the 1.1 s and the 1.8 s gaps
  CHECK(server.dropped() == 0);
}

TEST_CASE("a stale reused connection: an idempotent request is sent once more, a POST is not") {
  TestServer server;
  http::Client client(server.options());
  CHECK(client.send(get("/once")).body == "fresh conn=0");
  // The next request goes out on connection 0, which drops it unanswered: sent again on a new one.
  http::Response response = client.send(get("/once"));
  CHECK(response.body == "fresh conn=1");
  CHECK(server.dropped() == 1);
  CHECK(server.requests() == 3);
  CHECK(server.accepted() == 2);

  // A POST on the reused connection 1 is dropped the same way, and not sent again.
  Error error = error_of([&] { client.send(post("/once", "{}")); });
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK(error.may_have_run());
  CHECK_FALSE(error.retryable());
  CHECK(std::string(error.what()).find("POST is not idempotent") != std::string::npos);
  CHECK(server.dropped() == 2);
  CHECK(server.requests() == 4);

  // Request::idempotent overrides the method's default (e.g. a POST with an idempotency key).
  CHECK(client.send(get("/once")).body.starts_with("fresh conn="));  // a new connection
  const int accepted = server.accepted();
  http::Request keyed = post("/once", "{}");
  keyed.idempotent = true;
  CHECK(client.send(std::move(keyed)).body ==
        "fresh conn=" + std::to_string(accepted));  // dropped on the reused one, then sent again
  CHECK(server.dropped() == 3);
}

TEST_CASE("connection lost on a new connection: retryable for GET, 'may have run' for POST") {
  TestServer server;
  http::Client client(server.options());
  Error error = error_of([&] { client.send(get("/drop")); });
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK(error.retryable());
  CHECK_FALSE(error.may_have_run());
  CHECK(server.dropped() == 1);  // a new connection is not sent again

  error = error_of([&] { client.send(post("/drop", "{\"a\":1}")); });
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK_FALSE(error.retryable());
  CHECK(error.may_have_run());
  CHECK(std::string(error.what()).starts_with("POST " + server.base_url() + "/drop: "));
  CHECK(server.dropped() == 2);

  // A deadline after a POST went out: a timeout that may have run, not retryable.
  http::Request slow = post("/slow?ms=5000", "{}");
  slow.timeout = 200ms;
  error = error_of([&] { client.send(std::move(slow)); });
  CHECK(error.status() == SBX_STATUS_TIMEOUT);
  CHECK(error.may_have_run());
  CHECK_FALSE(error.retryable());

  // Nothing was sent when the connection was refused: retryable, whatever the method.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  http::ClientOptions refused;
  refused.base_url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  http::Client refused_client(refused);
  error = error_of([&] { refused_client.send(post("/x", "{}")); });
  close(fd);
  CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
  CHECK(error.retryable());
  CHECK_FALSE(error.may_have_run());
}

TEST_CASE("idle timeout: silence fails with Error::timeout, a trickling stream lives on") {
  TestServer server;
  http::Client client(server.options());
  http::Request silent = get("/slow?ms=5000");
  silent.idle_timeout = 300ms;
  auto started = Clock::now();
  Error error = error_of([&] { client.send(std::move(silent)); });
  CHECK(error.status() == SBX_STATUS_TIMEOUT);
  CHECK(std::string(error.what()).find("idle_timeout") != std::string::npos);
  CHECK(Clock::now() - started >= 300ms);
  CHECK(Clock::now() - started < 3s);

  // 8 chunks 150 ms apart: 1.2 s in all, never 400 ms without a byte.
  std::string all;
  http::Request trickle = get("/chunked?n=8&delay_ms=150");
  trickle.idle_timeout = 400ms;
  trickle.on_body = [&](std::string_view bytes) { all += bytes; };
  CHECK(client.send(std::move(trickle)).status == 200);
  CHECK(all.find("chunk-7") != std::string::npos);

  // Time paused by an unread pulled body is not idle time.
  http::Request pulled = get("/bytes?n=4000000");
  pulled.pull_body_limit = 16 * 1024;
  pulled.idle_timeout = 200ms;
  http::Call call = client.start(std::move(pulled));
  std::this_thread::sleep_for(600ms);
  std::string chunk;
  size_t received = 0;
  for (bool done = false; !done;) {
    done = call.read_body(chunk, Clock::now() + 10s);
    received += chunk.size();
  }
  CHECK(call.get().status == 200);
  CHECK(received == 4000000);
}

TEST_CASE("pushed bodies: written from another thread, with back-pressure") {
  TestServer server;
  http::Client client(server.options());

  // Chunked, from a producer that stalls half way: the client's other requests go on.
  http::Request request;
  request.method = "POST";
  request.target = "/echo";
  request.push_body = true;
  request.push_buffer_limit = 8 * 1024;
  request.idle_timeout = 5s;
  http::Call upload = client.start(std::move(request));
  std::atomic<bool> stalled{false}, resume{false};
  std::string sent;
  std::jthread producer([&] {
    for (int i = 0; i < 100; ++i) {
      std::string piece(1000, static_cast<char>('a' + i % 26));
      CHECK(upload.write_body(piece) == piece.size());
      sent += piece;
      if (i == 50) {
        stalled = true;
        while (!resume)
          std::this_thread::sleep_for(10ms);
      }
    }
    upload.finish_body();
  });
  while (!stalled)
    std::this_thread::sleep_for(5ms);
  CHECK(client.send(get("/fixed")).body == "hello");  // while the upload waits for its producer
  CHECK_FALSE(upload.done());
  resume = true;
  http::Response response = upload.get();
  producer.join();
  CHECK(response.body.starts_with("method=POST size=100000 hash=" + std::to_string(fnv1a(sent)) +
                                  " te=chunked cl=none"));

  // Back-pressure: 128 MiB through an 8 KiB buffer to a server that reads nothing for 1.5 s.
  // Loopback socket buffers hold a few MiB, so a write of 96 MiB with a deadline of 1 s cannot
  // complete: the writer is held back instead of the bytes piling up in memory.
  constexpr size_t kTotal = 128 << 20;
  http::Request big;
  big.method = "PUT";
  big.target = "/echo?read_delay_ms=1500";
  big.push_body = true;
  big.body_size = kTotal;
  big.push_buffer_limit = 8 * 1024;
  http::Call call = client.start(std::move(big));
  const std::string bytes(96 << 20, 'z');
  auto started = Clock::now();
  size_t written = call.write_body(bytes, started + 1s);
  CHECK(Clock::now() - started >= 1s);
  CHECK(written < bytes.size());
  CHECK(written > 0);
  while (written < kTotal) {
    const std::string_view piece =
        std::string_view(bytes).substr(0, std::min(bytes.size(), kTotal - written));
    const size_t n = call.write_body(piece);
    written += n;
    if (n < piece.size()) break;
  }
  call.finish_body();
  CHECK(written == kTotal);
  CHECK(call.get().body.starts_with(
      "method=PUT size=" + std::to_string(kTotal) + " hash=" +
      std::to_string(
          fnv1a(std::string_view(bytes).substr(0, kTotal - bytes.size()), fnv1a(bytes))) +
      " te=none cl=" + std::to_string(kTotal)));

  // A producer's failure fails the request with its error.
  http::Request failing;
  failing.method = "POST";
  failing.target = "/echo";
  failing.push_body = true;
  http::Call failed = client.start(std::move(failing));
  CHECK(failed.write_body("partial") == 7);
  failed.fail_body(Error::not_found("the local file vanished"));
  Error error = error_of([&] { failed.get(); });
  CHECK(error.status() == SBX_STATUS_NOT_FOUND);
  CHECK(std::string(error.what()) == "the local file vanished");
  CHECK(failed.write_body("more") == 0);  // the call is over

  // send() cannot take one (nobody could write it).
  http::Request pushed;
  pushed.push_body = true;
  CHECK(error_of([&] { client.send(std::move(pushed)); }).status() == SBX_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("streamed multipart/form-data: parts of known and unknown size, parsed by the server") {
  TestServer server;
  http::Client client(server.options());
  const std::string metadata = "{\"path\":\"/work/a.bin\",\"mode\":644}";
  auto build = [&](bool known_size, ByteStream& stream) {
    http::Multipart form;
    form.add({.name = "metadata",
              .filename = "metadata",
              .content_type = "application/json",
              .bytes = metadata});
    http::Multipart::Part file{.name = "file",
                               .filename = "/work/a \"b\".bin",
                               .content_type = "application/octet-stream"};
    file.source = [&stream](char* buffer, size_t capacity) {
      return stream.fill(buffer, capacity);
    };
    file.size = known_size ? static_cast<int64_t>(stream.left) : -1;
    form.add(std::move(file));
    form.add({.name = "note", .bytes = "plain value"});
    return form;
  };
  const std::string expected_tail = " type=application/octet-stream size=3000000 hash=";

  ByteStream known(3'000'000);
  http::Multipart form = build(true, known);
  CHECK(form.content_type() == "multipart/form-data; boundary=" + form.boundary());
  CHECK(form.boundary().size() >= 32);
  CHECK(http::Multipart().boundary() != form.boundary());  // random
  const int64_t size = form.size();
  CHECK(size > 3'000'000);
  http::Request request = post("/multipart", "");
  http::Multipart::attach(request, std::move(form));
  CHECK(request.body_size == size);
  std::string body = client.send(std::move(request)).body;
  CHECK(body == "name=metadata filename=metadata type=application/json size=" +
                    std::to_string(metadata.size()) + " hash=" + std::to_string(fnv1a(metadata)) +
                    "\nname=file filename=/work/a %22b%22.bin" + expected_tail +
                    std::to_string(known.hash) +
                    "\nname=note filename=none type=none size=11 hash=" +
                    std::to_string(fnv1a("plain value")) + "\n");

  // Unknown size: chunked, pumped from this thread into a pushed body.
  ByteStream unknown(3'000'000);
  http::Multipart pumped = build(false, unknown);
  CHECK(pumped.size() == -1);
  http::Request push = post("/multipart", "");
  pumped.prepare_push(push);
  CHECK(push.push_body);
  http::Call call = client.start(std::move(push));
  CHECK(pumped.pump(call));
  body = call.get().body;
  CHECK(body.find("name=file filename=/work/a %22b%22.bin" + expected_tail +
                  std::to_string(unknown.hash) + "\n") != std::string::npos);
  CHECK(body.starts_with("name=metadata "));

  // A source that breaks its declared size fails the request.
  ByteStream short_stream(1000);
  http::Multipart liar;
  liar.add({.name = "file",
            .source = [&](char* b, size_t c) { return short_stream.fill(b, c); },
            .size = 2000});
  http::Request lying = post("/multipart", "");
  http::Multipart::attach(lying, std::move(liar));
  Error error = error_of([&] { client.send(std::move(lying)); });
  CHECK(error.status() == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(error.what()).find("ended after 1000 of its 2000 bytes") != std::string::npos);
}

TEST_CASE("default headers go with every request; a request header of the same name wins") {
  TestServer server;
  http::ClientOptions options = server.options();
  options.default_headers = {{"OPEN-SANDBOX-API-KEY", "secret"}, {"X-Trace", "default"}};
  http::Client client(options);
  std::string body = client.send(get("/headers")).body;
  CHECK(body.find("open-sandbox-api-key: secret\n") != std::string::npos);
  CHECK(body.find("x-trace: default\n") != std::string::npos);
  http::Request request = get("/headers");
  request.headers = {{"x-TRACE", "mine"}};
  body = client.send(std::move(request)).body;
  CHECK(body.find("x-trace: mine\n") != std::string::npos);
  CHECK(body.find("default") == std::string::npos);
  CHECK(body.find("open-sandbox-api-key: secret\n") != std::string::npos);
}

TEST_CASE("the body cap covers error bodies too") {
  TestServer server;
  http::Client client(server.options());
  http::Request request = get("/big-error?n=2000000");
  request.max_body_bytes = 1 << 20;
  Error error = error_of([&] { client.send(std::move(request)); });
  CHECK(error.status() == SBX_STATUS_RESOURCE_EXHAUSTED);
  http::Request small = get("/big-error?n=1000");
  small.max_body_bytes = 1 << 20;
  http::Response response = client.send(std::move(small));
  CHECK(response.status == 500);
  CHECK(response.body.size() == 1000);
}

TEST_CASE("range requests: the 206's Content-Range is checked; a 200 is refused") {
  TestServer server;
  http::Client client(server.options());
  auto ranged = [&](int status, const std::string& content_range, http::ByteRange range) {
    http::Request request =
        get("/range?status=" + std::to_string(status) + "&cr=" + http::url_encode(content_range));
    request.range = range;
    return request;
  };
  http::Response response = client.send(ranged(206, "bytes 10-15/100", {.start = 10, .end = 15}));
  CHECK(response.status == 206);
  CHECK(response.body == "ranged");
  CHECK(response.header("X-Range") == "bytes=10-15");
  // Open end, unknown total; an end cut short by the end of the resource.
  CHECK(client.send(ranged(206, "bytes 10-15/*", {.start = 10})).header("X-Range") == "bytes=10-");
  CHECK(client.send(ranged(206, "bytes 10-15/16", {.start = 10, .end = 99})).status == 206);
  // 416 and other statuses are answers for the caller.
  CHECK(client.send(ranged(416, "bytes */5", {.start = 10})).status == 416);

  auto message = [&](http::Request request) {
    Error error = error_of([&] { client.send(std::move(request)); });
    CHECK(error.status() == SBX_STATUS_INTERNAL);
    return std::string(error.what());
  };
  CHECK(message(ranged(200, "", {.start = 10})).find("the server ignored the range") !=
        std::string::npos);
  CHECK(message(ranged(206, "bytes 0-5/100", {.start = 10})).find("starts at 0, not at 10") !=
        std::string::npos);
  CHECK(message(ranged(206, "bytes 10-20/100", {.start = 10, .end = 15}))
            .find("ends at 20, after 15") != std::string::npos);
  CHECK(message(ranged(206, "bytes 10-12/100", {.start = 10, .end = 15})).find("before 15") !=
        std::string::npos);
  CHECK(message(ranged(206, "bytes 10-15/100", {.start = 10, .total = 50}))
            .find("100 bytes, not 50") != std::string::npos);
  CHECK(message(ranged(206, "", {.start = 10})).find("not a byte range") != std::string::npos);
  CHECK(message(ranged(206, "bytes x-15/100", {.start = 10})).find("not of the form") !=
        std::string::npos);
}

namespace {

// Sets (or unsets) an environment variable for a scope, restoring the old value after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value) {
      setenv(name.c_str(), value, 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  ~ScopedEnv() {
    if (old) {
      setenv(name.c_str(), old->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
};

}  // namespace

TEST_CASE("proxy policy: no proxy unless asked, whatever http_proxy says") {
  TestServer target, proxy;
  const std::string proxy_url = "http://127.0.0.1:" + proxy.base_url().substr(17);
  ScopedEnv http_proxy("http_proxy", proxy_url.c_str());
  ScopedEnv all_proxy("ALL_PROXY", proxy_url.c_str());
  ScopedEnv no_proxy("no_proxy", nullptr);
  ScopedEnv no_proxy_upper("NO_PROXY", nullptr);
  {
    http::Client client(target.options());
    CHECK(client.send(get("/fixed")).body == "hello");
  }
  CHECK(proxy.accepted() == 0);
  CHECK(target.requests() == 1);
  {
    http::ClientOptions options = target.options();
    options.use_env_proxy = true;
    http::Client client(options);
    client.send(get("/fixed"));  // the test server as a proxy answers 404 to "GET http://..."
  }
  CHECK(proxy.requests() == 1);
  CHECK(target.requests() == 1);
  {
    TestServer explicit_proxy;
    http::ClientOptions options = target.options();
    options.proxy = explicit_proxy.base_url();
    http::Client client(options);
    client.send(get("/fixed"));
    CHECK(explicit_proxy.requests() == 1);
    CHECK(proxy.requests() == 1);
  }
  CHECK(target.requests() == 1);
}

namespace {

// Runs a shell command line (fixed strings and paths under a test's temp dir only).
int run(const std::string& command) {
  return std::system(command.c_str());
}

// `openssl s_server -www` on 127.0.0.1, an ephemeral port: a real TLS server for one test.
class TlsServer {
 public:
  TlsServer(const fs::path& cert, const fs::path& key, const std::string& extra = "") {
    int out[2];
    REQUIRE(pipe(out) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      const std::string line =
          "OPENSSL_CONF=/dev/null exec openssl s_server -accept 127.0.0.1:0 -www -cert '" +
          cert.string() + "' -key '" + key.string() + "' " + extra + " 2>/dev/null";
      execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];  // kept open (and unread) until the end: s_server writes a line per client
    std::string text;
    char c;
    while (text.find('\n', text.find("ACCEPT")) == std::string::npos && read(out_, &c, 1) == 1)
      text += c;
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos) port_ = std::atoi(text.c_str() + colon + 1);
    if (port_ <= 0) stop();
    REQUIRE(port_ > 0);
  }
  ~TlsServer() { stop(); }
  void stop() {
    if (pid_ > 0) {  // our own child, by its id
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (out_ >= 0) close(out_);
    out_ = -1;
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int port_ = 0;
};

}  // namespace

TEST_CASE("TLS: verified by default; ca_bundle, client certificates, insecure_skip_verify") {
  REQUIRE(run("command -v openssl > /dev/null") == 0);
  sbx::testing::TempDir tmp("sbx-http-tls");
  const fs::path cert = tmp.path / "server.pem", key = tmp.path / "server.key";
  const fs::path client_cert = tmp.path / "client.pem", client_key = tmp.path / "client.key";
  const std::string req = "openssl req -config /dev/null -x509 -newkey rsa:2048 -nodes -days 2 ";
  REQUIRE(run(req + "-keyout '" + key.string() + "' -out '" + cert.string() +
              "' -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null") == 0);
  REQUIRE(run(req + "-keyout '" + client_key.string() + "' -out '" + client_cert.string() +
              "' -subj /CN=sbx-client 2>/dev/null") == 0);

  {
    TlsServer server(cert, key);
    http::ClientOptions options;
    options.base_url = server.url();
    {
      http::Client client(options);  // the system's CAs do not know this certificate
      Error error = error_of([&] { client.send(get("/")); });
      CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
      CHECK_FALSE(error.retryable());
      CHECK(std::string(error.what())
                .starts_with("TLS: the certificate of " + server.url() + "/ did not verify"));
    }
    {
      http::ClientOptions trusted = options;
      trusted.ca_bundle = cert.string();
      http::Client client(trusted);
      CHECK(client.send(get("/")).status == 200);
    }
    {
      http::ClientOptions insecure = options;
      insecure.insecure_skip_verify = true;
      http::Client client(insecure);
      CHECK(client.send(get("/")).status == 200);
    }
    {
      http::ClientOptions missing = options;
      missing.ca_bundle = (tmp.path / "nothing.pem").string();
      http::Client client(missing);
      CHECK(error_of([&] { client.send(get("/")); }).status() == SBX_STATUS_INVALID_ARGUMENT);
    }
  }
  {
    // A server that requires a client certificate signed by (here: equal to) client.pem.
    TlsServer server(cert, key, "-Verify 1 -CAfile '" + client_cert.string() + "'");
    http::ClientOptions options;
    options.base_url = server.url();
    options.ca_bundle = cert.string();
    {
      http::Client client(options);
      Error error = error_of([&] { client.send(get("/")); });
      const std::string what = error.what();
      CAPTURE(what);
      CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
      CHECK_FALSE(error.retryable());
      CHECK(what.starts_with("TLS: " + server.url() + "/ refused this client"));
      CHECK(what.find("client_cert") != std::string::npos);
    }
    options.client_cert = client_cert.string();
    options.client_key = client_key.string();
    http::Client client(options);
    CHECK(client.send(get("/")).status == 200);
  }
  {
    // https:// to a port that speaks plain HTTP (it answers 400 at once and closes): a TLS
    // error that says so.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    REQUIRE(listen(fd, 4) == 0);
    std::jthread plain([fd] {
      int peer = accept(fd, nullptr, nullptr);
      if (peer < 0) return;
      const std::string answer = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
      (void)!send(peer, answer.data(), answer.size(), MSG_NOSIGNAL);
      shutdown(peer, SHUT_WR);
      char sink[4096];
      while (recv(peer, sink, sizeof sink, 0) > 0) {
      }
      close(peer);
    });
    http::ClientOptions options;
    options.base_url = "https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    http::Client client(options);
    Error error = error_of([&] { client.send(get("/fixed")); });
    plain.join();
    close(fd);
    const std::string what = error.what();
    CAPTURE(what);
    CHECK(error.status() == SBX_STATUS_UNAVAILABLE);
    CHECK_FALSE(error.retryable());
    CHECK(std::string(error.what())
              .starts_with("TLS handshake with " + options.base_url + "/fixed failed"));
  }
}
