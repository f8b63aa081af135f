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
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace serve_test;
using namespace std::chrono_literals;
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
      if (name.rfind("logs-", 0) != 0 && name != ".lock") out.push_back(name);
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
  // The answer's head (up to its blank line), read a byte at a time: nothing of the body.
  std::string read_head() {
    std::string out;
    char c = 0;
    while (out.find("\r\n\r\n") == std::string::npos && ::recv(fd_, &c, 1, 0) == 1)
      out += c;
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

TEST_CASE("a sandbox full of background sleeps: 429 beyond its cap; another sandbox's echo runs") {
  Fixture f({"--max-commands", "4", "--max-queued-commands", "2"});
  const std::string a = f.create(), b = f.create();
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {  // 4 running, 2 waiting for a slot
    const auto events =
        run(f.port(), Fixture::execd(a, "/command"), command_body("sleep 60", true));
    CHECK(events.back().at("type") == "execution_complete");
    ids.push_back(command_id(events));
  }
  const auto refused =
      request(f.port(), "POST", Fixture::execd(a, "/command"), command_body("sleep 60", true));
  CHECK(refused.status == 429);
  CHECK(refused.json().at("code") == "TOO_MANY_COMMANDS");
  CHECK(std::string(refused.json().at("message").as_string())
            .find("4 commands running and 2 waiting") != std::string::npos);
  // A foreground one is refused the same way, before its stream starts.
  CHECK(request(f.port(), "POST", Fixture::execd(a, "/command"), command_body("echo x")).status ==
        429);

  const auto events = run(f.port(), Fixture::execd(b, "/command"), command_body("echo hi"));
  REQUIRE(events.size() >= 3);
  CHECK(events[events.size() - 2].at("text") == "hi");
  CHECK(events.back().at("type") == "execution_complete");
  // A's commands still run (and wait): B did not wait for them.
  for (const auto& cid : ids)
    CHECK(f.status(a, cid).at("running") == true);

  // A waiting command can be interrupted: it ends as killed without having run.
  CHECK(request(f.port(), "DELETE", Fixture::execd(a, "/command?id=" + ids.back())).status == 200);
  const auto st = f.status(a, ids.back());
  CHECK(st.at("running") == false);
  CHECK(st.at("error") == "signal: killed");
  // Deleting A cancels the running ones and the waiting one.
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + a).status == 204);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("the defaults keep one sandbox from taking every provider slot (40 background sleeps)") {
  Fixture f;  // 8 running + 24 waiting per sandbox; test_processes has 32 threads
  const std::string a = f.create(), b = f.create();
  int accepted = 0, refused = 0;
  std::string first;
  for (int i = 0; i < 40; ++i) {
    const auto r =
        request(f.port(), "POST", Fixture::execd(a, "/command"), command_body("sleep 120", true));
    if (r.status == 200) {
      ++accepted;
      if (first.empty()) {
        const auto at = r.body.find("\"text\":\"");
        first = r.body.substr(at + 8, 32);
      }
    } else {
      CHECK(r.status == 429);
      ++refused;
    }
  }
  CHECK(accepted == 32);
  CHECK(refused == 8);
  const auto events = run(f.port(), Fixture::execd(b, "/command"), command_body("echo hi"));
  CHECK(events.back().at("type") == "execution_complete");
  CHECK(f.status(a, first).at("running") == true);  // B answered while A's sleeps run
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + a).status == 204);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a command waiting for a slot starts when one frees (foreground, streamed)") {
  Fixture f({"--max-commands", "1"});
  const std::string a = f.create();
  const fs::path gate = f.dir.path / "gate";
  const auto first =
      run(f.port(), Fixture::execd(a, "/command"),
          command_body("while [ ! -e " + gate.string() + " ]; do sleep 0.05; done", true));
  const std::string first_id = command_id(first);
  StreamClient waiting(f.port(), "POST", Fixture::execd(a, "/command"),
                       command_body("echo second"));
  REQUIRE(waiting.status() == 200);
  const auto init = waiting.next_event();
  REQUIRE(init);
  const std::string second_id(init->at("text").as_string());
  CHECK(f.status(a, second_id).at("running") == true);
  CHECK(f.status(a, first_id).at("running") == true);
  std::ofstream(gate).put('x');  // the first ends; the second gets its slot
  const auto rest = waiting.rest();
  REQUIRE(rest.size() >= 2);
  CHECK(rest[rest.size() - 2].at("text") == "second");
  CHECK(rest.back().at("type") == "execution_complete");
  CHECK(f.status(a, first_id).at("running") == false);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("finished records: the last --kept-commands are kept, with bounded text") {
  Fixture f({"--kept-commands", "3"});
  const std::string a = f.create();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i)
    ids.push_back(command_id(
        run(f.port(), Fixture::execd(a, "/command"), command_body("echo " + std::to_string(i)))));
  CHECK(f.status_code(a, ids[0]) == 404);  // dropped, as an unknown id
  CHECK(f.status_code(a, ids[1]) == 404);
  for (int i = 2; i < 5; ++i)
    CHECK(f.status_code(a, ids[static_cast<std::size_t>(i)]) == 200);
  const auto unknown = request(f.port(), "GET", Fixture::execd(a, "/command/status/" + ids[0]));
  CHECK(unknown.json().at("code") == "INVALID_REQUEST_BODY");

  // A 100 KB command runs whole; its record keeps 4 KiB of it.
  const std::string big = "true " + std::string(100000, 'x');
  const auto events = run(f.port(), Fixture::execd(a, "/command"), command_body(big));
  CHECK(events.back().at("type") == "execution_complete");
  const auto st = f.status(a, command_id(events));
  CHECK(st.at("content").as_string().size() == 4096);
  CHECK(std::string(st.at("content").as_string()) == big.substr(0, 4096));
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a background command's log stops at --command-log-limit, with a marker line") {
  Fixture f({"--command-log-limit", "65536"});
  const std::string a = f.create();
  const auto cid = command_id(run(f.port(), Fixture::execd(a, "/command"),
                                  command_body("head -c 300000 /dev/zero | tr '\\0' a", true)));
  CHECK(eventually([&] { return f.status(a, cid).at("running") == false; }));
  CHECK(f.status(a, cid).at("exit_code") == 0);
  const auto logs = request(f.port(), "GET", Fixture::execd(a, "/command/" + cid + "/logs"));
  REQUIRE(logs.status == 200);
  REQUIRE(logs.body.size() > 65536);
  CHECK(logs.body.substr(0, 65536) == std::string(65536, 'a'));
  const std::string marker = logs.body.substr(65536);
  CHECK(marker.rfind("\n[sbx serve: ", 0) == 0);  // the marker line, and no output after it
  CHECK(marker.find("limit of 65536 bytes") != std::string::npos);
  CHECK(marker.size() < 200);
  CHECK(marker.back() == '\n');
  CHECK(logs.headers.at("execd-commands-tail-cursor") == std::to_string(logs.body.size()));
  CHECK(f.server->stop() == 0);
}

TEST_CASE("downloads stream through: three at once, each past --temp-limit, nothing staged") {
  Fixture f({"--temp-limit", std::to_string(8 << 20)});
  const std::string a = f.create();
  CHECK(run(f.port(), Fixture::execd(a, "/command"), command_body("seq 1 3000000 > big"))
            .back()
            .at("type") == "execution_complete");
  std::string expected;
  for (int i = 1; i <= 3000000; ++i)
    expected += std::to_string(i) + "\n";  // 21.9 MB
  // All three answers start; each is then read in turn, the others held meanwhile (the server
  // waits for its client, the provider for the server).
  std::vector<std::unique_ptr<StreamClient>> downloads;
  for (int i = 0; i < 3; ++i) {
    downloads.push_back(std::make_unique<StreamClient>(
        f.port(), "GET", Fixture::execd(a, "/files/download?path=big")));
    CHECK(downloads.back()->status() == 200);
    CHECK(downloads.back()->headers().at("content-length") == std::to_string(expected.size()));
  }
  CHECK(f.staged().empty());
  for (auto& d : downloads)
    CHECK(d->body() == expected);
  // Line mode streams too, and stops reading the file past its last line.
  const auto lines =
      request(f.port(), "GET", Fixture::execd(a, "/files/download?path=big&offset=5&limit=3"));
  CHECK(lines.status == 200);
  CHECK(lines.body == "5\n6\n7\n");
  CHECK(f.staged().empty());
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a client that hangs up mid-download cancels the provider's transfer") {
  Fixture f;
  const std::string a = f.create();
  CHECK(run(f.port(), Fixture::execd(a, "/command"), command_body("truncate -s 6G big"))
            .back()
            .at("type") == "execution_complete");
  {
    RawClient client(f.port(), get_text(f.port(), Fixture::execd(a, "/files/download?path=big")));
    const std::string head = client.read_head();
    CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(head.find("Content-Length: 6442450944") != std::string::npos);
    client.hang_up();
  }
  // The server notices and cancels the provider's transfer, long before 6 GiB could be read.
  CHECK(eventually(
      [&] { return f.log_text().find("cancelled: its client went away") != std::string::npos; }));
  CHECK(f.staged().empty());
  CHECK(request(f.port(), "GET", "/health").status == 200);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a server killed with SIGKILL leaves its temp dir; the next one removes it at start") {
  Fixture f;
  const fs::path old_temp = f.server_temp();
  std::ofstream(old_temp / "upload-left-behind") << "partial";
  REQUIRE(::kill(f.server->pid(), SIGKILL) == 0);
  f.server.reset();  // reaps it
  REQUIRE(fs::exists(old_temp / "upload-left-behind"));
  // Another user's look-alike, and one without the lock, are not the server's to remove.
  const fs::path unlocked = f.tmp / "sbx-serve-abcdef";
  fs::create_directories(unlocked);
  f.start({}, {{"TMPDIR", f.tmp.string()}, {"SBX_LOG_LEVEL", "info"}});
  CHECK_FALSE(fs::exists(old_temp));
  CHECK(fs::exists(unlocked));
  int temp_dirs = 0;
  for (const auto& e : fs::directory_iterator(f.tmp))
    temp_dirs += e.path().filename().string().rfind("sbx-serve-", 0) == 0 ? 1 : 0;
  CHECK(temp_dirs == 2);  // the new server's, and the look-alike
  CHECK(f.log_text().find("left by a server that did not stop") != std::string::npos);
  const int stopped = f.server->stop();
  const std::string log = f.log_text();
  CHECK_MESSAGE(stopped == 0, log.substr(log.size() > 4000 ? log.size() - 4000 : 0));
  fs::remove_all(unlocked);
}

TEST_CASE("no ping follows a stream's final event (pings every 1 ms, one busy server thread)") {
  Fixture f({"--threads", "1"}, json::object{{"serve", json::object{{"keepalive_ping_s", 0.001}}}});
  const std::string a = f.create();
  auto one = [&](int i) {
    StreamClient s(f.port(), "POST", Fixture::execd(a, "/command"),
                   command_body("seq 1 " + std::to_string(200 + i) + "; sleep 0.01"));
    auto events = s.rest();
    int finals = 0;
    for (const auto& e : events)
      finals += e.at("type") == "execution_complete" || e.at("type") == "error" ? 1 : 0;
    return finals == 1 && events.back().at("type") == "execution_complete";
  };
  int bad = 0;
  for (int round = 0; round < 15; ++round) {
    std::vector<std::future<bool>> runs;
    for (int i = 0; i < 4; ++i)
      runs.push_back(std::async(std::launch::async, one, i));
    for (auto& r : runs)
      bad += r.get() ? 0 : 1;
  }
  CHECK(bad == 0);
  CHECK(f.server->stop() == 0);
}

#ifdef SBX_HAVE_OPENSANDBOX
TEST_CASE("a slow reader's stream is cut; the plugin's thread serves another sandbox meanwhile") {
  // Backend B: test_processes. Front F: the opensandbox plugin pointed at B, so that a command's
  // output reaches F on the plugin's I/O thread. B never cuts F's stream (its buffer holds the
  // whole flood): on a busy machine F's plugin may read slower than `yes` writes, and a cut by B
  // would end A's stream with an error event instead of F's cut.
  Fixture back({"--stream-buffer", "4294967296"});
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
  // A floods and its client reads nothing. Lines of 8 KB: before F's queue grows, the kernel's
  // socket buffers (several MB) fill, and in events of a few bytes that takes minutes under TSan.
  RawClient slow(front.port(),
                 post_text(front.port(), Fixture::execd(a, "/command"),
                           command_body("yes \"$(head -c 8000 /dev/zero | tr '\\0' f)\" | "
                                        "head -c 200000000")));
  // B's command completes meanwhile, through the same plugin.
  const auto events = run(front.port(), Fixture::execd(b, "/command"), command_body("echo hi"), 60);
  REQUIRE(events.size() >= 3);
  CHECK(events[events.size() - 2].at("text") == "hi");
  CHECK(events.back().at("type") == "execution_complete");
  // A's stream is cut while its client still reads nothing (the client reads only once F says so:
  // reading earlier would drain what F queued), then it breaks off without a final event.
  CHECK(eventually(
      [&] {
        return front.log_text().find("cutting a command's event stream") != std::string::npos;
      },
      120s));
  const std::string got = slow.read_all();
  INFO("the stream's last bytes: ", got.substr(got.size() > 600 ? got.size() - 600 : 0));
  INFO("the front server's log: ", front.log_text());
  CHECK(got.find("HTTP/1.1 200") == 0);
  CHECK(got.find("execution_complete") == std::string::npos);
  CHECK(got.find("\r\n0\r\n\r\n") == std::string::npos);  // no end of the chunked body
  CHECK(front.log_text().find("cutting a command's event stream") != std::string::npos);
  CHECK(front.server->stop() == 0);
}
#endif
