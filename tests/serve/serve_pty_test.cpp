// execd's terminals on the gateway (serve/routes_execd_pty.cpp) over test_processes' sbx.pty/1:
// POST /pty, the WebSocket with its frames (connected, stdout, stderr, replay, exit), resize,
// signals, takeover, pipe mode, GET and DELETE, and the refusals. The client is the SDK's
// WebSocket (sbx/sdk/websocket.hpp), a real one over the loopback. Every read is bounded (30 s:
// a watchdog shuts the socket).

#include "support.hpp"

#include <doctest/doctest.h>

#include <sbx/sdk/websocket.hpp>

#include <boost/json.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace {

using namespace serve_test;
using namespace std::chrono_literals;
namespace json = boost::json;
using sbx::sdk::WebSocket;

struct Fixture : ProcessesServer {
  std::string id;  // a sandbox made by the fixture

  Fixture() {
    write_config(processes_block());
    start();
    const auto r = request(port(), "POST", "/v1/sandboxes",
                           R"({"image":{"uri":"x"},"entrypoint":["sh"],"resourceLimits":{}})");
    REQUIRE(r.status == 202);
    id = std::string(r.json().at("id").as_string());
  }
  std::string execd(const std::string& rest) const {
    return "/sandboxes/" + id + "/proxy/44772" + rest;
  }
  std::string new_terminal(const std::string& body = "{}") {
    const auto r = request(port(), "POST", execd("/pty"), body);
    REQUIRE(r.status == 200);
    return std::string(r.json().at("session_id").as_string());
  }
  WebSocket attach(const std::string& terminal, const std::string& query = "") {
    return WebSocket::open({.port = static_cast<uint16_t>(port())},
                           execd("/pty/" + terminal + "/ws") + query, {}, 10s);
  }
};

// What one WebSocket received, read on the test's thread with a watchdog.
struct Client {
  WebSocket ws;
  std::string out, err, replay;
  std::optional<uint64_t> replay_offset;  // of the first replay frame
  std::vector<json::object> texts;
  std::optional<uint16_t> close_code;

  explicit Client(WebSocket socket) : ws(std::move(socket)) {}

  void stdin_bytes(const std::string& bytes) { ws.send_binary(std::string(1, '\0') + bytes); }
  void send_json(const json::object& o) { ws.send_text(json::serialize(o)); }

  // Reads until `done()`; false when the socket ended first or 30 s passed.
  bool read_until(const std::function<bool()>& done) {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::thread watchdog([&] {
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, 30s, [&] { return finished; })) ws.shutdown();
    });
    bool ok = done();
    while (!ok) {
      auto message = ws.receive();
      if (!message) break;
      take(*message);
      ok = done();
      if (message->kind == WebSocket::Message::Kind::close) break;
    }
    {
      std::lock_guard lock(m);
      finished = true;
    }
    cv.notify_all();
    watchdog.join();
    return ok;
  }
  bool got_text(const std::string& type) const {
    for (const auto& t : texts)
      if (t.contains("type") && t.at("type") == json::value(type)) return true;
    return false;
  }
  const json::object& text_of(const std::string& type) const {
    for (const auto& t : texts)
      if (t.contains("type") && t.at("type") == json::value(type)) return t;
    FAIL("no " << type << " frame");
    throw;
  }

 private:
  void take(const WebSocket::Message& m) {
    if (m.kind == WebSocket::Message::Kind::close) {
      close_code = m.close_code;
    } else if (m.kind == WebSocket::Message::Kind::text) {
      texts.push_back(json::parse(m.payload).as_object());
    } else if (!m.payload.empty()) {
      const std::string rest = m.payload.substr(1);
      if (m.payload[0] == '\x01') out += rest;
      if (m.payload[0] == '\x02') err += rest;
      if (m.payload[0] == '\x03' && rest.size() >= 8) {
        uint64_t offset = 0;
        for (int i = 0; i < 8; ++i)
          offset = (offset << 8) | static_cast<uint8_t>(rest[i]);
        if (!replay_offset) replay_offset = offset;
        replay += rest.substr(8);
      }
    }
  }
};

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("a terminal: connected, resize, echo, SIGINT, the exit frame and GET /pty/{id}") {
  Fixture f;
  const std::string id = f.new_terminal();
  Client c(f.attach(id));
  REQUIRE(c.read_until([&] { return c.got_text("connected"); }));
  CHECK(c.text_of("connected").at("mode") == "pty");
  CHECK(c.text_of("connected").at("session_id") == json::value(id));
  // As NeMo Gym does: execd starts terminals at 80 x 24, the client resizes after connecting.
  c.send_json({{"type", "resize"}, {"rows", 30}, {"cols", 90}});
  c.stdin_bytes("stty size\n");
  CHECK(c.read_until([&] { return has(c.out, "30 90"); }));
  c.stdin_bytes("echo sum=$((40+2))\n");
  CHECK(c.read_until([&] { return has(c.out, "sum=42"); }));
  c.send_json({{"type", "ping"}});
  CHECK(c.read_until([&] { return c.got_text("pong"); }));

  c.stdin_bytes("sh -c 'echo sleeping-$((2+3)); exec sleep 60'\n");
  REQUIRE(c.read_until([&] { return has(c.out, "sleeping-5"); }));
  c.send_json({{"type", "signal"}, {"signal", "SIGINT"}});
  c.stdin_bytes("echo after-$((50+5))\n");
  CHECK(c.read_until([&] { return has(c.out, "after-55"); }));
  c.send_json({{"type", "signal"}, {"signal", "SIGTERM"}});  // not a key: refused, said so
  CHECK(c.read_until([&] { return c.got_text("error"); }));

  c.stdin_bytes("exit 7\n");
  REQUIRE(c.read_until([&] { return c.close_code.has_value(); }));
  CHECK(c.close_code == 1000);
  CHECK(c.text_of("exit").at("exit_code") == 7);
  const auto status = request(f.port(), "GET", f.execd("/pty/" + id));
  REQUIRE(status.status == 200);
  CHECK(status.json().at("running") == false);
  CHECK(status.json().at("exit_code") == 7);
  CHECK(status.json().at("output_offset").to_number<int64_t>() > 0);
}

TEST_CASE("one holder: 409 without takeover; takeover closes the first with 4001 and replays") {
  Fixture f;
  const std::string id = f.new_terminal(R"({"command":"echo first-line; cat"})");
  Client one(f.attach(id));
  REQUIRE(one.read_until([&] { return has(one.out, "first-line"); }));

  CHECK_THROWS_WITH_AS(f.attach(id), doctest::Contains("409"), sbx::sdk::Error);

  Client two(f.attach(id, "?takeover=1&since=0"));
  REQUIRE(two.read_until([&] { return has(two.replay, "first-line"); }));
  CHECK(two.replay_offset == 0u);
  CHECK(two.text_of("connected").at("replay_from") == 0);
  REQUIRE(one.read_until([&] { return one.close_code.has_value(); }));
  CHECK(one.close_code == 4001);
  two.stdin_bytes("typed-later\n");
  CHECK(two.read_until([&] { return has(two.out, "typed-later"); }));

  // The client leaves: the terminal runs on, and the server still follows it.
  two.ws.close();
  REQUIRE(two.read_until([&] { return two.close_code.has_value(); }));
  const auto status = request(f.port(), "GET", f.execd("/pty/" + id));
  REQUIRE(status.status == 200);
  CHECK(status.json().at("running") == true);
  CHECK(!status.json().as_object().contains("exit_code"));

  // A third client, live only: no replay; then DELETE closes it with 1000. (With takeover: the
  // server lets go of the second only once the closed connection's end reaches it.)
  Client three(f.attach(id, "?takeover=1"));
  REQUIRE(three.read_until([&] { return three.got_text("connected"); }));
  three.stdin_bytes("fresh\n");
  CHECK(three.read_until([&] { return has(three.out, "fresh"); }));
  CHECK(three.replay.empty());
  CHECK(request(f.port(), "DELETE", f.execd("/pty/" + id)).status == 200);
  REQUIRE(three.read_until([&] { return three.close_code.has_value(); }));
  CHECK(three.close_code == 1000);
  CHECK(request(f.port(), "GET", f.execd("/pty/" + id)).status == 404);
  CHECK(request(f.port(), "DELETE", f.execd("/pty/" + id)).status == 404);
}

TEST_CASE("pipe mode (pty=0): stdout and stderr apart, stdin read, the exit code") {
  Fixture f;
  const std::string id = f.new_terminal(
      R"({"command":"echo to-out; echo to-err >&2; read line; echo got-$line; exit 3"})");
  Client c(f.attach(id, "?pty=0"));
  REQUIRE(c.read_until([&] { return has(c.out, "to-out") && has(c.err, "to-err"); }));
  CHECK(c.text_of("connected").at("mode") == "pipe");
  c.stdin_bytes("typed\n");
  REQUIRE(c.read_until([&] { return c.close_code.has_value(); }));
  CHECK(c.out == "to-out\ngot-typed\n");
  CHECK(c.err == "to-err\n");
  CHECK(c.text_of("exit").at("exit_code") == 3);

  // A command done before the socket could read: its output still arrives (the first attach
  // reads from the terminal's first byte).
  const std::string quick = f.new_terminal(R"({"command":"echo quick; exit 2"})");
  Client q(f.attach(quick, "?pty=0"));
  REQUIRE(q.read_until([&] { return q.close_code.has_value(); }));
  CHECK(q.out == "quick\n");
  CHECK(q.text_of("exit").at("exit_code") == 2);
}

TEST_CASE("a server stopped with a terminal attached and one only watched exits cleanly") {
  Fixture f;
  const std::string watched = f.new_terminal(R"({"command":"echo up; cat"})");
  {
    Client c(f.attach(watched));
    REQUIRE(c.read_until([&] { return has(c.out, "up"); }));
    c.ws.close();
    REQUIRE(c.read_until([&] { return c.close_code.has_value(); }));
  }
  const std::string held = f.new_terminal(R"({"command":"echo up; cat"})");
  Client c(f.attach(held));
  REQUIRE(c.read_until([&] { return has(c.out, "up"); }));
  CHECK(f.server->stop() == 0);
  const auto stopped = std::chrono::steady_clock::now();
  c.read_until([&] { return false; });  // returns when the socket ends (or after 30 s)
  CHECK(std::chrono::steady_clock::now() - stopped < 20s);
  CHECK(f.log_text().find("ERROR") == std::string::npos);
}

TEST_CASE("refusals: an unknown terminal, no upgrade, a bad since, a bad body") {
  Fixture f;
  const auto unknown = request(f.port(), "GET", f.execd("/pty/nope"));
  CHECK(unknown.status == 404);
  CHECK(unknown.json().at("code") == "CONTEXT_NOT_FOUND");  // execd's code (NeMo Gym checks it)
  CHECK(request(f.port(), "DELETE", f.execd("/pty/nope")).json().at("code") == "CONTEXT_NOT_FOUND");
  CHECK_THROWS_WITH_AS(f.attach("nope"), doctest::Contains("404"), sbx::sdk::Error);
  const std::string id = f.new_terminal();
  const auto plain = request(f.port(), "GET", f.execd("/pty/" + id + "/ws"));
  CHECK(plain.status == 400);
  CHECK(plain.json().at("code") == "INVALID_REQUEST");
  CHECK_THROWS_WITH_AS(f.attach(id, "?since=abc"), doctest::Contains("400"), sbx::sdk::Error);
  const auto bad = request(f.port(), "POST", f.execd("/pty"), R"({"command":5})");
  CHECK(bad.status == 400);
  CHECK(bad.json().at("code") == "INVALID_REQUEST_BODY");
  // Deleting a terminal never started is fine too.
  CHECK(request(f.port(), "DELETE", f.execd("/pty/" + id)).status == 200);
}
