// No tenant starves another; memory and disk stay bounded (issue 17), through the real `sbx serve`
// process over test_processes (commands are host processes in the sandbox's directory; its pool
// has 32 threads, so a provider slot held by one sandbox is one another cannot have):
//   - per-sandbox command slots and a bounded queue (429 TOO_MANY_COMMANDS beyond), so that a
//     sandbox full of background sleeps leaves another sandbox's command its turn;
//   - a bounded number of finished records per sandbox, with bounded text;
//   - a background command's log capped, with a marker line;
//   - downloads staged against a temp-space cap, cancelled when the client hangs up;
//   - a slow reader's stream is cut instead of stalling the plugin's thread (the opensandbox
//     plugin in front of a second server);
//   - no ping after a stream's final event.

#include "support.hpp"

#include "../common/test_helpers.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace serve_test;
namespace json = boost::json;

namespace {

using sbx::testing::eventually;

struct Fixture : ProcessesServer {
  fs::path tmp = dir.path / "tmp";  // the server's TMPDIR: its temp dir goes in there

  explicit Fixture(std::vector<std::string> flags = {}, json::object top = {}) {
    fs::create_directories(tmp);
    write_config(processes_block(), std::move(top));
    start(std::move(flags), {{"TMPDIR", tmp.string()}, {"SBX_LOG_LEVEL", "info"}});
  }

  std::string create() {
    const auto r = request(port(), "POST", "/v1/sandboxes",
                           R"({"image":{"uri":"x"},"entrypoint":["sh"],"resourceLimits":{}})");
    REQUIRE(r.status == 202);
    return std::string(r.json().at("id").as_string());
  }
  static std::string execd(const std::string& id, const std::string& rest) {
    return "/sandboxes/" + id + "/proxy/44772" + rest;
  }
  json::value status(const std::string& id, const std::string& cid) {
    return request(port(), "GET", execd(id, "/command/status/" + cid)).json();
  }
  int status_code(const std::string& id, const std::string& cid) {
    return request(port(), "GET", execd(id, "/command/status/" + cid)).status;
  }
  // The server's own temp dir (sbx-serve-XXXXXX in TMPDIR).
  fs::path server_temp() const {
    for (const auto& e : fs::directory_iterator(tmp))
      if (e.path().filename().string().rfind("sbx-serve-", 0) == 0) return e.path();
    FAIL("the server made no temp dir in its TMPDIR");
    return {};
  }
  // Transfers staged in the server's temp dir (command logs aside).
  std::vector<std::string> staged() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(server_temp())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("logs-", 0) != 0) out.push_back(name);
    }
    return out;
  }
};

std::string command_body(const std::string& command, bool background = false) {
  return json::serialize(json::object{{"command", command}, {"background", background}});
}

// Starts a command: its stream's events (background: the whole short stream; foreground: read to
// the end).
std::vector<json::object> run(int port, const std::string& target, const std::string& body,
                              int read_timeout_s = 30) {
  StreamClient s(port, "POST", target, body, {}, read_timeout_s);
  REQUIRE(s.status() == 200);
  return s.rest();
}

std::string command_id(const std::vector<json::object>& events) {
  REQUIRE(!events.empty());
  REQUIRE(events.front().at("type") == "init");
  return std::string(events.front().at("text").as_string());
}

// A client on a plain socket, with a small receive buffer: it sends a request and then reads only
// when told (a slow reader), or hangs up.
class RawClient {
 public:
  RawClient(int port, const std::string& text) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    int small = 4096;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    timeval tv{60, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::send(fd_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      done += static_cast<std::size_t>(n);
    }
  }
  ~RawClient() { hang_up(); }
  // Everything up to EOF or a reset.
  std::string read_all() {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
  void hang_up() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string post_text(int port, const std::string& target, const std::string& body) {
  return "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}
std::string get_text(int port, const std::string& target) {
  return "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
}

}  // namespace

TEST_CASE("a download over --temp-limit is refused with 507, and nothing stays staged") {
  Fixture f({"--temp-limit", std::to_string(32 << 20)});
  const std::string a = f.create();
  CHECK(run(f.port(), Fixture::execd(a, "/command"), command_body("truncate -s 1G big"))
            .back()
            .at("type") == "execution_complete");
  StreamClient s(f.port(), "GET", Fixture::execd(a, "/files/download?path=big"));
  CHECK(s.status() == 507);
  const auto body = json::parse(s.body()).as_object();
  CHECK(body.at("code") == "INSUFFICIENT_STORAGE");
  CHECK(std::string(body.at("message").as_string()).find("33554432") != std::string::npos);
  CHECK(eventually([&] { return f.staged().empty(); }));
  // A small file still comes through.
  CHECK(run(f.port(), Fixture::execd(a, "/command"), command_body("echo small > s"))
            .back()
            .at("type") == "execution_complete");
  StreamClient small(f.port(), "GET", Fixture::execd(a, "/files/download?path=s"));
  CHECK(small.status() == 200);
  CHECK(small.body() == "small\n");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a client that hangs up while its download is staged cancels it; staging removed") {
  Fixture f({"--temp-limit", std::to_string(int64_t{8} << 30)});
  const std::string a = f.create();
  CHECK(run(f.port(), Fixture::execd(a, "/command"), command_body("truncate -s 6G big"))
            .back()
            .at("type") == "execution_complete");
  {
    RawClient client(f.port(), get_text(f.port(), Fixture::execd(a, "/files/download?path=big")));
    CHECK(eventually([&] { return !f.staged().empty(); }));  // the staging started
    client.hang_up();
  }
  // The server notices, cancels the provider's transfer and removes its staging directory long
  // before 6 GiB could be copied.
  CHECK(eventually(
      [&] { return f.log_text().find("cancelled: its client went away") != std::string::npos; }));
  CHECK(eventually([&] { return f.staged().empty(); }));
  CHECK(f.server->stop() == 0);
}


#ifdef SBX_HAVE_OPENSANDBOX
TEST_CASE("a slow reader's stream is cut; the plugin's thread serves another sandbox meanwhile") {
  // Backend B: test_processes. Front F: the opensandbox plugin pointed at B, so that a command's
  // output reaches F on the plugin's I/O thread.
  Fixture back;
  ProcessesServer front;
  fs::create_directories(front.dir.path / "tmp");
  front.write_config(json::object{
      {"plugin", "opensandbox"},
      {"config",
       json::object{
           {"connection", json::object{{"domain", "127.0.0.1:" + std::to_string(back.port())}}},
           {"probe", json::object{{"command", nullptr}}},
           {"attribution", json::object{{"enabled", false}}}}}});
  front.start({"--stream-buffer", "65536"});
  auto create = [&] {
    const auto r = request(front.port(), "POST", "/v1/sandboxes",
                           R"({"image":{"uri":"x"},"entrypoint":["sh"],"resourceLimits":{}})");
    REQUIRE(r.status == 202);
    return std::string(r.json().at("id").as_string());
  };
  const std::string a = create(), b = create();
  // A floods and its client reads nothing.
  RawClient slow(front.port(), post_text(front.port(), Fixture::execd(a, "/command"),
                                         command_body("yes flood | head -c 200000000")));
  // B's command completes meanwhile, through the same plugin.
  const auto events = run(front.port(), Fixture::execd(b, "/command"), command_body("echo hi"), 60);
  REQUIRE(events.size() >= 3);
  CHECK(events[events.size() - 2].at("text") == "hi");
  CHECK(events.back().at("type") == "execution_complete");
  // A's stream was cut: it breaks off without a final event, and its command ended as killed.
  const std::string got = slow.read_all();
  CHECK(got.find("HTTP/1.1 200") == 0);
  CHECK(got.find("execution_complete") == std::string::npos);
  CHECK(got.find("\r\n0\r\n\r\n") == std::string::npos);  // no end of the chunked body
  CHECK(front.log_text().find("cutting a command's event stream") != std::string::npos);
  CHECK(front.server->stop() == 0);
}
#endif
