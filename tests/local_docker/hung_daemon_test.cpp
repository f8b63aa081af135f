// local_docker against a daemon that hangs: a fake Docker daemon on a unix socket in this test
// answers what it is told to and never answers the rest. Nothing may wait longer than about one
// request timeout for it: neither concurrent first calls (one shared version negotiation) nor a
// failed create's clean-up.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

using namespace std::chrono_literals;
using ldtest::seconds_since;

namespace {

// A Docker daemon stand-in: HTTP/1.1 on a unix socket. For each request, `answer` returns the
// answer (sent after its delay), or nothing: then the connection is left without an answer until
// the client gives up or the server stops.
struct Reply {
  std::string body = "{}";  // JSON
  int status = 200;
  std::chrono::milliseconds delay{0};
};

class FakeDaemon {
 public:
  using Answer = std::function<std::optional<Reply>(const std::string& request_line)>;

  explicit FakeDaemon(Answer answer) : answer_(std::move(answer)) {
    path_ = (dir_.path / "docker.sock").string();
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener_ >= 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path_.c_str());
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(listener_, 64) == 0);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~FakeDaemon() {
    stop_ = true;
    accepter_.join();
    for (auto& t : connections_)
      t.join();
    ::close(listener_);
  }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  const std::string& socket() const { return path_; }
  // How many requests arrived whose request line ("GET /version HTTP/1.1") starts with `prefix`.
  int requests(const std::string& prefix) const {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& line : seen_)
      n += line.rfind(prefix, 0) == 0;
    return n;
  }

 private:
  // Waits until `fd` is readable or the server stops; false when it stops.
  bool readable(int fd) const {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }

  void accept_loop() {
    while (readable(listener_)) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) connections_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    std::string buffer;
    char chunk[4096];
    bool hanging = false;
    while (readable(fd)) {
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) break;  // the client gave up
      if (hanging) continue;
      buffer.append(chunk, static_cast<size_t>(n));
      for (size_t end; (end = buffer.find("\r\n\r\n")) != std::string::npos;) {
        const std::string head = buffer.substr(0, end);
        size_t length = 0;
        if (const size_t at = head.find("Content-Length: "); at != std::string::npos) {
          length = std::stoul(head.substr(at + 16));
        }
        if (buffer.size() < end + 4 + length) break;  // the body is still coming
        buffer.erase(0, end + 4 + length);
        const std::string line = head.substr(0, head.find("\r\n"));
        {
          std::lock_guard lock(mutex_);
          seen_.push_back(line);
        }
        const auto reply = answer_(line);
        if (!reply) {
          hanging = true;  // never answered
          break;
        }
        std::this_thread::sleep_for(reply->delay);
        const std::string response = "HTTP/1.1 " + std::to_string(reply->status) +
                                     " X\r\nContent-Type: application/json\r\nContent-Length: " +
                                     std::to_string(reply->body.size()) + "\r\n\r\n" + reply->body;
        (void)::send(fd, response.data(), response.size(), MSG_NOSIGNAL);
      }
    }
    ::close(fd);
  }

  sbx::testing::TempDir dir_{"sbx-ld-hung"};
  Answer answer_;
  std::string path_;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accepter_;
  std::vector<std::thread> connections_;  // touched by the accepter only, joined after it
  mutable std::mutex mutex_;
  std::vector<std::string> seen_;
};

sbx::Host::Options options_for(const FakeDaemon& daemon) {
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      R"({"providers": {"p": {"plugin": "local_docker", "config": {"socket": ")" + daemon.socket() +
          R"(", "request_timeout_s": 1}}}})",
      "test");
  return options;
}

}  // namespace

TEST_CASE("a daemon that never answers /version: concurrent first calls share one negotiation") {
  FakeDaemon daemon([](const std::string&) -> std::optional<Reply> { return std::nullopt; });
  sbx::Host host(options_for(daemon));
  sbx::Provider provider = host.provider("p");
  const auto start = std::chrono::steady_clock::now();
  auto spec = ldtest::spec();
  spec.ttl_s.reset();
  std::vector<sbx::Operation<sbx::Sandbox>> ops;
  for (int i = 0; i < 8; ++i)
    ops.push_back(provider.create_async(spec));
  // One more, cancelled while it waits: it ends at once, the others' negotiation goes on.
  auto cancelled = provider.create_async(spec);
  std::this_thread::sleep_for(200ms);
  const auto cancel_start = std::chrono::steady_clock::now();
  cancelled.cancel();
  CHECK_THROWS_AS(cancelled.get(), sbx::CancelledError);
  CHECK(seconds_since(cancel_start) < 0.5);
  for (auto& op : ops) {
    try {
      op.get();
      FAIL("a create against a daemon that does not answer must fail");
    } catch (const sbx::Error& e) {
      const std::string message = e.what();
      CHECK_MESSAGE(message.find("/version") != std::string::npos, message);
    }
  }
  const double took = seconds_since(start);
  MESSAGE("8 concurrent first calls failed after ", took, " s (request timeout 1 s)");
  CHECK(took < 2.0);  // one request timeout, not eight
  CHECK(daemon.requests("GET /version") == 1);
}

TEST_CASE("a create whose container request hangs: its clean-up takes one request timeout") {
  FakeDaemon daemon([](const std::string& line) -> std::optional<Reply> {
    if (line.rfind("GET /version ", 0) == 0) {
      return Reply{R"({"ApiVersion": "1.41", "MinAPIVersion": "1.12", "Version": "fake"})"};
    }
    if (line.rfind("GET /v1.41/images/", 0) == 0) return Reply{};  // the image is there
    // Each removal is answered, slowly: "no such container" after 0.8 s. The clean-up looks again
    // after a create that got no answer; all its looks together get one request timeout (1 s).
    if (line.rfind("DELETE /v1.41/containers/", 0) == 0) {
      return Reply{R"({"message": "No such container"})", 404, 800ms};
    }
    return std::nullopt;  // the create request, anything else: never answered
  });
  sbx::Host host(options_for(daemon));
  auto spec = ldtest::spec();
  spec.ttl_s.reset();  // no reaper to set up: the create request is the first to hang
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(host.provider("p").create(spec), sbx::Error);
  const double took = seconds_since(start);
  MESSAGE("the create failed after ", took, " s (request timeout 1 s), with ",
          daemon.requests("DELETE /v1.41/containers/"), " removal attempts");
  CHECK(daemon.requests("POST /v1.41/containers/create") == 1);
  CHECK(daemon.requests("DELETE /v1.41/containers/") >= 1);
  // 1 s for the create request, at most 1 s for all the removal attempts together.
  CHECK(took < 2.6);
}
