// sbx-agent's PTY sessions (POST /pty, GET /pty/{id}, the WebSocket at /pty/{id}/ws, DELETE) and
// the pieces under them (SHA-1, base64, the frame parser, the replay ring). The real binary runs
// as a host process on a unix socket in a temporary directory this test makes; a real WebSocket
// client (Boost.Beast) speaks to it. Reads wait on frames with a timeout, never on sleeps.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "json.hpp"
#include "ring.hpp"
#include "ws.hpp"

namespace fs = std::filesystem;
namespace json = sbx::agent::json;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using local = net::local::stream_protocol;

namespace {

std::string hex(const std::array<uint8_t, 20>& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// A directory of this test, removed with its contents at the end (it made all of them).
struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "sbx-agent-pty-test-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The agent as a child of the test on `dir`/agent.sock, stopped with SIGTERM at the end.
struct Agent {
  pid_t pid = -1;
  std::string socket;
  explicit Agent(const TempDir& dir, std::vector<std::string> env = {}) {
    socket = dir.path + "/agent.sock";
    env.emplace_back("PATH=/usr/local/bin:/usr/bin:/bin");
    std::vector<std::string> args{SBX_AGENT_BIN, "--listen", "unix:" + socket};
    std::vector<char*> argv, envp;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env)
      envp.push_back(e.data());
    envp.push_back(nullptr);
    pid = ::fork();
    if (pid == 0) {
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    REQUIRE(pid > 0);
    // Ready when the socket accepts (there is no event to wait on from outside the process).
    for (int i = 0; i < 10000; ++i) {
      net::io_context ioc;
      local::socket s(ioc);
      beast::error_code ec;
      s.connect(local::endpoint(socket), ec);
      if (!ec) return;
      int status = 0;
      REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);
      ::usleep(1000);
    }
    FAIL("sbx-agent did not listen on " << socket);
  }
  ~Agent() {
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
};

struct Reply {
  int status = 0;
  std::string body;
  json::Value json;
  std::string header(const char* name) const { return headers.count(name) ? headers.at(name) : ""; }
  std::map<std::string, std::string> headers;
};

// One HTTP request on a connection of its own.
Reply request(const Agent& agent, http::verb verb, const std::string& target,
              const std::string& body = "",
              const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  net::io_context ioc;
  local::socket s(ioc);
  s.connect(local::endpoint(agent.socket));
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "agent");
  for (const auto& [k, v] : headers)
    req.set(k, v);
  req.body() = body;
  if (!body.empty() || verb == http::verb::post) req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res);
  Reply r;
  r.status = res.result_int();
  r.body = res.body();
  for (const auto& f : res)
    r.headers[std::string(f.name_string())] = std::string(f.value());
  std::string why;
  if (!r.body.empty()) json::parse(r.body, r.json, why);
  return r;
}

std::string new_session(const Agent& agent, const std::string& body = "") {
  const Reply r = request(agent, http::verb::post, "/pty", body);
  REQUIRE(r.status == 200);
  const json::Value* id = r.json.find("session_id");
  REQUIRE(id != nullptr);
  REQUIRE(id->text.size() == 32);
  CHECK(id->text.find_first_not_of("0123456789abcdef") == std::string::npos);
  return id->text;
}

std::string type_of(const json::Value& v) {
  const json::Value* t = v.find("type");
  return t ? t->text : "";
}

int64_t int_of(const json::Value& v, const char* name) {
  const json::Value* f = v.find(name);
  REQUIRE(f != nullptr);
  return f->integer;
}

// A WebSocket client of a session: frames read with a timeout.
class Ws {
 public:
  // The handshake's status: 101 when upgraded.
  int open(const Agent& agent, const std::string& target) {
    ws_.next_layer().connect(local::endpoint(agent.socket));
    websocket::response_type res;
    beast::error_code ec;
    ws_.handshake(res, "agent", target, ec);
    return res.result_int();
  }

  struct Message {
    bool closed = false;
    bool text = false;
    std::string data;
  };

  // The next message; fails the test after `timeout_ms` without one.
  Message read(int timeout_ms = 15000) { return read_for(timeout_ms); }
  Message read_for(int timeout_ms) {
    Message m;
    bool done = false;
    beast::error_code error;
    ws_.async_read(buf_, [&](beast::error_code ec, std::size_t) {
      error = ec;
      done = true;
    });
    ioc_.restart();
    ioc_.run_for(std::chrono::milliseconds(timeout_ms));
    if (!done) {
      ws_.next_layer().cancel();
      ioc_.restart();
      ioc_.run();
      FAIL("no WebSocket message within " << timeout_ms << " ms; output so far: " << out
                                          << "; stderr: " << err);
    }
    if (error) {
      m.closed = true;
      return m;
    }
    m.text = ws_.got_text();
    m.data = beast::buffers_to_string(buf_.data());
    buf_.consume(buf_.size());
    return m;
  }

  json::Value read_json() {
    const Message m = read();
    REQUIRE(!m.closed);
    REQUIRE(m.text);
    json::Value v;
    std::string why;
    REQUIRE(json::parse(m.data, v, why));
    return v;
  }

  // Reads until `done(stdout, stderr)` holds, or fails; text frames are kept in `texts`.
  void read_until(const std::function<bool()>& done) {
    while (!done()) {
      const Message m = read();
      REQUIRE_MESSAGE(!m.closed, "closed; output so far: " << out);
      if (m.text) {
        json::Value v;
        std::string why;
        REQUIRE(json::parse(m.data, v, why));
        texts.push_back(v);
        continue;
      }
      REQUIRE(!m.data.empty());
      if (m.data[0] == '\x01') out += m.data.substr(1);
      if (m.data[0] == '\x02') err += m.data.substr(1);
      if (m.data[0] == '\x03') {
        REQUIRE(m.data.size() >= 9);
        uint64_t offset = 0;
        for (int i = 1; i <= 8; ++i)
          offset = (offset << 8) | static_cast<unsigned char>(m.data[i]);
        replay_offsets.push_back(offset);
        replay += m.data.substr(9);
      }
    }
  }
  bool seen(const std::string& s) const { return out.find(s) != std::string::npos; }
  bool got(const std::string& type) const {
    for (const auto& v : texts)
      if (type_of(v) == type) return true;
    return false;
  }
  const json::Value* text_of(const std::string& type) const {
    for (const auto& v : texts)
      if (type_of(v) == type) return &v;
    return nullptr;
  }

  void stdin_bytes(const std::string& bytes) {
    ws_.binary(true);
    ws_.write(net::buffer(std::string(1, '\0') + bytes));
  }
  void text(const std::string& message) {
    ws_.text(true);
    ws_.write(net::buffer(message));
  }
  // The code and reason of the server's close (after read() said closed).
  websocket::close_reason reason() const { return ws_.reason(); }

  std::string out, err, replay;
  std::vector<uint64_t> replay_offsets;
  std::vector<json::Value> texts;

 private:
  net::io_context ioc_;
  websocket::stream<local::socket> ws_{ioc_};
  beast::flat_buffer buf_;
};

// Opens a WebSocket on session `id` and reads the connected frame.
json::Value attach(Ws& ws, const Agent& agent, const std::string& id,
                   const std::string& query = "") {
  REQUIRE(ws.open(agent, "/pty/" + id + "/ws" + query) == 101);
  json::Value hello = ws.read_json();
  REQUIRE(type_of(hello) == "connected");
  CHECK(hello.find("session_id")->text == id);
  return hello;
}

// Waits for the close frame, returning its code.
int wait_close(Ws& ws) {
  for (;;) {
    const Ws::Message m = ws.read();
    if (m.closed) return ws.reason().code;
    if (m.text) {
      json::Value v;
      std::string why;
      REQUIRE(json::parse(m.data, v, why));
      ws.texts.push_back(v);
    } else if (!m.data.empty() && m.data[0] == '\x01') {
      ws.out += m.data.substr(1);
    }
  }
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// The number after `key` in `text` (e.g. "pid=" in "pid=1234"), skipping the typed line's echo
// where a '$' follows the key.
std::optional<long> number_after(const std::string& text, const std::string& key) {
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const std::size_t start = at + key.size();
    std::size_t end = start;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9')
      ++end;
    if (end > start && end < text.size() && (text[end] == '\r' || text[end] == '\n'))
      return std::stol(text.substr(start, end - start));
  }
  return std::nullopt;
}

}  // namespace

// A WebSocket on `target` made by hand (the handshake, then raw masked frames), for what a
// library client will not send.
struct RawWs {
  net::io_context ioc;
  local::socket s{ioc};
  std::string got;     // what came after the handshake's head
  std::string accept;  // its Sec-WebSocket-Accept

  RawWs(const Agent& agent, const std::string& target) {
    s.connect(local::endpoint(agent.socket));
    const std::string req = "GET " + target +
                            " HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\n"
                            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                            "Sec-WebSocket-Version: 13\r\n\r\n";
    net::write(s, net::buffer(req));
    beast::flat_buffer buf;
    http::response_parser<http::empty_body> head;
    head.skip(true);
    http::read_header(s, buf, head);
    REQUIRE(head.get().result_int() == 101);
    accept = std::string(head.get()["Sec-WebSocket-Accept"]);
    got = beast::buffers_to_string(buf.data());
  }
  // A masked client frame.
  static std::string frame(uint8_t b0, const std::string& payload) {
    REQUIRE(payload.size() < 126);
    std::string f(1, static_cast<char>(b0));
    f += static_cast<char>(0x80 | payload.size());
    const unsigned char mask[4] = {0x0a, 0x0b, 0x0c, 0x0d};
    f.append(reinterpret_cast<const char*>(mask), 4);
    for (std::size_t i = 0; i < payload.size(); ++i)
      f += static_cast<char>(payload[i] ^ mask[i % 4]);
    return f;
  }
  void send(const std::string& bytes) { net::write(s, net::buffer(bytes)); }
  // Everything until the server closes.
  std::string rest() {
    char chunk[4096];
    beast::error_code ec;
    while (!ec) {
      const std::size_t n = s.read_some(net::buffer(chunk), ec);
      got.append(chunk, n);
    }
    return got;
  }
  // The code of the server's close frame (0 when there is none).
  int close_code() {
    const std::string all = rest();
    const std::size_t at = all.find('\x88');
    if (at == std::string::npos || all.size() < at + 4) return 0;
    return (static_cast<unsigned char>(all[at + 2]) << 8) | static_cast<unsigned char>(all[at + 3]);
  }
};

TEST_CASE("SHA-1, base64 and Sec-WebSocket-Accept match their specifications' vectors") {
  using namespace sbx::agent::ws;
  CHECK(hex(sha1("abc")) == "a9993e364706816aba3e25717850c26c9cd0d89d");
  CHECK(hex(sha1("")) == "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  CHECK(hex(sha1("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  CHECK(hex(sha1(std::string(1000000, 'a'))) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  CHECK(base64("") == "");
  CHECK(base64("f") == "Zg==");
  CHECK(base64("fo") == "Zm8=");
  CHECK(base64("foo") == "Zm9v");
  CHECK(base64("foobar") == "Zm9vYmFy");
  // RFC 6455, section 1.3.
  CHECK(accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  CHECK(valid_key("dGhlIHNhbXBsZSBub25jZQ=="));
  CHECK_FALSE(valid_key("dGhlIHNhbXBsZSBub25jZQ="));   // 23 characters
  CHECK_FALSE(valid_key("dGhlIHNhbXBsZSBub25jZR=="));  // trailing bits set: not 16 bytes
  CHECK_FALSE(valid_key("dGhl!HNhbXBsZSBub25jZQ=="));
}

TEST_CASE("the frame parser: masked frames decoded, the rest refused with its close code") {
  using namespace sbx::agent::ws;
  auto client_frame = [](uint8_t b0, const std::string& payload, bool masked = true) {
    std::string f(1, static_cast<char>(b0));
    const unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
    const char m = masked ? '\x80' : '\0';
    if (payload.size() < 126) {
      f += static_cast<char>(m | static_cast<char>(payload.size()));
    } else {
      f += static_cast<char>(m | 126);
      f += static_cast<char>(payload.size() >> 8);
      f += static_cast<char>(payload.size() & 0xff);
    }
    if (masked) f.append(reinterpret_cast<const char*>(mask), 4);
    for (std::size_t i = 0; i < payload.size(); ++i)
      f += static_cast<char>(payload[i] ^ (masked ? mask[i % 4] : 0));
    return f;
  };
  Parser p(1000);
  Frame f;
  const std::string big(300, 'x');
  std::string in = client_frame(0x81, "hello") + client_frame(0x82, big);
  // Byte by byte: nothing until a frame is whole.
  std::string part;
  for (std::size_t i = 0; i + 1 < 11; ++i) {
    part += in[i];
    CHECK(p.next(part, f) == Parser::Result::need_more);
  }
  REQUIRE(p.next(in, f) == Parser::Result::frame);
  CHECK(f.opcode == kText);
  CHECK(f.payload == "hello");
  REQUIRE(p.next(in, f) == Parser::Result::frame);
  CHECK(f.opcode == kBinary);
  CHECK(f.payload == big);
  CHECK(in.empty());

  // Many frames from one buffer at an offset that advances; nothing erased meanwhile.
  const std::string many =
      client_frame(0x81, "a") + client_frame(0x8a, "") + client_frame(0x82, "bc");
  std::size_t pos = 0;
  REQUIRE(p.next(many, pos, f) == Parser::Result::frame);
  CHECK(f.payload == "a");
  REQUIRE(p.next(many, pos, f) == Parser::Result::frame);
  CHECK(f.opcode == kPong);
  REQUIRE(p.next(many, pos, f) == Parser::Result::frame);
  CHECK(f.payload == "bc");
  CHECK(pos == many.size());
  CHECK(p.next(many, pos, f) == Parser::Result::need_more);

  std::string unmasked = client_frame(0x81, "x", false);
  CHECK(p.next(unmasked, f) == Parser::Result::error);
  CHECK(p.error_code == 1002);
  std::string fragment = client_frame(0x01, "x");  // FIN clear
  CHECK(p.next(fragment, f) == Parser::Result::error);
  CHECK(p.error_code == 1002);
  CHECK(p.error_reason.find("fragmented") != std::string::npos);
  std::string continuation = client_frame(0x80, "x");
  CHECK(p.next(continuation, f) == Parser::Result::error);
  std::string too_big = client_frame(0x82, std::string(1001, 'y'));
  CHECK(p.next(too_big, f) == Parser::Result::error);
  CHECK(p.error_code == 1009);
  // Server frames: unmasked, the 16-bit length form from 126 bytes.
  CHECK(frame(kText, "hi") == std::string("\x81\x02hi", 4));
  CHECK(frame(kBinary, big).substr(0, 4) == std::string("\x82\x7e\x01\x2c", 4));
  CHECK(close_payload(4001, "TAKEN_OVER") == std::string("\x0f\xa1TAKEN_OVER", 12));
}

TEST_CASE("the replay ring keeps the last bytes at their absolute offsets") {
  sbx::agent::Ring ring(8);
  ring.append("abc");
  CHECK(ring.begin() == 0);
  CHECK(ring.read(1, 100) == "bc");
  ring.append("defghij");  // 10 bytes: "ab" dropped
  CHECK(ring.end() == 10);
  CHECK(ring.begin() == 2);
  CHECK(ring.read(0, 100) == "cdefghij");
  CHECK(ring.read(5, 3) == "fgh");
  ring.append("klmnopqrstuvwxyz");  // longer than the ring
  CHECK(ring.begin() == 18);
  CHECK(ring.read(0, 100) == "stuvwxyz");
  ring.append("12");
  CHECK(ring.read(20, 100) == "uvwxyz12");
  CHECK(ring.read(28, 100).empty());
}

TEST_CASE("a TTY session: typed input is echoed, its output arrives, stty sees a resize") {
  TempDir dir;
  // A bash without the host's rc files, with a prompt to wait on: typing only at a prompt keeps
  // the steps in order (a signal or a line sent while the shell is between commands would race).
  Agent agent(dir, {"PS1=READY> "});
  const std::string id = new_session(
      agent, "{\"cwd\":\"" + dir.path + "\",\"command\":\"exec bash --norc --noprofile\"}");
  Ws ws;
  const json::Value hello = attach(ws, agent, id);
  CHECK(hello.find("mode")->text == "pty");
  CHECK(int_of(hello, "output_offset") == 0);
  std::size_t prompts = 0;
  auto at_prompt = [&] {
    ++prompts;
    ws.read_until([&] {
      std::size_t n = 0;
      for (std::size_t at = ws.out.find("READY> "); at != std::string::npos;
           at = ws.out.find("READY> ", at + 1))
        ++n;
      return n >= prompts;
    });
  };
  at_prompt();
  ws.stdin_bytes("echo pty$((40+2)); pwd\r");
  // The terminal echoes the typed line (with the unexpanded $((...))), then the output, with
  // \r\n line ends (the line discipline's ONLCR: a terminal, not a pipe).
  ws.read_until([&] { return ws.seen("pty42\r\n" + dir.path + "\r\n"); });
  CHECK(ws.seen("echo pty$((40+2)); pwd"));
  at_prompt();
  ws.stdin_bytes("stty size\r");
  ws.read_until([&] { return ws.seen("24 80\r\n"); });
  at_prompt();
  ws.text("{\"type\":\"resize\",\"cols\":123,\"rows\":45}");
  ws.stdin_bytes("stty size; echo TERM=$TERM\r");
  ws.read_until([&] { return ws.seen("45 123\r\n") && ws.seen("TERM=xterm-256color\r\n"); });
  at_prompt();
  ws.text("{\"type\":\"ping\"}");
  ws.read_until([&] { return ws.got("pong"); });
  // SIGINT reaches the foreground job, as Ctrl-C would: the shell lives on. The job prints its
  // pid once it runs, so the signal cannot come before it.
  ws.stdin_bytes("sh -c 'echo started; exec sleep 1000'\r");
  ws.read_until([&] { return ws.seen("started\r\n"); });
  ws.text("{\"type\":\"signal\",\"signal\":\"SIGINT\"}");
  at_prompt();
  ws.stdin_bytes("echo status=$?\r");
  ws.read_until([&] { return ws.seen("status=130\r\n"); });
  at_prompt();
  ws.stdin_bytes("exit 3\r");
  ws.read_until([&] { return ws.got("exit"); });
  CHECK(int_of(*ws.text_of("exit"), "exit_code") == 3);
  CHECK(wait_close(ws) == 1000);
}

TEST_CASE("pipe mode: stdout and stderr apart; the exit code in the exit frame, a normal close") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent,
                                     "{\"command\":\"read line; echo out:$line; "
                                     "echo err >&2; exit 7\"}");
  Ws ws;
  const json::Value hello = attach(ws, agent, id, "?pty=0");
  CHECK(hello.find("mode")->text == "pipe");
  ws.stdin_bytes("typed\n");
  ws.read_until([&] { return ws.got("exit"); });
  CHECK(ws.out == "out:typed\n");  // no terminal: no echo, no \r
  CHECK(ws.err == "err\n");
  CHECK(int_of(*ws.text_of("exit"), "exit_code") == 7);
  CHECK(wait_close(ws) == 1000);
  const Reply status = request(agent, http::verb::get, "/pty/" + id);
  REQUIRE(status.status == 200);
  CHECK(status.json.find("running")->boolean == false);
  CHECK(int_of(status.json, "output_offset") == 14);  // "out:typed\n" and "err\n"
  CHECK(int_of(status.json, "exit_code") == 7);
}

TEST_CASE("POST /pty's sbx fields: envs, user and the starting size; bad ones are 400") {
  TempDir dir;
  Agent agent(dir);
  const std::string id =
      new_session(agent,
                  "{\"command\":\"stty size; echo greeting=$GREETING; echo uid=$(id -u)\","
                  "\"envs\":{\"GREETING\":\"hi\"},\"user\":\"nobody\",\"rows\":33,\"cols\":101}");
  Ws ws;
  attach(ws, agent, id);
  ws.read_until([&] { return ws.got("exit"); });
  CHECK(ws.out.find("33 101") != std::string::npos);  // the size before the shell's first read
  CHECK(ws.out.find("greeting=hi") != std::string::npos);
  CHECK(ws.out.find("uid=65534") != std::string::npos);
  CHECK(int_of(*ws.text_of("exit"), "exit_code") == 0);

  for (const char* bad : {R"({"rows":0})", R"({"cols":70000})", R"({"rows":"24"})",
                          R"({"user":"no-such-user-here"})", R"({"envs":{"A":1}})"}) {
    CAPTURE(bad);
    const Reply r = request(agent, http::verb::post, "/pty", bad);
    CHECK(r.status == 400);
    CHECK(r.json.find("code")->text == "INVALID_REQUEST_BODY");
  }
}

TEST_CASE("GET /pty/{id}: running and the output offset; unknown ids are 404") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent);
  Reply r = request(agent, http::verb::get, "/pty/" + id);
  REQUIRE(r.status == 200);
  CHECK(r.json.find("session_id")->text == id);
  CHECK(r.json.find("running")->boolean == false);  // not started before its first attach
  CHECK(int_of(r.json, "output_offset") == 0);
  Ws ws;
  attach(ws, agent, id, "?pty=0");
  ws.stdin_bytes("printf 0123456789\n");
  ws.read_until([&] { return ws.out == "0123456789"; });
  r = request(agent, http::verb::get, "/pty/" + id);
  CHECK(r.json.find("running")->boolean == true);
  CHECK(int_of(r.json, "output_offset") == 10);
  for (const auto& path : {"/pty/0123456789abcdef0123456789abcdef", "/pty/nope"}) {
    const Reply missing = request(agent, http::verb::get, path);
    CHECK(missing.status == 404);
    REQUIRE(missing.json.find("code") != nullptr);
    CHECK(missing.json.find("message") != nullptr);
  }
  CHECK(request(agent, http::verb::delete_, "/pty/nope").status == 404);
  Ws none;
  CHECK(none.open(agent, "/pty/nope/ws") == 404);
}

TEST_CASE("one holder: a second attach is 409; takeover closes the first with 4001, replays") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent);
  Ws first;
  attach(first, agent, id);
  first.stdin_bytes("echo mark$((1+2))\r");
  first.read_until([&] { return first.seen("mark3\r\n"); });
  Ws second;
  CHECK(second.open(agent, "/pty/" + id + "/ws") == 409);
  Ws third;
  const json::Value hello = attach(third, agent, id, "?takeover=1&since=0");
  CHECK(wait_close(first) == 4001);
  CHECK(std::string(first.reason().reason.c_str()) == "TAKEN_OVER");
  CHECK(int_of(hello, "replay_from") == 0);
  const int64_t end = int_of(hello, "output_offset");
  CHECK(end >= static_cast<int64_t>(first.out.size()));
  third.read_until([&] { return third.replay.size() >= static_cast<std::size_t>(end); });
  REQUIRE(!third.replay_offsets.empty());
  CHECK(third.replay_offsets.front() == 0);
  CHECK(third.replay.find("mark3\r\n") != std::string::npos);
  CHECK(third.replay.substr(0, first.out.size()) == first.out);  // the same bytes, replayed
  // The new holder drives the shell.
  third.stdin_bytes("echo again$((2+2))\r");
  third.read_until([&] { return third.seen("again4\r\n"); });
  // since= past the end replays nothing; the session is still one holder's.
  Ws fourth;
  const json::Value later =
      attach(fourth, agent, id, "?takeover=1&since=" + std::to_string(1 << 30));
  CHECK(wait_close(third) == 4001);
  fourth.stdin_bytes("echo fourth$((3+3))\r");
  fourth.read_until([&] { return fourth.seen("fourth6\r\n"); });
  CHECK(fourth.replay.empty());
}

TEST_CASE("DELETE /pty/{id} kills the shell and the background job it started, closes the socket") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent);
  Ws ws;
  attach(ws, agent, id);
  ws.stdin_bytes("sleep 1000 & echo bg=$!; echo shell=$$\r");
  ws.read_until([&] {
    return number_after(ws.out, "bg=").has_value() && number_after(ws.out, "shell=").has_value();
  });
  const int bg = pidfd_open(static_cast<pid_t>(*number_after(ws.out, "bg=")));
  const int shell = pidfd_open(static_cast<pid_t>(*number_after(ws.out, "shell=")));
  REQUIRE(bg >= 0);
  REQUIRE(shell >= 0);
  CHECK(request(agent, http::verb::delete_, "/pty/" + id).status == 200);
  CHECK(wait_close(ws) == 1000);
  for (const int fd : {bg, shell}) {
    pollfd p{fd, POLLIN, 0};
    CHECK(::poll(&p, 1, 10000) == 1);  // the process ended
    ::close(fd);
  }
  CHECK(request(agent, http::verb::get, "/pty/" + id).status == 404);
  CHECK(request(agent, http::verb::delete_, "/pty/" + id).status == 404);
}

TEST_CASE("a WebSocket handshake with a bad key or version is 400; a fragment closes with 1002") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent);
  const std::string target = "/pty/" + id + "/ws";
  auto upgrade = [&](const std::string& key, const std::string& version) {
    return request(agent, http::verb::get, target, "",
                   {{"Upgrade", "websocket"},
                    {"Connection", "Upgrade"},
                    {"Sec-WebSocket-Key", key},
                    {"Sec-WebSocket-Version", version}});
  };
  CHECK(upgrade("short", "13").status == 400);
  CHECK(upgrade("dGhlIHNhbXBsZSBub25jZR==", "13").status == 400);
  const Reply version = upgrade("dGhlIHNhbXBsZSBub25jZQ==", "8");
  CHECK(version.status == 400);
  CHECK(version.header("Sec-WebSocket-Version") == "13");
  CHECK(request(agent, http::verb::get, target).status == 400);  // no upgrade at all
  CHECK(request(agent, http::verb::get, "/pty/" + id).json.find("running")->boolean == false);
  // A good handshake by hand: the RFC's accept value. Then a fragmented message (FIN clear),
  // masked: refused with close 1002 (after the connected frame).
  RawWs raw(agent, target + "?pty=0");
  CHECK(raw.accept == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  raw.send(std::string("\x01\x81\x00\x00\x00\x00x", 7));
  CHECK(raw.close_code() == 1002);
}

TEST_CASE("with a token, the PTY routes need it as the others do") {
  TempDir dir;
  Agent agent(dir, {"SBX_AGENT_TOKEN=secret"});
  CHECK(request(agent, http::verb::post, "/pty", "").status == 401);
  const Reply made =
      request(agent, http::verb::post, "/pty", "", {{"X-EXECD-ACCESS-TOKEN", "secret"}});
  REQUIRE(made.status == 200);
  const std::string id = made.json.find("session_id")->text;
  CHECK(request(agent, http::verb::get, "/pty/" + id).status == 401);
  Ws ws;
  CHECK(ws.open(agent, "/pty/" + id + "/ws") == 401);
  CHECK(request(agent, http::verb::delete_, "/pty/" + id, "", {{"X-EXECD-ACCESS-TOKEN", "secret"}})
            .status == 200);
}

namespace {

// The agent's CPU time so far, in clock ticks (utime + stime of /proc/PID/stat).
long cpu_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) {
      stime = std::stol(field);
      break;
    }
  }
  return utime + stime;
}

}  // namespace

TEST_CASE("close frames: a code no endpoint may send, or a one-byte payload, is answered 1002") {
  TempDir dir;
  Agent agent(dir);
  struct Case {
    std::string payload;
    int answered;
  };
  for (const Case& c : {Case{std::string("\x03\xed", 2), 1002},  // 1005: reserved
                        Case{std::string("\x03", 1), 1002},      // one byte
                        Case{std::string("\x0f\xa0", 2), 4000},  // an application's: echoed
                        Case{"", 1000}}) {
    const std::string id = new_session(agent);
    RawWs raw(agent, "/pty/" + id + "/ws?pty=0");
    raw.send(RawWs::frame(0x88, c.payload));
    CHECK(raw.close_code() == c.answered);
  }
}

TEST_CASE("frames that arrive with the client's end of stream are taken before it closes") {
  TempDir dir;
  Agent agent(dir);
  const std::string id =
      new_session(agent, "{\"cwd\":\"" + dir.path + "\",\"command\":\"cat > got.txt\"}");
  RawWs raw(agent, "/pty/" + id + "/ws?pty=0");
  raw.send(RawWs::frame(0x82, std::string("\0hello\n", 7)));
  raw.s.shutdown(local::socket::shutdown_send);
  raw.rest();  // the server closes its side
  const std::string file = dir.path + "/got.txt";
  std::string text;
  for (int i = 0; i < 3000 && text != "hello\n"; ++i) {  // written by cat, not by the agent
    std::ifstream in(file);
    text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text != "hello\n") ::usleep(2000);
  }
  CHECK(text == "hello\n");
  CHECK(request(agent, http::verb::delete_, "/pty/" + id).status == 200);
}

TEST_CASE("pipe mode: a shell that closes its stdin does not keep the agent busy") {
  TempDir dir;
  Agent agent(dir);
  const std::string id = new_session(agent, "{\"command\":\"exec 0<&-; sleep 1; echo done\"}");
  Ws ws;
  attach(ws, agent, id, "?pty=0");
  const long before = cpu_ticks(agent.pid);
  ws.read_until([&] { return ws.got("exit"); });
  CHECK(ws.out == "done\n");
  // The second the shell slept: a spinning loop would take most of it (about 100 ticks).
  CHECK(cpu_ticks(agent.pid) - before < 30);
}
