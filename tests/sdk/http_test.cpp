#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/sdk/http.hpp>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
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
class TestServer {
 public:
  // TCP on 127.0.0.1 with an ephemeral port, or a unix socket at `unix_path`.
  explicit TestServer(std::string unix_path = "") : unix_path_(std::move(unix_path)) {
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

 private:
  struct Request {
    std::string method, path;
    std::map<std::string, std::string> query, headers;  // header names lowercased
    uint64_t body_size = 0, body_hash = kFnvOffset;
  };

  struct Connection {
    int fd;
    int id;
    std::string buffer;

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
    while (!stopping_ && read_request(connection, request)) {
      ++requests_;
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
