// The opensandbox plugin against `sbx serve` with fault injection (docs/serve.md, "Fault
// injection"), over the test_processes provider (sandboxes are local processes: no Docker). The
// plugin is loaded through the host API (sbx::Host) and pointed at the server; what reached the
// server is read from its debug log (one "sbx serve: METHOD TARGET (request ...)" line per
// request, with a millisecond timestamp) and from its lifecycle API.
//
// Cases: create retried after 503s (and given up, leaving nothing), a 400 not retried, 502s on
// command submission resubmitted (and given up: "backend unreachable"), a cut command stream,
// close of a sandbox the server already deleted, the API key's placement in direct and
// server-proxy mode, and the create backoff's bounds.

#include "../common/test_helpers.hpp"
#include "../serve/support.hpp"

#include <sbx/core/errors.hpp>
#include <sbx/core/host.hpp>
#include <sbx/core/provider.hpp>
#include <sbx/core/sandbox.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace serve_test;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr const char* kKey = "faults-test-key-0123456789";

// `sbx serve` over test_processes with `faults` as its fault plan (debug log: every request),
// and a host whose provider "os" is the opensandbox plugin pointed at it with `plugin` merged
// over a fast config (no probe, short retry delays).
struct Fixture : ProcessesServer {
  std::optional<sbx::Host> host;

  explicit Fixture(const std::string& faults, json::object plugin = {}, bool with_key = false) {
    write_config(processes_block(),
                 json::object{{"serve", json::object{{"faults", json::parse(faults)}}}});
    std::vector<std::string> extra{"--log-level", "debug"};
    std::map<std::string, std::string> env;
    if (with_key) {
      extra.insert(extra.end(), {"--api-key-env", "SBX_OS_FAULTS_KEY"});
      env["SBX_OS_FAULTS_KEY"] = kKey;
    }
    start(std::move(extra), std::move(env));

    json::object connection{{"domain", "127.0.0.1:" + std::to_string(port())},
                            {"api_key", with_key ? json::value(kKey) : json::value(nullptr)}};
    json::object create{{"retries", 2},
                        {"retry_delay_s", 0.05},
                        {"retry_max_delay_s", 0.1},
                        {"connect_poll_s", 0.1},
                        {"connect_attempt_timeout_s", 10}};
    json::object operations{{"retry_delay_s", 0.05}, {"retry_max_delay_s", 0.1}};
    json::object config{{"connection", connection},
                        {"create", create},
                        {"probe", json::object{{"command", nullptr}}},
                        {"operations", operations},
                        {"attribution", json::object{{"enabled", false}}}};
    for (const auto& [section, value] : plugin) {
      auto& target = config[section];
      if (target.is_object() && value.is_object()) {
        for (const auto& [k, v] : value.as_object())
          target.as_object()[k] = v;
      } else {
        target = value;
      }
    }
    json::object host_config{
        {"providers",
         json::object{{"os", json::object{{"plugin", "opensandbox"}, {"config", config}}}}}};
    sbx::Host::Options options;
    options.config = sbx::Config::parse(json::serialize(host_config), "opensandbox faults test");
    options.plugin_cache = "off";
    host.emplace(std::move(options));
  }

  sbx::Sandbox create() {
    sbx::SandboxSpec spec;
    spec.image = "local/busybox:latest";
    spec.ttl_s = 600;
    return host->provider("os").create(std::move(spec));
  }

  // The sandboxes the server holds (GET /v1/sandboxes).
  size_t sandboxes_on_server(bool with_key = false) {
    std::map<std::string, std::string> headers;
    if (with_key) headers["OPEN-SANDBOX-API-KEY"] = kKey;
    const auto r = request(port(), "GET", "/v1/sandboxes", std::nullopt, headers);
    REQUIRE(r.status == 200);
    return r.json().at("items").as_array().size();
  }

  // The debug log's request lines "sbx serve: <method> <target> (request": how many, and the
  // time of each (seconds of the day, from "[YYYY-MM-DD HH:MM:SS.mmm]").
  // `prefix`: the target only starts with the one given.
  std::vector<double> request_times(const std::string& method_and_target,
                                    bool prefix = false) const {
    const std::string needle = "sbx serve: " + method_and_target + (prefix ? "" : " (request");
    std::vector<double> times;
    std::istringstream lines(log_text());
    for (std::string line; std::getline(lines, line);) {
      if (line.find(needle) == std::string::npos) continue;
      int h = 0, m = 0, ms = 0, s = 0;
      double t = -1;
      const auto open = line.find('[');
      if (open != std::string::npos &&
          std::sscanf(line.c_str() + open, "[%*d-%*d-%*d %d:%d:%d.%d]", &h, &m, &s, &ms) == 4) {
        t = h * 3600.0 + m * 60.0 + s + ms / 1000.0;
      }
      times.push_back(t);
    }
    return times;
  }
  size_t count(const std::string& method_and_target) const {
    return request_times(method_and_target).size();
  }
  size_t count_in_log(const std::string& text) const {
    const auto log = log_text();
    size_t n = 0;
    for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1))
      ++n;
    return n;
  }
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("create answers 503 twice, then succeeds after the plugin's retries") {
  Fixture f(R"([{"route": "POST /sandboxes", "actions": [{"status": 503}, {"status": 503}]}])");
  auto box = f.create();
  CHECK(f.count("POST /v1/sandboxes") == 3);
  CHECK(f.count_in_log("fault injected on POST /sandboxes: status 503") == 2);
  CHECK(f.sandboxes_on_server() == 1);
  const auto r = box.exec("echo up");
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "up\n");
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("create answers 503 more often than the retries: a clear error, no sandbox left") {
  Fixture f(R"([{"route": "POST /sandboxes",
                 "actions": [{"status": 503}, {"status": 503}, {"status": 503}]}])",
            json::object{{"create", json::object{{"retries", 1}}}});
  std::string message;
  sbx_status status = SBX_STATUS_OK;
  try {
    f.create();
  } catch (const sbx::Error& e) {
    message = e.what();
    status = e.status();
    CHECK(e.create_failure());
  }
  CAPTURE(message);
  // NeMo Gym's SandboxCreateError: the plugin reports a create that ran out of retries as
  // CREATE_FAILED, with the last answer in the message.
  CHECK(status == SBX_STATUS_CREATE_FAILED);
  CHECK(message.find("HTTP 503") != std::string::npos);
  CHECK(message.find("GENERAL::INJECTED_FAULT") != std::string::npos);
  CHECK(f.count("POST /v1/sandboxes") == 2);  // the first attempt and one retry
  CHECK(f.sandboxes_on_server() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("a 400 on create is not retried and is an invalid argument") {
  Fixture f(R"([{"route": "POST /sandboxes",
                 "actions": [{"status": 400, "code": "SANDBOX::INVALID_PARAMETER",
                              "message": "bad request body"}]}])");
  std::string message;
  sbx_status status = SBX_STATUS_OK;
  try {
    f.create();
  } catch (const sbx::Error& e) {
    message = e.what();
    status = e.status();
  }
  CAPTURE(message);
  CHECK(status == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(message.find("bad request body") != std::string::npos);
  CHECK(f.count("POST /v1/sandboxes") == 1);
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("command submissions answered 502 are resubmitted; past the retries, unreachable") {
  // operations.retries 3: four submissions at most. The first exec meets two 502s and is served by
  // its third submission; the second meets four and gives up; the third is served at once.
  Fixture f(R"([{"route": "POST /command", "actions": [
                 {"status": 502}, {"status": 502}, {"pass": true},
                 {"status": 502}, {"status": 502}, {"status": 502}, {"status": 502}]}])",
            json::object{{"operations", json::object{{"retries", 3}}}});
  auto box = f.create();
  const auto r = box.exec("echo again");
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "again\n");
  auto times = f.request_times("POST /sandboxes/" + box.id() + "/proxy/44772/command");
  REQUIRE(times.size() == 3);
  // Resubmission pauses: 0.25 s, then 0.5 s (the log's clock, generous margins).
  CHECK(times[1] - times[0] >= 0.2);
  CHECK(times[1] - times[0] <= 1.5);
  CHECK(times[2] - times[1] >= 0.45);
  CHECK(times[2] - times[1] <= 2.0);

  std::string message;
  sbx_status status = SBX_STATUS_OK;
  try {
    box.exec("echo never");
  } catch (const sbx::Error& e) {
    message = e.what();
    status = e.status();
  }
  CAPTURE(message);
    CHECK(status == SBX_STATUS_UNAVAILABLE);
  CHECK(message.find("Sandbox backend unreachable through 4 submissions") != std::string::npos);
  // Before giving up, the sandbox's status was read in case it died of memory (it did not: the
  // 502 stands). It stays Running, so the reads go on for the diagnosis's 5 s, 0.5 s apart.
  const auto reads = f.request_times("GET /v1/sandboxes/" + box.id());
  CAPTURE(reads.size());
  CHECK(reads.size() >= 3);
  CHECK(reads.size() <= 12);
  CHECK(f.count("POST /sandboxes/" + box.id() + "/proxy/44772/command") == 7);
  // The sequence is used up: the sandbox works again.
  CHECK(box.exec("echo back").stdout_text == "back\n");
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("an exec cancelled while it waits between two 502 submissions ends at once") {
  // Submissions 1 and 2 meet 502s; the exec then waits 0.5 s before its third. It is cancelled
  // in that wait: no thread is blocked in it, so the cancellation itself must end the exec.
  Fixture f(R"([{"route": "POST /command", "actions": [{"status": 502}, {"status": 502}]}])",
            json::object{{"operations", json::object{{"retries", 5}}}});
  auto box = f.create();
  const std::string route = "POST /sandboxes/" + box.id() + "/proxy/44772/command";
  auto op = box.exec_async("echo never");
  const auto deadline = Clock::now() + 10s;
  while (f.count(route) < 2 && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  REQUIRE(f.count(route) == 2);
  std::this_thread::sleep_for(100ms);  // well inside the 0.5 s wait
  const auto cancelled_at = Clock::now();
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  const double took = seconds_since(cancelled_at);
  MESSAGE("cancel to end: ", took, " s");
  CHECK(took < sbx::testing::slack(0.2));
  std::this_thread::sleep_for(800ms);  // past the third submission's time
  CHECK(f.count(route) == 2);
  CHECK(box.exec("echo next").stdout_text == "next\n");
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

namespace {
size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}
}  // namespace

TEST_CASE("200 execs in flight at once hold no thread each") {
  Fixture f("[]");
  auto box = f.create();
  CHECK(box.exec("true").return_code == 0);  // every thread the plugin starts is up
  const size_t before = thread_count();
  constexpr int kExecs = 200;
  std::vector<sbx::Operation<sbx::ExecResult>> ops;
  ops.reserve(kExecs);
  for (int i = 0; i < kExecs; ++i)
    ops.push_back(box.exec_async("sleep 1; echo " + std::to_string(i)));
  size_t most = 0;
  while (std::none_of(ops.begin(), ops.end(), [](const auto& op) { return op.ready(); })) {
    most = std::max(most, thread_count());
    std::this_thread::sleep_for(20ms);
  }
  int ok = 0;
  for (int i = 0; i < kExecs; ++i) {
    const auto r = ops[i].get();
    if (r.return_code == 0 && r.stdout_text == std::to_string(i) + "\n") ++ok;
  }
  MESSAGE("threads: ", before, " before, at most ", most, " with ", kExecs, " execs in flight");
  CHECK(ok == kExecs);
  CHECK(most > 0);
  CHECK(most <= before + 1);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("background mode: submit, status polls with growing pauses, one log fetch") {
  Fixture f("[]", json::object{{"operations", json::object{{"background_exec", true},
                                                           {"background_poll_initial_s", 0.05},
                                                           {"background_poll_interval_s", 0.2}}}});
  auto box = f.create();
  const auto r = box.exec("echo out; echo err >&2; sleep 1; exit 7");
  CHECK(r.return_code == 7);
  CHECK_FALSE(r.error_type);
  // execd keeps one combined log: both lines come on stdout.
  CHECK(r.stdout_text.find("out\n") != std::string::npos);
  CHECK(r.stdout_text.find("err\n") != std::string::npos);
  const std::string base = "/sandboxes/" + box.id() + "/proxy/44772/command";
  CHECK(f.count("POST " + base) == 1);
  const auto polls = f.request_times("GET " + base + "/status/", true);
  // Pauses 0.05, 0.075, 0.1125, 0.17, then 0.2 s: at least 5 polls in 1 s, at most 1 s / 0.05.
  CAPTURE(polls.size());
  CHECK(polls.size() >= 5);
  CHECK(polls.size() <= 20);
  if (polls.size() >= 7) CHECK(polls[6] - polls[5] >= 0.15);  // capped at 0.2 s, not 0.05
  CHECK(f.count_in_log("/logs?cursor=0 (request") == 1);

  // The server's timeout ends it: 125/"timeout", found by the polls.
  sbx::ExecOptions options;
  options.timeout_s = 1;
  const auto started = Clock::now();
  const auto timed_out = box.exec("sleep 5", options);
  MESSAGE("background timeout 1 s: ended after ", seconds_since(started), " s");
  CHECK(timed_out.return_code == 125);
  CHECK(timed_out.error_type == std::optional<std::string>("timeout"));
  CHECK(seconds_since(started) < 4);

  // Cancelled while it polls: the command is interrupted on the server.
  auto op = box.exec_async("sleep 30");
  std::this_thread::sleep_for(500ms);
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  const auto deadline = Clock::now() + 5s;
  while (f.count_in_log("DELETE " + base + "?id=") == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  CHECK(f.count_in_log("DELETE " + base + "?id=") == 1);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a command stream cut mid-way fails the exec at once; the next exec works") {
  Fixture f(R"([{"route": "POST /command", "actions": [{"cut_after_events": 3}]}])");
  auto box = f.create();
  const fs::path marker = f.dir.path / "cut-marker";
  std::string message;
  sbx_status status = SBX_STATUS_OK;
  const auto start = Clock::now();
  try {
    box.exec("echo a; sleep 2; touch " + marker.string() + "; echo b");
  } catch (const sbx::Error& e) {
    message = e.what();
    status = e.status();
  }
  const double took = seconds_since(start);
  CAPTURE(message);
  CHECK(status == SBX_STATUS_UNAVAILABLE);
  CHECK(message.find("OpenSandbox command run (sandbox " + box.id() + ")") != std::string::npos);
  CHECK(took < 1.8);  // the command's own 2 s were not waited for
  CHECK(f.count_in_log("cut after 3 events") == 1);
  // The cut command was cancelled on the server: its marker never comes.
  std::this_thread::sleep_until(start + std::chrono::seconds(3));
  CHECK(!fs::exists(marker));
  const auto r = box.exec("echo next");
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "next\n");
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a download cut mid-way resumes where it stopped (Range); past the retries, no file") {
  // 1 MiB is 16 pieces of 64 KiB: the first answer is cut after 5 pieces, the first resume
  // after 3 more; the second resume gets the rest.
  Fixture f(R"([{"route": "GET /files/download",
                                  "actions": [{"cut_after_events": 5}, {"cut_after_events": 3}]}])",
            json::object{{"operations", json::object{{"retries", 2}}}});
  auto box = f.create();
  std::string contents;
  for (int i = 0; contents.size() < 1024 * 1024; ++i)
    contents += "line " + std::to_string(i) + " of a file that is cut on its way\n";
  contents.resize(1024 * 1024);
  const std::string remote = "/tmp/sbx-os-faults-" + box.id() + ".bin";
  box.upload_bytes(contents, remote);
  const fs::path local = f.dir.path / "resumed.bin";
  box.download(remote, local);
  CHECK(fs::file_size(local) == contents.size());
  CHECK(sbx::testing::read_file(local) == contents);
  const std::string route = "GET /sandboxes/" + box.id() + "/proxy/44772/files/download";
  CHECK(f.request_times(route, true).size() == 3);
  CHECK(f.count_in_log("cut after 5 events") == 1);
  CHECK(f.count_in_log("cut after 3 events") == 1);

  // The plan is used up: served whole at once.
  const fs::path again = f.dir.path / "again.bin";
  box.download(remote, again);
  CHECK(sbx::testing::read_file(again) == contents);
  CHECK(f.request_times(route, true).size() == 4);
  box.exec("rm -f " + remote);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a download cut more often than the retries fails, naming the path; no file is left") {
  Fixture f(R"([{"route": "GET /files/download", "repeat": true,
                 "actions": [{"cut_after_events": 1}]}])",
            json::object{{"operations", json::object{{"retries", 1}}}});
  auto box = f.create();
  const std::string remote = "/tmp/sbx-os-faults-" + box.id() + ".bin";
  box.upload_bytes(std::string(512 * 1024, 'x'), remote);
  const fs::path local = f.dir.path / "never.bin";
  std::string message;
  try {
    box.download(remote, local);
  } catch (const sbx::Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("download of " + remote) != std::string::npos);
  CHECK_FALSE(fs::exists(local));
  const std::string route = "GET /sandboxes/" + box.id() + "/proxy/44772/files/download";
  CHECK(f.request_times(route, true).size() == 2);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("close of a sandbox the server already deleted succeeds") {
  Fixture f("[]");
  auto box = f.create();
  REQUIRE(f.sandboxes_on_server() == 1);
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + box.id()).status == 204);
  REQUIRE(f.sandboxes_on_server() == 0);
  CHECK_NOTHROW(box.close());
  CHECK(box.closed());
  CHECK(f.count("DELETE /v1/sandboxes/" + box.id()) == 2);  // ours, then the plugin's (404)
}

TEST_CASE("an id alone connects; a paused sandbox's exec says why") {
  Fixture f("[]");
  auto box = f.create();
  const auto& provider = f.host->provider("os");
  auto again = provider.connect(R"({"sandbox_id":")" + box.id() + R"("})");
  CHECK(again.id() == box.id());
  CHECK(again.exec("echo hi").stdout_text == "hi\n");
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/pause").status == 202);
  // A handle connected while the sandbox is paused knows it: exec is refused at once.
  auto paused = provider.connect(R"({"sandbox_id":")" + box.id() + R"("})");
  try {
    paused.exec("echo x");
    FAIL("exec on a paused handle must fail");
  } catch (const sbx::Error& e) {
    CHECK(e.status() == SBX_STATUS_FAILED_PRECONDITION);
  }
  // A handle that did not see the pause runs into the server's refusal, and is told why.
  const auto r = box.exec("echo x");
  CHECK(r.return_code == 125);
  CHECK(r.error_type == std::optional<std::string>("sandbox"));
  CAPTURE(r.stderr_text);
  CHECK(r.stderr_text.find("paused") != std::string::npos);
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/resume").status == 202);
  CHECK(box.exec("echo back").stdout_text == "back\n");
  paused.detach();
  again.detach();
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

// The server checks what the request carried: in direct mode a sandbox's execd paths accept only
// the X-EXECD-ACCESS-TOKEN its endpoint handed out (401 otherwise, the key does not help), through
// the server proxy that token or the key. The server does not log request headers, so that the
// key itself is NOT sent in direct mode cannot be observed here (it is checked in the plugin's
// code and by conformance_test.sh, which finds the key in no output).
TEST_CASE("API key placement: direct execd calls carry the endpoint's token, proxied ones work") {
  for (const bool proxy : {false, true}) {
    CAPTURE(proxy);
    Fixture f("[]", json::object{{"connection", json::object{{"use_server_proxy", proxy}}}}, true);
    // Without credentials the server refuses the lifecycle API...
    CHECK(request(f.port(), "GET", "/v1/sandboxes").status == 401);
    auto box = f.create();
    const std::string prefix =
        (proxy ? "/v1/sandboxes/" : "/sandboxes/") + box.id() + "/proxy/44772";
    // ...and a direct execd path with the key but no token.
    if (!proxy) {
      CHECK(request(f.port(), "POST", prefix + "/command", std::string(R"({"command":"true"})"),
                    {{"OPEN-SANDBOX-API-KEY", kKey}})
                .status == 401);
    }
    const auto r = box.exec("echo keyed");
    CHECK(r.return_code == 0);
    CHECK(r.stdout_text == "keyed\n");
    // The plugin's execd calls went the way the mode says.
    CHECK(f.count("POST " + prefix + "/command") >= 1);
    CHECK(f.count_in_log("MISSING_API_KEY") == 0);
    box.close();
    CHECK(f.sandboxes_on_server(true) == 0);
  }
}

TEST_CASE("create backoff: the waits between attempts stay within retry_delay_s/max_delay") {
  // Waits are uniform in [0, min(max, delay * 2^(n-1))]: at most 0.3 s, then 0.4 s, then 0.4 s.
  // With the defaults (5 s, 60 s) they could reach 5 s and more.
  Fixture f(R"([{"route": "POST /sandboxes",
                 "actions": [{"status": 503}, {"status": 503}, {"status": 503}]}])",
            json::object{{"create", json::object{{"retries", 3},
                                                 {"retry_delay_s", 0.3},
                                                 {"retry_max_delay_s", 0.4}}}});
  auto box = f.create();
  const auto times = f.request_times("POST /v1/sandboxes");
  REQUIRE(times.size() == 4);
  const double bounds[] = {0.3, 0.4, 0.4};
  for (size_t i = 1; i < times.size(); ++i) {
    CAPTURE(i);
    REQUIRE(times[i - 1] >= 0);
    const double gap = times[i] - times[i - 1];
    CHECK(gap >= 0);
    CHECK(gap <= bounds[i - 1] + 0.5);  // margin for scheduling and a slow (TSan) build
  }
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}
