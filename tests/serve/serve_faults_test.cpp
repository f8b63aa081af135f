// Fault injection and the config file's `serve` section, through the real `sbx serve` process over
// the test_processes plugin: the scripted sequences (status, reset, delay, pass), the window per
// sandbox, faults after authentication only, the limits from the file, flags winning over the
// file, and a faults plan refused at start with its JSON path.

#include "support.hpp"

#include <doctest/doctest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

using namespace serve_test;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

// A config whose provider "p" is test_processes with sandboxes under `root`, with `serve` as its
// serve section, and `sbx serve` on it.
struct Fixture : ProcessesServer {
  explicit Fixture(const std::string& serve, std::vector<std::string> extra = {},
                   std::map<std::string, std::string> env = {}) {
    write_config(processes_block(), json::object{{"serve", json::parse(serve)}});
    extra.insert(extra.begin(), {"--log-level", "info"});  // the fault lines
    start(std::move(extra), std::move(env));
  }
  json::object create_response() {
    const auto r = request(port(), "POST", "/v1/sandboxes", kCreateBody);
    REQUIRE(r.status == 202);
    return r.json().as_object();
  }
  std::string create() { return std::string(create_response().at("id").as_string()); }

  static inline const std::string kCreateBody =
      R"({"image":{"uri":"local/busybox:latest"},"entrypoint":["tail","-f","/dev/null"],)"
      R"("resourceLimits":{"cpu":"500m","memory":"512Mi"},"timeout":600})";
};

std::string code_of(const Response& r) {
  return std::string(r.json().at("code").as_string());
}

}  // namespace

TEST_CASE("create answers 503 twice, then succeeds; the failed ones created nothing") {
  Fixture f(R"({"faults": [{"route": "POST /sandboxes", "actions": [
                 {"status": 503, "code": "SANDBOX::PROVIDER_UNAVAILABLE", "message": "try later"},
                 {"status": 503}]}]})");
  const auto first = request(f.port(), "POST", "/v1/sandboxes", Fixture::kCreateBody);
  CHECK(first.status == 503);
  CHECK(code_of(first) == "SANDBOX::PROVIDER_UNAVAILABLE");
  CHECK(first.json().at("message") == "try later");
  CHECK(first.has_header("x-request-id"));
  // The same route at the root: the second action of the same sequence.
  const auto second = request(f.port(), "POST", "/sandboxes", Fixture::kCreateBody);
  CHECK(second.status == 503);
  CHECK(code_of(second) == "GENERAL::INJECTED_FAULT");
  // The fault answered before the provider was called: no sandbox exists.
  CHECK(f.sandboxes_on_disk() == 0);
  const auto third = request(f.port(), "POST", "/v1/sandboxes", Fixture::kCreateBody);
  CHECK(third.status == 202);
  CHECK(f.sandboxes_on_disk() == 1);
  CHECK(request(f.port(), "POST", "/v1/sandboxes", Fixture::kCreateBody).status == 202);
  CHECK(f.sandboxes_on_disk() == 2);
  // Other routes were never touched.
  CHECK(request(f.port(), "GET", "/health").status == 200);
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
  const auto log = f.log_text();
  CHECK(log.find("fault injected on POST /sandboxes: status 503 SANDBOX::PROVIDER_UNAVAILABLE") !=
        std::string::npos);
  CHECK(log.find("fault injected on POST /sandboxes: status 503 GENERAL::INJECTED_FAULT") !=
        std::string::npos);
}

TEST_CASE("the first N command submissions answer 502, direct and through the server proxy") {
  Fixture f(R"({"faults": [{"route": "POST /command",
                            "actions": [{"status": 502}, {"status": 502}, {"status": 502}]}]})");
  const std::string id = f.create();
  const std::string body = R"({"command":"echo hi"})";
  const std::vector<std::string> targets{"/sandboxes/" + id + "/proxy/44772/command",
                                         "/v1/sandboxes/" + id + "/proxy/44772/command",
                                         "/sandboxes/" + id + "/proxy/44772/command"};
  for (const auto& target : targets) {
    CAPTURE(target);
    const auto r = request(f.port(), "POST", target, body);
    CHECK(r.status == 502);
    CHECK(code_of(r) == "GENERAL::INJECTED_FAULT");
    CHECK(r.json().at("message") == "Injected fault (serve.faults): 502 on POST /command.");
  }
  // Then normal service: the command runs.
  StreamClient after(f.port(), "POST", targets[0], body);
  CHECK(after.status() == 200);
  const auto events = after.rest();
  REQUIRE(events.size() == 4);
  CHECK(events[2].at("text") == "hi");
  CHECK(f.log_text().find("fault injected on POST /command (sandbox " + id + "): status 502") !=
        std::string::npos);
}

TEST_CASE("a command stream is cut mid-way: a reset after N events, and its command cancelled") {
  Fixture f(R"({"faults": [{"route": "POST /command", "actions": [{"cut_after_events": 3}]}]})");
  const std::string id = f.create();
  const fs::path marker = f.dir.path / "cut-marker";
  const std::string target = "/sandboxes/" + id + "/proxy/44772/command";
  StreamClient s(f.port(), "POST", target,
                 json::serialize(json::object{
                     {"command", "echo a; sleep 3; touch " + marker.string() + "; echo b"}}));
  REQUIRE(s.status() == 200);
  std::vector<std::string> types;
  bool cut = false;
  try {
    while (auto e = s.next_event())
      types.emplace_back(e->at("type").as_string());
  } catch (const std::exception& e) {
    cut = true;  // the connection was reset, or the chunked body ended without its last chunk
    CAPTURE(e.what());
  }
  CHECK(cut);
  CHECK(types == std::vector<std::string>{"init", "ping", "stdout"});
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK(!fs::exists(marker));  // the command was cancelled with its stream
  CHECK(f.log_text().find("cut after 3 events") != std::string::npos);
  // The cut was consumed: the next stream is whole.
  StreamClient next(f.port(), "POST", target, std::string(R"({"command":"echo ok"})"));
  const auto events = next.rest();
  REQUIRE(!events.empty());
  CHECK(events.back().at("type") == "execution_complete");
}

TEST_CASE("an upload answers an injected status before its body is read, then uploads") {
  Fixture f(R"({"faults": [{"route": "POST /files/upload", "actions": [{"status": 503}]}]})");
  const std::string id = f.create();
  const std::string boundary = "bnd";
  const std::string body =
      "--bnd\r\nContent-Disposition: form-data; name=\"metadata\"; "
      "filename=\"metadata\"\r\n\r\n{\"path\":\"/f.txt\"}\r\n--bnd\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n"
      "data\r\n--bnd--\r\n";
  const std::map<std::string, std::string> headers{
      {"Content-Type", "multipart/form-data; boundary=" + boundary}};
  const std::string target = "/v1/sandboxes/" + id + "/proxy/44772/files/upload";
  const auto first = request(f.port(), "POST", target, body, headers);
  CHECK(first.status == 503);
  CHECK(code_of(first) == "GENERAL::INJECTED_FAULT");
  CHECK(!fs::exists(f.root / id / "f.txt"));
  const auto second = request(f.port(), "POST", target, body, headers);
  CHECK(second.status == 200);
  CHECK(fs::exists(f.root / id / "f.txt"));
}

TEST_CASE("ping fails for S seconds counted from each sandbox's creation") {
  Fixture f(R"({"faults": [{"route": "GET /ping", "fail_for_s": 3, "status": 502},
                           {"route": "GET /sandboxes/{id}", "fail_for_s": 3, "status": 503,
                            "code": "X::WARMING_UP"}]})");
  const auto created = f.create_response();
  const std::string a(created.at("id").as_string());
  // The window counts from the creation the server recorded (the answer's createdAt).
  const std::chrono::system_clock::time_point a_created{
      std::chrono::microseconds(parse_time_us(std::string(created.at("createdAt").as_string())))};
  const std::string ping_a = "/sandboxes/" + a + "/proxy/44772/ping";
  CHECK(request(f.port(), "GET", ping_a).status == 502);
  CHECK(request(f.port(), "GET", "/v1" + ping_a).status == 502);
  const auto get_a = request(f.port(), "GET", "/v1/sandboxes/" + a);
  CHECK(get_a.status == 503);
  CHECK(code_of(get_a) == "X::WARMING_UP");
  // An unknown sandbox has no creation time: no window (the route answers 404).
  CHECK(request(f.port(), "GET", "/v1/sandboxes/nope").status == 404);

  std::this_thread::sleep_until(a_created + std::chrono::milliseconds(3500));
  // A's window is over; B, created now, has its own.
  const std::string b = f.create();
  CHECK(request(f.port(), "GET", "/sandboxes/" + b + "/proxy/44772/ping").status == 502);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + b).status == 503);
  CHECK(request(f.port(), "GET", ping_a).status != 502);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + a).status == 200);
}

TEST_CASE("reset aborts the connection, pass serves, status answers, in sequence") {
  Fixture f(R"({"faults": [{"route": "GET /health",
                            "actions": [{"reset": true}, {"pass": true}, {"status": 500}]}]})");
  bool reset = false;
  try {
    request(f.port(), "GET", "/health");
  } catch (const boost::system::system_error& e) {
    reset = e.code() == boost::asio::error::connection_reset;
    CAPTURE(e.code().message());
  }
  CHECK(reset);
  CHECK(request(f.port(), "GET", "/health").status == 200);
  const auto failed = request(f.port(), "GET", "/v1/health");
  CHECK(failed.status == 500);
  CHECK(code_of(failed) == "GENERAL::INJECTED_FAULT");
  CHECK(request(f.port(), "GET", "/health").status == 200);
  const auto log = f.log_text();
  CHECK(log.find("fault injected on GET /health: reset") != std::string::npos);
  CHECK(log.find("fault injected on GET /health: pass") != std::string::npos);
  // The server still stops cleanly (the reset request is not waited for).
  CHECK(f.server->stop() == 0);
}

TEST_CASE("delay waits, then serves normally; a delayed create then creates") {
  Fixture f(R"({"faults": [{"route": "POST /sandboxes", "actions": [{"delay_ms": 1200}]}]})");
  const auto start = Clock::now();
  const auto r = request(f.port(), "POST", "/v1/sandboxes", Fixture::kCreateBody);
  const auto waited = Clock::now() - start;
  CHECK(r.status == 202);
  CHECK(waited >= std::chrono::milliseconds(1200));
  CHECK(f.sandboxes_on_disk() == 1);
  CHECK(request(f.port(), "POST", "/v1/sandboxes", Fixture::kCreateBody).status == 202);
  CHECK(f.log_text().find("fault injected on POST /sandboxes: delay 1200 ms") != std::string::npos);
}

TEST_CASE("faults apply after authentication: a refused request consumes nothing") {
  Fixture f(R"({"faults": [{"route": "GET /sandboxes/{id}", "actions": [{"status": 502}]}]})",
            {"--api-key-env", "SERVE_TEST_KEY"}, {{"SERVE_TEST_KEY", "k1"}});
  const auto missing = request(f.port(), "GET", "/v1/sandboxes/x");
  CHECK(missing.status == 401);
  CHECK(code_of(missing) == "MISSING_API_KEY");
  const auto first =
      request(f.port(), "GET", "/v1/sandboxes/x", std::nullopt, {{"OPEN-SANDBOX-API-KEY", "k1"}});
  CHECK(first.status == 502);
  const auto second =
      request(f.port(), "GET", "/v1/sandboxes/x", std::nullopt, {{"OPEN-SANDBOX-API-KEY", "k1"}});
  CHECK(second.status == 404);
}

TEST_CASE("the serve section's limits take effect: body_limit, header_limit, read_timeout_s") {
  Fixture f(R"({"body_limit": 1000, "header_limit": 2048, "read_timeout_s": 0.5})");
  auto head = [](size_t length) {
    return "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(length) + "\r\n\r\n";
  };
  const auto big = raw_request(f.port(), head(1001));
  CHECK(big.status == 413);
  CHECK(code_of(big) == "GENERAL::REQUEST_TOO_LARGE");
  CHECK(big.json().at("message") == "Request body exceeds 1000 bytes.");
  // Exactly the limit is read and answered by the route (an all-blank body: 422 missing).
  const auto at_limit = raw_request(f.port(), head(1000) + std::string(1000, ' '));
  CHECK(at_limit.status == 422);

  const auto big_header =
      request(f.port(), "GET", "/health", std::nullopt, {{"X-Padding", std::string(3000, 'a')}});
  CHECK(big_header.status == 431);
  CHECK(big_header.json().at("message") == "Request headers exceed 2048 bytes.");
  CHECK(request(f.port(), "GET", "/health", std::nullopt, {{"X-Padding", std::string(1500, 'a')}})
            .status == 200);

  // A client that never finishes its request is disconnected (the default would be 30 s).
  namespace asio = boost::asio;
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(f.port())});
  asio::write(socket, asio::buffer(std::string("GET /health HTTP/1.1\r\n")));
  const auto start = Clock::now();
  char c = 0;
  boost::system::error_code ec;
  CHECK(socket.read_some(asio::buffer(&c, 1), ec) == 0);
  CHECK((ec == asio::error::eof || ec == asio::error::connection_reset));
  CHECK(Clock::now() - start < std::chrono::seconds(25));
}

TEST_CASE("a flag wins over the serve section: --read-timeout over read_timeout_s") {
  // The file says an hour; the flag half a second: a silent client is disconnected.
  Fixture f(R"({"read_timeout_s": 3600, "faults": []})", {"--read-timeout", "0.5"});
  namespace asio = boost::asio;
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(f.port())});
  asio::write(socket, asio::buffer(std::string("GET /health HTTP/1.1\r\n")));
  char c = 0;
  boost::system::error_code ec;
  CHECK(socket.read_some(asio::buffer(&c, 1), ec) == 0);  // blocks until the server closes it
  CHECK((ec == asio::error::eof || ec == asio::error::connection_reset));
  // An empty plan is no plan: every route is served.
  CHECK(request(f.port(), "GET", "/health").status == 200);
  CHECK(f.log_text().find("fault injected") == std::string::npos);
}

TEST_CASE("listen from the serve section; the --listen flag wins over it") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  std::ofstream(config) << R"({"serve": {"listen": "192.0.2.1:80"},
                               "providers": {"p": {"plugin": "test_processes"}}})";
  std::string output;
  // No --listen: the file's address is used, and refused (not loopback, no key).
  CHECK(run_to_exit({SBX_CLI, "serve", "--config", config.string(), "--provider", "p",
                     "--plugin-dir", SBX_TEST_PLUGIN_DIR},
                    output) == 2);
  CHECK(output.find("refusing to listen on 192.0.2.1") != std::string::npos);
  // --listen given: it wins (ServeProcess passes --listen 127.0.0.1:0).
  const fs::path root = dir.path / "root";
  fs::create_directories(root);
  std::ofstream(config) << json::serialize(json::object{
      {"serve", json::object{{"listen", "192.0.2.1:80"}}},
      {"providers",
       json::object{{"p", json::object{{"plugin", "test_processes"},
                                       {"config", json::object{{"root", root.string()}}}}}}}});
  ServeProcess server(config, "p", dir.path / "serve.log");
  CHECK(request(server.port(), "GET", "/health").status == 200);
}

TEST_CASE("a bad faults plan or serve section is refused at start, naming the JSON path") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  auto start_with = [&](const std::string& serve) {
    std::ofstream(config) << R"({"serve": )" + serve +
                                 R"(, "providers": {"p": {"plugin": "test_processes"}}})";
    std::string output;
    const int status =
        run_to_exit({SBX_CLI, "serve", "--config", config.string(), "--provider", "p", "--listen",
                     "127.0.0.1:0", "--plugin-dir", SBX_TEST_PLUGIN_DIR},
                    output);
    CHECK(status == 2);
    return output;
  };
  CHECK(start_with(R"({"faults": [{"route": "POST /sandboxes", "actions": [{"stauts": 503}]}]})")
            .find(config.string() + ": $.serve.faults[0].actions[0]: an action has exactly one") !=
        std::string::npos);
  CHECK(start_with(R"({"faults": [{"route": "POST /sandbox", "actions": [{"status": 503}]}]})")
            .find("$.serve.faults[0].route: unknown route 'POST /sandbox'") != std::string::npos);
  CHECK(start_with(R"({"max_sandbox": 3})").find("$.serve.max_sandbox: unknown key") !=
        std::string::npos);
  CHECK(start_with(R"({"body_limit": 0})").find("$.serve.body_limit: must be between 1") !=
        std::string::npos);
}
