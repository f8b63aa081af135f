// The execd API served by `sbx serve`'s gateway, over the test_processes plugin (commands are host
// processes in the sandbox's directory: NOTHING destructive runs through it). The event streams
// of the wire transcript, interrupts, background commands with status and logs, a client going
// away, keep-alive pings, the stream cap, auth on both path kinds, and the graceful stop.

#include "support.hpp"

#include <doctest/doctest.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

using namespace serve_test;
namespace json = boost::json;

namespace {

struct Fixture {
  TempDir dir;
  fs::path root = dir.path / "root";
  fs::path config = dir.path / "sbx.json";
  fs::path log = dir.path / "serve.log";
  std::optional<ServeProcess> server;
  std::string id;  // a sandbox made by the fixture

  explicit Fixture(std::vector<std::string> extra = {},
                   std::map<std::string, std::string> env = {}) {
    fs::create_directories(root);
    std::ofstream(config) << json::serialize(json::object{
        {"providers",
         json::object{{"p", json::object{{"plugin", "test_processes"},
                                         {"config", json::object{{"root", root.string()}}}}}}}});
    server.emplace(config, "p", log, std::move(extra), std::move(env));
  }
  int port() const { return server->port(); }

  std::string create(const std::map<std::string, std::string>& headers = {}) {
    const auto r =
        request(port(), "POST", "/v1/sandboxes",
                R"({"image":{"uri":"x"},"entrypoint":["sh"],"resourceLimits":{}})", headers);
    REQUIRE(r.status == 202);
    id = std::string(r.json().at("id").as_string());
    return id;
  }
  std::string direct(const std::string& rest) const {
    return "/sandboxes/" + id + "/proxy/44772" + rest;
  }
  std::string proxied(const std::string& rest) const {
    return "/v1/sandboxes/" + id + "/proxy/44772" + rest;
  }
};

std::string command_body(const std::string& command) {
  return json::serialize(json::object{{"command", command}});
}

bool is_hex32(const json::value& v) {
  return v.is_string() && std::regex_match(std::string(v.as_string()), std::regex("[0-9a-f]{32}"));
}

std::vector<std::string> types(const std::vector<json::object>& events) {
  std::vector<std::string> out;
  for (const auto& e : events)
    out.emplace_back(e.at("type").as_string());
  return out;
}

// Every event has a Unix-ms timestamp near now.
void check_timestamps(const std::vector<json::object>& events) {
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  for (const auto& e : events) {
    REQUIRE(e.at("timestamp").is_int64());
    CHECK(std::abs(e.at("timestamp").as_int64() - now) < 120000);
  }
}

std::vector<std::string> keys(const json::object& o) {
  std::vector<std::string> out;
  for (const auto& [k, v] : o)
    out.emplace_back(k);
  return out;
}

// Runs a command to its end: the stream's events.
std::vector<json::object> run(Fixture& f, const std::string& body,
                              const std::map<std::string, std::string>& headers = {},
                              bool proxied = false) {
  StreamClient s(f.port(), "POST", proxied ? f.proxied("/command") : f.direct("/command"), body,
                 headers);
  REQUIRE(s.status() == 200);
  CHECK(s.headers().at("content-type") == "text/event-stream");
  CHECK(s.headers().at("cache-control") == "no-cache");
  CHECK(s.headers().at("x-accel-buffering") == "no");
  CHECK(s.headers().at("transfer-encoding") == "chunked");
  auto events = s.rest();
  check_timestamps(events);
  return events;
}

std::string hmac_hex(const std::string& key, const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &size);
  std::string out;
  static constexpr char hex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < size; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace

TEST_CASE("GET /ping, an unknown sandbox, another port, an unknown execd route") {
  Fixture f;
  f.create();
  for (const auto& path : {f.direct("/ping"), f.proxied("/ping")}) {
    CAPTURE(path);
    const auto r = request(f.port(), "GET", path);
    CHECK(r.status == 200);
    CHECK(r.body.empty());
    CHECK(r.headers.at("content-length") == "0");
  }
  for (const std::string prefix : {"", "/v1"}) {
    const auto r = request(f.port(), "GET", prefix + "/sandboxes/nope/proxy/44772/ping");
    CHECK(r.status == 404);
    CHECK(r.body == R"({"code":"DOCKER::SANDBOX_NOT_FOUND","message":"Sandbox nope not found."})");
  }
  const auto port = request(f.port(), "GET", "/sandboxes/" + f.id + "/proxy/8080/ping");
  CHECK(port.status == 502);
  CHECK(port.json().at("code") == "NOT_SUPPORTED");
  const auto route = request(f.port(), "GET", f.direct("/metrics"));
  CHECK(route.status == 404);
  CHECK(route.json().at("code") == "NOT_SUPPORTED");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("POST /command: exit 3 with stderr, as the transcript") {
  Fixture f;
  f.create();
  const auto events = run(f, R"({"command":"echo out; echo err >&2; exit 3"})");
  REQUIRE(types(events) == std::vector<std::string>{"init", "ping", "stdout", "stderr", "error"});
  CHECK(keys(events[0]) == std::vector<std::string>{"type", "text", "timestamp"});
  CHECK(is_hex32(events[0].at("text")));
  CHECK(events[1].at("text") == "pong");
  CHECK(events[2].at("text") == "out");
  CHECK(events[3].at("text") == "err");
  CHECK(keys(events[4]) == std::vector<std::string>{"type", "timestamp", "error"});
  CHECK(events[4].at("error") == json::object{{"ename", "CommandExecError"},
                                              {"evalue", "3"},
                                              {"traceback", json::array{"exit status 3"}}});
  // Its status, as a foreground command.
  const auto st =
      request(f.port(), "GET",
              f.direct("/command/status/" + std::string(events[0].at("text").as_string())));
  REQUIRE(st.status == 200);
  CHECK(st.headers.at("content-type") == "application/json; charset=utf-8");
  CHECK(st.json().at("running") == false);
  CHECK(st.json().at("exit_code") == 3);
  CHECK(st.json().at("content") == "echo out; echo err >&2; exit 3");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("POST /command: two lines, env and a partial line, blank lines and \\r, via the proxy") {
  Fixture f;
  f.create();
  auto events = run(f, R"({"command":"echo a; echo b"})");
  REQUIRE(types(events) ==
          std::vector<std::string>{"init", "ping", "stdout", "stdout", "execution_complete"});
  CHECK(events[2].at("text") == "a");
  CHECK(events[3].at("text") == "b");
  CHECK(keys(events[4]) == std::vector<std::string>{"type", "execution_time", "timestamp"});
  CHECK(events[4].at("execution_time").is_int64());
  CHECK(events[4].at("execution_time").as_int64() >= 0);

  events = run(f, R"({"command":"printf \"x=$X\"","envs":{"X":"42"}})");
  REQUIRE(types(events) ==
          std::vector<std::string>{"init", "ping", "stdout", "execution_complete"});
  CHECK(events[2].at("text") == "x=42");

  events = run(f, R"({"command":"printf 'a\n\nb\rc\r\nd'"})", {}, true);
  REQUIRE(types(events) == std::vector<std::string>{"init", "ping", "stdout", "stdout", "stdout",
                                                    "stdout", "stdout", "execution_complete"});
  CHECK(events[2].at("text") == "a");
  CHECK(events[3].at("text") == "\n");  // a blank line
  CHECK(events[4].at("text") == "b");
  CHECK(events[5].at("text") == "c");
  CHECK(events[6].at("text") == "d");

  // cwd is relative to the sandbox; a bad body is 400 before any stream.
  fs::create_directories(f.root / f.id / "work");
  events = run(f, R"({"command":"pwd","cwd":"/work"})");
  REQUIRE(types(events) ==
          std::vector<std::string>{"init", "ping", "stdout", "execution_complete"});
  CHECK(std::string(events[2].at("text").as_string()).ends_with("/work"));
  for (const char* bad :
       {"{", "[]", R"({"cwd":"/"})", R"({"command":""})", R"({"command":"true","timeout":"1"})",
        R"({"command":"true","gid":0})", R"({"command":"true","envs":{"A":1}})"}) {
    CAPTURE(bad);
    const auto r = request(f.port(), "POST", f.direct("/command"), std::string(bad));
    CHECK(r.status == 400);
    CHECK(r.headers.at("content-type") == "application/json; charset=utf-8");
    CHECK(r.json().at("code") == "INVALID_REQUEST_BODY");
  }
  CHECK(f.server->stop() == 0);
}

TEST_CASE("POST /command: a timeout of 1000 ms kills sleep 5 (error -1, signal: killed)") {
  Fixture f;
  f.create();
  const auto events = run(f, R"({"command":"echo start; sleep 5; echo end","timeout":1000})");
  REQUIRE(types(events) == std::vector<std::string>{"init", "ping", "stdout", "error"});
  CHECK(events[2].at("text") == "start");
  CHECK(events[3].at("error") == json::object{{"ename", "CommandExecError"},
                                              {"evalue", "-1"},
                                              {"traceback", json::array{"signal: killed"}}});
  CHECK(f.server->stop() == 0);
}

TEST_CASE("background: init, ping, execution_complete at once; status and logs with a cursor") {
  Fixture f;
  f.create();
  StreamClient s(f.port(), "POST", f.direct("/command"),
                 std::string(R"({"command":"echo bg; sleep 1; echo done","background":true})"));
  REQUIRE(s.status() == 200);
  const auto events = s.rest();  // at once: the command still runs
  REQUIRE(types(events) == std::vector<std::string>{"init", "ping", "execution_complete"});
  const std::string cid(events[0].at("text").as_string());
  auto st = request(f.port(), "GET", f.direct("/command/status/" + cid));
  REQUIRE(st.status == 200);
  CHECK(st.json().at("running") == true);
  CHECK(st.json().at("exit_code").is_null());
  CHECK(st.json().at("finished_at").is_null());
  for (int i = 0; i < 100; ++i) {
    st = request(f.port(), "GET", f.direct("/command/status/" + cid));
    if (st.json().at("running") == false) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto body = st.json().as_object();
  CHECK(keys(body) == std::vector<std::string>{"id", "content", "running", "exit_code",
                                               "started_at", "finished_at"});
  CHECK(body.at("id") == json::value(cid));
  CHECK(body.at("content") == "echo bg; sleep 1; echo done");
  CHECK(body.at("running") == false);
  CHECK(body.at("exit_code") == 0);
  const std::regex ns_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z)");
  CHECK(std::regex_match(std::string(body.at("started_at").as_string()), ns_time));
  CHECK(std::regex_match(std::string(body.at("finished_at").as_string()), ns_time));

  const auto logs = request(f.port(), "GET", f.direct("/command/" + cid + "/logs?cursor=0"));
  CHECK(logs.status == 200);
  CHECK(logs.headers.at("content-type") == "text/plain; charset=utf-8");
  CHECK(logs.body == "bg\ndone\n");
  CHECK(logs.headers.at("execd-commands-tail-cursor") == "8");
  const auto tail = request(f.port(), "GET", f.proxied("/command/" + cid + "/logs?cursor=3"));
  CHECK(tail.body == "done\n");
  CHECK(tail.headers.at("execd-commands-tail-cursor") == "8");
  const auto end = request(f.port(), "GET", f.direct("/command/" + cid + "/logs?cursor=8"));
  CHECK(end.body.empty());
  CHECK(end.headers.at("execd-commands-tail-cursor") == "8");
  const auto all = request(f.port(), "GET", f.direct("/command/" + cid + "/logs"));
  CHECK(all.body == "bg\ndone\n");

  const auto unknown = request(f.port(), "GET", f.direct("/command/status/nope"));
  CHECK(unknown.status == 404);
  CHECK(unknown.body == R"({"code":"INVALID_REQUEST_BODY","message":"command not found: nope"})");
  CHECK(request(f.port(), "GET", f.direct("/command/nope/logs")).status == 404);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("DELETE /command?id= interrupts: the stream ends with error -1; then 500 RUNTIME_ERROR") {
  Fixture f;
  f.create();
  const fs::path marker = f.dir.path / "interrupted-marker";
  StreamClient s(f.port(), "POST", f.direct("/command"),
                 command_body("sleep 5; touch " + marker.string()));
  REQUIRE(s.status() == 200);
  const auto init = s.next_event();
  REQUIRE(init);
  const std::string cid(init->at("text").as_string());
  const auto del = request(f.port(), "DELETE", f.direct("/command?id=" + cid));
  CHECK(del.status == 200);
  CHECK(del.body.empty());
  auto rest = s.rest();
  REQUIRE(!rest.empty());
  CHECK(rest.back().at("type") == "error");
  CHECK(rest.back().at("error").at("evalue") == "-1");
  CHECK(rest.back().at("error").at("traceback") == json::array{"signal: killed"});
  const auto again = request(f.port(), "DELETE", f.direct("/command?id=" + cid));
  CHECK(again.status == 500);
  CHECK(again.json().at("code") == "RUNTIME_ERROR");
  CHECK(request(f.port(), "DELETE", f.direct("/command?id=nope")).status == 500);
  const auto st = request(f.port(), "GET", f.direct("/command/status/" + cid));
  CHECK(st.json().at("running") == false);
  CHECK(st.json().at("exit_code") == -1);
  std::this_thread::sleep_for(std::chrono::seconds(6));
  CHECK(!fs::exists(marker));  // the command was killed, not left running
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a client that disconnects mid-stream cancels its command") {
  Fixture f;
  f.create();
  const fs::path marker = f.dir.path / "disconnected-marker";
  std::string cid;
  {
    StreamClient s(f.port(), "POST", f.direct("/command"),
                   command_body("sleep 3; touch " + marker.string()));
    REQUIRE(s.status() == 200);
    const auto init = s.next_event();
    REQUIRE(init);
    cid = std::string(init->at("text").as_string());
    s.disconnect();
  }
  json::value st;
  for (int i = 0; i < 50; ++i) {
    st = request(f.port(), "GET", f.direct("/command/status/" + cid)).json();
    if (st.at("running") == false) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(st.at("running") == false);
  CHECK(st.at("error") == "signal: killed");
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK(!fs::exists(marker));
  // The server still serves.
  CHECK(types(run(f, R"({"command":"true"})")).back() == "execution_complete");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a silent command gets ping keep-alives every 3 s") {
  Fixture f;
  f.create();
  const auto events = run(f, R"({"command":"sleep 7; echo x"})");
  REQUIRE(events.size() >= 5);
  CHECK(events.front().at("type") == "init");
  CHECK(events.back().at("type") == "execution_complete");
  int pings = 0;
  for (const auto& e : events)
    pings += e.at("type") == "ping" ? 1 : 0;
  CHECK(pings >= 3);  // the first at once, then at least two during the silence
  CHECK(events[events.size() - 2].at("text") == "x");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("--max-streams: a stream over the cap is refused with 503 before it starts") {
  Fixture f({"--max-streams", "1"});
  f.create();
  {
    StreamClient first(f.port(), "POST", f.direct("/command"),
                       std::string(R"({"command":"sleep 2"})"));
    REQUIRE(first.status() == 200);
    REQUIRE(first.next_event());
    const auto refused =
        request(f.port(), "POST", f.direct("/command"), std::string(R"({"command":"true"})"));
    CHECK(refused.status == 503);
    CHECK(refused.json().at("code") == "RUNTIME_ERROR");
    CHECK(types(first.rest()).back() == "execution_complete");
  }
  CHECK(types(run(f, R"({"command":"true"})")).back() == "execution_complete");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("auth: direct execd paths take X-EXECD-ACCESS-TOKEN, server-proxy paths the API key") {
  Fixture f({"--api-key-env", "EXECD_TEST_KEY"}, {{"EXECD_TEST_KEY", "k3y"}});
  f.create({{"OPEN-SANDBOX-API-KEY", "k3y"}});
  const std::string token = hmac_hex("k3y", f.id);
  const auto no_token = request(f.port(), "GET", f.direct("/ping"));
  CHECK(no_token.status == 401);
  CHECK(no_token.body ==
        R"({"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"})");
  // The key itself does not open a direct path, nor another sandbox's token.
  CHECK(request(f.port(), "GET", f.direct("/ping"), std::nullopt, {{"OPEN-SANDBOX-API-KEY", "k3y"}})
            .status == 401);
  CHECK(request(f.port(), "GET", f.direct("/ping"), std::nullopt,
                {{"X-EXECD-ACCESS-TOKEN", hmac_hex("k3y", "other")}})
            .status == 401);
  CHECK(request(f.port(), "GET", f.direct("/ping"), std::nullopt, {{"X-EXECD-ACCESS-TOKEN", token}})
            .status == 200);
  const auto events = run(f, R"({"command":"echo via-token"})", {{"X-EXECD-ACCESS-TOKEN", token}});
  CHECK(events[2].at("text") == "via-token");

  const auto missing = request(f.port(), "GET", f.proxied("/ping"));
  CHECK(missing.status == 401);
  CHECK(missing.json().at("code") == "MISSING_API_KEY");
  CHECK(
      request(f.port(), "GET", f.proxied("/ping"), std::nullopt, {{"X-EXECD-ACCESS-TOKEN", token}})
          .status == 401);
  CHECK(request(f.port(), "GET", f.proxied("/ping"), std::nullopt, {{"OPEN-SANDBOX-API-KEY", "x"}})
            .json()
            .at("code") == "INVALID_API_KEY");
  const auto proxied =
      run(f, R"({"command":"echo via-proxy"})", {{"OPEN-SANDBOX-API-KEY", "k3y"}}, true);
  CHECK(proxied[2].at("text") == "via-proxy");
  CHECK(f.server->stop() == 0);
}

TEST_CASE("deleting a sandbox cancels its running commands and forgets them") {
  Fixture f;
  f.create();
  StreamClient s(f.port(), "POST", f.direct("/command"), std::string(R"({"command":"sleep 30"})"));
  REQUIRE(s.status() == 200);
  const auto init = s.next_event();
  REQUIRE(init);
  const std::string cid(init->at("text").as_string());
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + f.id).status == 204);
  const auto rest = s.rest();
  REQUIRE(!rest.empty());
  CHECK(rest.back().at("type") == "error");
  CHECK(rest.back().at("error").at("evalue") == "-1");
  CHECK(request(f.port(), "GET", f.direct("/command/status/" + cid)).status == 404);
  CHECK(f.server->stop() == 0);
}

TEST_CASE("a graceful stop lets a running command finish, then exits 0") {
  Fixture f;
  f.create();
  StreamClient s(f.port(), "POST", f.direct("/command"),
                 std::string(R"({"command":"sleep 2; echo finished"})"));
  REQUIRE(s.status() == 200);
  REQUIRE(s.next_event());
  int status = -9;
  std::thread stopper([&] { status = f.server->stop(); });
  const auto rest = s.rest();
  stopper.join();
  CHECK(status == 0);
  REQUIRE(rest.size() >= 2);
  CHECK(rest[rest.size() - 2].at("text") == "finished");
  CHECK(rest.back().at("type") == "execution_complete");
  CHECK(fs::is_empty(f.root));
}

TEST_CASE("a stop cancels commands still running after --grace") {
  Fixture f({"--grace", "1"});
  f.create();
  StreamClient s(f.port(), "POST", f.direct("/command"), std::string(R"({"command":"sleep 30"})"));
  REQUIRE(s.status() == 200);
  REQUIRE(s.next_event());
  const auto started = std::chrono::steady_clock::now();
  CHECK(f.server->stop() == 0);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(20));
  const auto rest = s.rest();
  REQUIRE(!rest.empty());
  CHECK(rest.back().at("type") == "error");
  CHECK(fs::is_empty(f.root));
}
