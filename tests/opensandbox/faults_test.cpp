// The opensandbox plugin against `sbx serve` with fault injection (docs/serve.md, "Fault
// injection"), over the test_processes provider (sandboxes are local processes: no Docker). The
// plugin is loaded through the host API (sbx::Host) and pointed at the server; what reached the
// server is read from its debug log (one "sbx serve: METHOD TARGET (request ...)" line per
// request, with a millisecond timestamp) and from its lifecycle API.
//
// Cases: create retried after 503s (and given up, leaving nothing), a 400 not retried, 502s on
// command submission resubmitted (and given up: "backend unreachable"), a cut command stream,
// close of a sandbox the server already deleted, the API key's placement in direct and
// server-proxy mode, and the create backoff's bounds; the create path's messages and logs (the
// plugin's log is read from a sink on the host's "sbx" logger); the endpoint extension; list and
// reap by metadata.

#include "../common/test_helpers.hpp"
#include "../serve/support.hpp"

#include <sbx/core/errors.hpp>
#include <sbx/core/host.hpp>
#include <sbx/core/provider.hpp>
#include <sbx/core/sandbox.hpp>

#include <doctest/doctest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
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

// The host's log lines (the plugin's included), for the whole process: a sink on the "sbx" logger,
// which every provider logger copies when made (at debug, so the plugin's debug lines come).
class LinesSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    lines_.clear();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

LinesSink& host_log() {
  static auto* const sink = [] {
    auto* s = new std::shared_ptr<LinesSink>(std::make_shared<LinesSink>());
    auto base = spdlog::get("sbx");
    if (!base) {
      base = std::make_shared<spdlog::logger>("sbx");
      spdlog::register_logger(base);
    }
    base->sinks().push_back(*s);
    base->set_level(spdlog::level::debug);
    return s;
  }();
  return **sink;
}

// The host log's lines that contain `part`.
std::vector<std::string> host_lines(const std::string& part) {
  std::vector<std::string> out;
  for (auto& line : host_log().lines()) {
    if (line.find(part) != std::string::npos) out.push_back(std::move(line));
  }
  return out;
}

// `sbx serve` over test_processes with `faults` as its fault plan (debug log: every request),
// and a host whose provider "os" is the opensandbox plugin pointed at it with `plugin` merged
// over a fast config (no probe, short retry delays).
struct Fixture : ProcessesServer {
  std::optional<sbx::Host> host;

  explicit Fixture(const std::string& faults, json::object plugin = {}, bool with_key = false) {
    // The server's per-sandbox command cap (8 running, 24 waiting by default) would refuse the
    // 200 execs this suite sends at once: these cases measure the plugin, so the cap is raised.
    write_config(processes_block(),
                 json::object{{"serve", json::object{{"faults", json::parse(faults)},
                                                     {"max_commands", 256},
                                                     {"max_queued_commands", 256}}}});
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
    host_log().clear();  // made before the first host: its loggers copy the sink and the level
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
  // How many attempts were made, then the last error.
  CHECK(message.find("OpenSandbox create failed after 2 attempts; last error: ") !=
        std::string::npos);
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
  // At each exec's first 502 the sandbox's status was read (deleted or paused meanwhile?), and
  // before giving up again in case it died of memory (it did not: the 502 stands). It stays
  // Running, so those reads go on for the diagnosis's 5 s, 0.5 s apart.
  const auto reads = f.request_times("GET /v1/sandboxes/" + box.id());
  CAPTURE(reads.size());
  CHECK(reads.size() >= 5);
  CHECK(reads.size() <= 14);
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

// Cancelled before its init event, a command may already run on the server, and only its id can
// stop it (execd does not stop a command whose client went away; a background command is not
// meant to stop). The exec ends at once; the submission stays open until the id comes, which is
// then interrupted, and the provider waits for that interrupt as for any other when it goes.
TEST_CASE("an exec cancelled before its command id came: the command is interrupted by its id") {
  for (const bool background : {false, true}) {
    CAPTURE(background);
    // The server waits 1 s before it starts the command and answers.
    Fixture f(R"([{"route": "POST /command", "actions": [{"delay_ms": 1000}]}])",
              json::object{{"operations", json::object{{"background_exec", background}}}});
    std::string id;
    const fs::path marker = f.dir.path / "late-marker";
    Clock::time_point cancelled_at;
    {
      auto box = f.create();
      id = box.id();
      auto op = box.exec_async("sleep 2; touch " + marker.string());
      REQUIRE(sbx::testing::eventually(
          [&] { return f.count("POST /sandboxes/" + id + "/proxy/44772/command") == 1; }, 10s));
      cancelled_at = Clock::now();
      op.cancel();
      CHECK_THROWS_AS(op.get(), sbx::CancelledError);
      CHECK(seconds_since(cancelled_at) < 0.5);  // not the server's 1 s
      box.detach();
    }
    f.host.reset();  // waits for the id and its interrupt
    const std::string interrupt = "DELETE /sandboxes/" + id + "/proxy/44772/command?id=";
    CHECK(f.request_times(interrupt, true).size() == 1);
    // The command was stopped: its marker never comes (it would 3 s after the cancel).
    std::this_thread::sleep_until(cancelled_at + 3500ms);
    CHECK_FALSE(fs::exists(marker));
    CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  }
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

// The real execd answers a directory download with a 500 whose Content-Length is not its body's:
// the answer is the error, not "connection lost", and nothing is resumed.
TEST_CASE("an error answer whose body breaks off is reported as the answer, not resumed") {
  Fixture f(R"([{"route": "GET /files/download",
                 "actions": [{"status": 500, "code": "RUNTIME_ERROR",
                              "message": "read /tmp: is a directory", "short_body": true}]}])");
  auto box = f.create();
  const fs::path local = f.dir.path / "never.bin";
  std::string message;
  try {
    box.download("/tmp", local);
  } catch (const sbx::Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("download of /tmp") != std::string::npos);
  CHECK(message.find("HTTP 500 RUNTIME_ERROR: read /tmp: is a directory") != std::string::npos);
  CHECK(message.find("connection lost") == std::string::npos);
  CHECK_FALSE(fs::exists(local));
  const std::string route = "GET /sandboxes/" + box.id() + "/proxy/44772/files/download";
  CHECK(f.request_times(route, true).size() == 1);
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
  // The third /ping would be held 5 s, as the real server's frozen execd holds it: connecting to
  // a paused sandbox must not ask.
  Fixture f(R"([{"route": "GET /ping",
                 "actions": [{"pass": true}, {"pass": true}, {"delay_ms": 5000}]}])");
  auto box = f.create();
  const auto& provider = f.host->provider("os");
  auto again = provider.connect(R"({"sandbox_id":")" + box.id() + R"("})");
  CHECK(again.id() == box.id());
  CHECK(again.exec("echo hi").stdout_text == "hi\n");
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/pause").status == 202);
  // A handle connected while the sandbox is paused knows it: exec is refused at once.
  const auto connecting = Clock::now();
  auto paused = provider.connect(R"({"sandbox_id":")" + box.id() + R"("})");
  const double connect_s = std::chrono::duration<double>(Clock::now() - connecting).count();
  MESSAGE("connect to a paused sandbox took ", connect_s, " s");
  CHECK(connect_s < 2.0);
  CHECK(host_lines("GET /v1/sandboxes/" + box.id() + "/endpoints/44772").size() == 3);
  try {
    paused.exec("echo x");
    FAIL("exec on a paused handle must fail");
  } catch (const sbx::Error& e) {
    CHECK(e.status() == SBX_STATUS_FAILED_PRECONDITION);
  }
  // So is a terminal (issue 35: `sbx shell` waited out the 30 s request budget on the frozen
  // execd), and attaching to one.
  for (const auto& use :
       {std::function<void()>([&] { paused.open_pty(); }), std::function<void()>([&] {
          sbx::PtyAttachOptions options;
          options.on_output = [](sbx::OutputStream, uint64_t, std::string_view) {};
          paused.pty("t1").attach_async(std::move(options)).get();
        })}) {
    const auto started = Clock::now();
    try {
      use();
      FAIL("a terminal on a paused handle must fail");
    } catch (const sbx::Error& e) {
      CHECK(e.status() == SBX_STATUS_FAILED_PRECONDITION);
      CHECK(std::string(e.what()).find("paused") != std::string::npos);
    }
    CHECK(Clock::now() - started < std::chrono::seconds(2));
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

// An exec that must fail with `status`, its message saying `words`.
void exec_refused(sbx::Sandbox& box, sbx_status status, const std::string& words) {
  try {
    box.exec("echo never");
    FAIL("the exec must fail: " << words);
  } catch (const sbx::Error& e) {
    CAPTURE(e.what());
    CHECK(e.status() == status);
    CHECK(std::string(e.what()).find(words) != std::string::npos);
  }
}

// An exec on a sandbox deleted behind the handle: NOT_FOUND, saying it is gone.
void exec_finds_it_gone(sbx::Sandbox& box) {
  exec_refused(box, SBX_STATUS_NOT_FOUND, "is gone");
}

// The real server's execd says nothing of a pause or a delete: `docker pause` freezes it (it takes
// the connection and never answers) and a deleted sandbox's published port is closed. Emulated
// here by a command held 5 s (frozen) and a connection reset (closed); the plugin asks the
// lifecycle API and reports what it says.
TEST_CASE("a sandbox paused or deleted behind the handle: the exec says so within seconds") {
  Fixture f(R"([{"route": "POST /command",
                 "actions": [{"pass": true}, {"delay_ms": 5000}, {"pass": true}, {"reset": true}]}])");
  auto box = f.create();
  CHECK(box.exec("echo hi").stdout_text == "hi\n");
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/pause").status == 202);
  auto start = Clock::now();
  exec_refused(box, SBX_STATUS_FAILED_PRECONDITION, "is Paused");
  const double paused_s = std::chrono::duration<double>(Clock::now() - start).count();
  MESSAGE("exec on a frozen execd refused after ", paused_s, " s");
  CHECK(paused_s < 4.5);  // before the held answer would have come
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/resume").status == 202);
  CHECK(box.exec("echo back").stdout_text == "back\n");
  REQUIRE(request(f.port(), "DELETE", "/v1/sandboxes/" + box.id()).status == 204);
  exec_finds_it_gone(box);
  box.detach();
  CHECK(f.sandboxes_on_server() == 0);
}

// The real server's proxy answers 502 once a deleted sandbox's execd is gone. Issue 35: the plugin
// resubmitted through every 502 and then said "backend unreachable"; it asks the lifecycle API at
// the first and says the sandbox is gone.
TEST_CASE("a sandbox deleted behind the handle, its proxy answering 502: NOT_FOUND at once") {
  Fixture f(R"([{"route": "POST /command",
                 "actions": [{"pass": true}, {"status": 502}, {"status": 502}, {"status": 502},
                             {"status": 502}, {"status": 502}, {"status": 502}]}])");
  auto box = f.create();
  CHECK(box.exec("echo hi").stdout_text == "hi\n");
  REQUIRE(request(f.port(), "DELETE", "/v1/sandboxes/" + box.id()).status == 204);
  exec_finds_it_gone(box);
  box.detach();
}

// A paused sandbox's execd takes the connection and never answers (the server holds each transfer
// 5 s here): an upload or a download asks the lifecycle API after 1 s without progress and fails
// with the reason, instead of waiting for stream_idle_timeout_s (60 s).
TEST_CASE("a sandbox paused behind the handle: an upload or a download says so within seconds") {
  Fixture f(R"([{"route": "POST /files/upload", "actions": [{"pass": true}, {"delay_ms": 5000}]},
                {"route": "GET /files/download", "actions": [{"delay_ms": 5000}]}])");
  auto box = f.create();
  const std::string remote = "paused-transfer.txt";
  box.upload_bytes("before\n", remote);
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/pause").status == 202);
  const auto refused = [&](const std::string& what, auto&& transfer) {
    CAPTURE(what);
    const auto start = Clock::now();
    try {
      transfer();
      FAIL("a transfer to a sandbox paused behind the handle must fail");
    } catch (const sbx::Error& e) {
      CAPTURE(e.what());
      CHECK(e.status() == SBX_STATUS_FAILED_PRECONDITION);
      CHECK(std::string(e.what()).find("is Paused") != std::string::npos);
    }
    const double took = seconds_since(start);
    MESSAGE(what, " on a frozen execd refused after ", took, " s");
    CHECK(took < 4.5);  // before the held answer would have come
  };
  refused("upload", [&] { box.upload_bytes("after\n", remote); });
  const fs::path local = f.dir.path / "paused-download.txt";
  refused("download", [&] { box.download(remote, local); });
  CHECK_FALSE(fs::exists(local));
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + box.id() + "/resume").status == 202);
  box.download(remote, local);
  CHECK(sbx::testing::read_file(local) == "before\n");
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

// Ctrl-C on `sbx exec` cancels the command and the process exits: the interrupt must reach the
// server and be answered before the provider goes. The server holds the interrupt's answer 1 s;
// the host is destroyed at once (the provider with it, or on the host's janitor thread when a
// plugin callback held it last), and the interrupt must still complete, not be cut off.
TEST_CASE("a cancelled command's interrupt is answered although the host goes away at once") {
  Fixture f(R"([{"route": "DELETE /command", "actions": [{"delay_ms": 1000}]}])");
  std::string id;
  {  // the handle and the operation go first: the host's provider lives while they do
    auto box = f.create();
    id = box.id();
    std::mutex m;
    std::condition_variable printed;
    bool started = false;
    sbx::ExecOptions options;
    options.on_output = [&](sbx::OutputStream, std::string_view) {
      std::lock_guard lock(m);
      started = true;
      printed.notify_all();
    };
    auto op = box.exec_async("echo started; sleep 30", options);
    {
      std::unique_lock lock(m);
      REQUIRE(printed.wait_for(lock, 10s, [&] { return started; }));
    }
    op.cancel();
    CHECK_THROWS_AS(op.get(), sbx::CancelledError);
    box.detach();
  }
  f.host.reset();
  // The plugin logs the interrupt's answer, not a call cut off by its destruction.
  CHECK(sbx::testing::eventually([&] { return !host_lines("interrupted command ").empty(); }, 10s));
  CHECK(host_lines("interrupted command ").size() == 1);
  // An answer (200, or the server's 500 when the stream's end already stopped the command).
  CHECK(host_lines("of sandbox " + id + ": HTTP ").size() == 1);
  CHECK(host_lines("interrupting command ").empty());  // no error, no cancellation
  CHECK(f.request_times("DELETE /sandboxes/" + id + "/proxy/44772/command?id=", true).size() == 1);
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
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

// --- the create path's messages and logs ------------------------------------------------------

namespace {

std::string create_error(Fixture& f, sbx::SandboxSpec spec, sbx_status* status = nullptr) {
  try {
    f.host->provider("os").create(std::move(spec));
  } catch (const sbx::Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  FAIL("the create succeeded");
  return {};
}

sbx::SandboxSpec spec_with_ready_timeout(double seconds) {
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.ttl_s = 600;
  spec.ready_timeout_s = seconds;
  return spec;
}

// "<text>sandbox_id=<id>..." -> <id> (up to ',' or ';').
std::string id_after(const std::string& text, const std::string& marker = "sandbox_id=") {
  const auto at = text.find(marker);
  if (at == std::string::npos) return {};
  const auto begin = at + marker.size();
  return text.substr(begin, text.find_first_of(",;", begin) - begin);
}

}  // namespace

TEST_CASE("a health check that times out after create: the step, the id; the cleanup names it") {
  // /ping fails for 30 s after each create; the sandbox's ready_timeout is 1 s. The cleanup goes
  // through close's retries (one here); its DELETE fails both times, so the sandbox stays and the
  // warning is logged (the test deletes it).
  Fixture f(R"([{"route": "GET /ping", "fail_for_s": 30, "status": 503},
                {"route": "DELETE /sandboxes/{id}", "actions": [{"status": 503}, {"status": 503}]}])",
            json::object{{"create", json::object{{"retries", 0}}},
                         {"operations", json::object{{"retries", 1}, {"retry_delay_s", 0.05}}}});
  sbx_status status = SBX_STATUS_OK;
  const auto message = create_error(f, spec_with_ready_timeout(1), &status);
  CAPTURE(message);
  CHECK(status == SBX_STATUS_CREATE_FAILED);
  CHECK(message.find("OpenSandbox create failed after 1 attempt; last error: Timed out "
                     "connecting to OpenSandbox sandbox after create, waiting for execd's /ping "
                     "to answer 200; sandbox_id=") != std::string::npos);
  CHECK(message.find("timeout_s=1;") != std::string::npos);
  const std::string id = id_after(message);
  REQUIRE(!id.empty());
  const auto warned = host_lines(
      "Failed to clean up OpenSandbox sandbox after create health "
      "check failure; sandbox_id=" +
      id + "; error=");
  CHECK(warned.size() == 1);
  CHECK(host_lines("Retrying OpenSandbox close of " + id + " after attempt 1").size() == 1);
  CHECK(host_lines("after create probe failure").empty());
  // The failed cleanup left it: remove it here.
  REQUIRE(f.sandboxes_on_server() == 1);
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("an endpoint fetch that times out after create: named, and the sandbox deleted") {
  Fixture f(R"([{"route": "GET /sandboxes/{id}/endpoints/{port}", "fail_for_s": 30,
                 "status": 503}])",
            json::object{{"create", json::object{{"retries", 0}}}});
  const auto message = create_error(f, spec_with_ready_timeout(1));
  CAPTURE(message);
  const std::string id = id_after(message);
  REQUIRE(!id.empty());
  CHECK(message.find("Timed out connecting to OpenSandbox sandbox after create, fetching its execd "
                     "endpoint (GET /v1/sandboxes/" +
                     id + "/endpoints/44772); sandbox_id=" + id) != std::string::npos);
  CHECK(message.find("HTTP 503") != std::string::npos);  // the last error
  CHECK(host_lines("opensandbox: deleted sandbox " + id + " after create endpoint fetch failure")
            .size() == 1);
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a health check that times out on connect says so: TIMEOUT, not 'after create'") {
  // The create skips the health check (its provider option), so only connect meets the failing
  // /ping; connect's budget is create.connect_attempt_timeout_s.
  Fixture f(R"([{"route": "GET /ping", "fail_for_s": 30, "status": 503}])",
            json::object{{"create", json::object{{"connect_attempt_timeout_s", 1}}}});
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.ttl_s = 600;
  spec.provider_options = json::object{{"skip_health_check", true}};
  auto box = f.host->provider("os").create(std::move(spec));
  std::string message;
  sbx_status status = SBX_STATUS_OK;
  try {
    f.host->provider("os").connect(R"({"sandbox_id":")" + box.id() + R"("})");
  } catch (const sbx::Error& e) {
    message = e.what();
    status = e.status();
  }
  CAPTURE(message);
  CHECK(status == SBX_STATUS_TIMEOUT);
  CHECK(message.find("Timed out connecting to OpenSandbox sandbox on connect, waiting for execd's "
                     "/ping to answer 200; sandbox_id=" +
                     box.id() + ", timeout_s=1;") != std::string::npos);
  CHECK(message.find("after create") == std::string::npos);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a TTL under the server's minimum is logged once at info, and 60 s is what is sent") {
  // The first POST is refused: the retry must not log the TTL again.
  Fixture f(R"([{"route": "POST /sandboxes", "actions": [{"status": 503}]}])");
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.ttl_s = 10;
  auto box = f.host->provider("os").create(std::move(spec));
  CHECK(f.count("POST /v1/sandboxes") == 2);
  CHECK(host_lines("opensandbox: TTL 10 s is under the server's minimum of 60 s; sending "
                   "timeout 60 s")
            .size() == 1);
  CHECK(host_lines("opensandbox: TTL").size() == 1);
  const auto r = request(f.port(), "GET", "/v1/sandboxes/" + box.id());
  REQUIRE(r.status == 200);
  const auto answer = r.json();
  const auto& o = answer.as_object();
  const long long lifetime_us = parse_time_us(std::string(o.at("expiresAt").as_string())) -
                                parse_time_us(std::string(o.at("createdAt").as_string()));
  CHECK(lifetime_us == 60'000'000);
  box.close();
  CHECK(f.sandboxes_on_server() == 0);
}

TEST_CASE("a bad pull policy in the extensions: the key and the value, no request sent") {
  Fixture f("[]");
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.provider_options =
      json::object{{"extensions", json::object{{"imagePullPolicy", "Sometimes"}}}};
  sbx_status status = SBX_STATUS_OK;
  const auto message = create_error(f, std::move(spec), &status);
  CAPTURE(message);
  CHECK(status == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(message.find("provider_options.extensions.imagePullPolicy: image_pull_policy must be one "
                     "of: Always, IfNotPresent, Never; got 'Sometimes'") != std::string::npos);
  CHECK(f.count("POST /v1/sandboxes") == 0);
}

TEST_CASE("every lifecycle request is logged at debug: method, path, status, ms; never a secret") {
  Fixture f("[]", {}, true);
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.ttl_s = 600;
  spec.ports = {44772};
  auto box = f.host->provider("os").create(std::move(spec));
  const auto endpoint = box.endpoint(44772);
  REQUIRE(endpoint.headers.count("X-EXECD-ACCESS-TOKEN") == 1);
  const std::string token = endpoint.headers.at("X-EXECD-ACCESS-TOKEN");
  CHECK(box.exec("echo logged").stdout_text == "logged\n");
  const std::string id = box.id();
  box.close();
  CHECK(f.sandboxes_on_server(true) == 0);

  auto logged = [&](const std::string& request_and_status, size_t times) {
    const auto lines = host_lines("opensandbox: " + request_and_status + " in ");
    CAPTURE(request_and_status);
    REQUIRE(lines.size() == times);
    for (const auto& line : lines) {  // "... in <digits> ms" at the end
      const std::string ms = line.substr(line.rfind(" in ") + 4);
      CAPTURE(line);
      CHECK(ms.size() > 3);
      CHECK(ms.substr(ms.size() - 3) == " ms");
      CHECK(ms.find_first_not_of("0123456789") == ms.size() - 3);
    }
  };
  logged("POST /v1/sandboxes -> 202", 1);
  logged("GET /v1/sandboxes/" + id + "/endpoints/44772 -> 200", 2);  // create's, the extension's
  logged("DELETE /v1/sandboxes/" + id + " -> 204", 1);
  // No secret in any line of the host's log.
  CHECK(host_lines(kKey).empty());
  CHECK(host_lines(token).empty());
  CHECK(!host_log().lines().empty());
}

// --- sbx.endpoint/1 ---------------------------------------------------------------------------

// `sbx serve` hands out its gateway path for every port, but serves only execd (44772) there:
// another port's path answers 502 NOT_SUPPORTED. So the endpoint of 44772 is checked by using it,
// that of another port by its form and by that answer.
TEST_CASE(
    "endpoint: the server's URL with a scheme, the endpoint's headers, the key only proxied") {
  for (const bool proxy : {false, true}) {
    CAPTURE(proxy);
    Fixture f("[]", json::object{{"connection", json::object{{"use_server_proxy", proxy}}}}, true);
    sbx::SandboxSpec spec;
    spec.image = "local/busybox:latest";
    spec.ttl_s = 600;
    spec.ports = {44772, 8080};
    auto box = f.host->provider("os").create(std::move(spec));
    const std::string origin = "http://127.0.0.1:" + std::to_string(f.port());
    const std::string prefix = (proxy ? "/v1/sandboxes/" : "/sandboxes/") + box.id() + "/proxy/";

    const auto execd = box.endpoint(44772);
    CHECK(execd.url == origin + prefix + "44772");
    REQUIRE(execd.headers.count("X-EXECD-ACCESS-TOKEN") == 1);
    // The API key goes with a proxied endpoint only (direct: the sandbox runs untrusted code).
    CHECK(execd.headers.count("OPEN-SANDBOX-API-KEY") == (proxy ? 1u : 0u));
    if (proxy) CHECK(execd.headers.at("OPEN-SANDBOX-API-KEY") == kKey);
    // Usable as handed out: execd's /ping through it, with exactly its headers.
    REQUIRE(execd.url.rfind(origin, 0) == 0);
    const std::map<std::string, std::string> headers(execd.headers.begin(), execd.headers.end());
    CHECK(request(f.port(), "GET", execd.url.substr(origin.size()) + "/ping", std::nullopt, headers)
              .status == 200);
    // Without them, refused (the headers are what makes the endpoint usable).
    CHECK(request(f.port(), "GET", execd.url.substr(origin.size()) + "/ping").status == 401);

    const auto other = box.endpoint(8080);
    CHECK(other.url == origin + prefix + "8080");
    CHECK(other.headers == execd.headers);
    // A handle connected by its bare id, or moved through its descriptor, keeps the ports.
    auto bare = f.host->provider("os").connect(R"({"sandbox_id":")" + box.id() + R"("})");
    CHECK(bare.endpoint(8080).url == other.url);
    auto moved = f.host->provider("os").connect(box.serialize());
    CHECK(moved.endpoint(8080).url == other.url);
    bare.detach();
    moved.detach();
    const auto r =
        request(f.port(), "GET", other.url.substr(origin.size()) + "/", std::nullopt, headers);
    CHECK(r.status == 502);
    CHECK(r.body.find("serves execd (port 44772) on its gateway, not port 8080") !=
          std::string::npos);

    // A sandbox gone behind the plugin's back: NOT_FOUND.
    REQUIRE(request(f.port(), "DELETE", "/v1/sandboxes/" + box.id(), std::nullopt,
                    {{"OPEN-SANDBOX-API-KEY", kKey}})
                .status == 204);
    try {
      box.endpoint(8080);
      FAIL("endpoint of a deleted sandbox must fail");
    } catch (const sbx::Error& e) {
      CHECK(e.status() == SBX_STATUS_NOT_FOUND);
    }
    box.close();
    CHECK(f.sandboxes_on_server(true) == 0);
  }
}

// --- sbx.list-reap/1 --------------------------------------------------------------------------

namespace {

sbx::Sandbox create_with(Fixture& f, std::map<std::string, std::string> metadata) {
  sbx::SandboxSpec spec;
  spec.image = "local/busybox:latest";
  spec.ttl_s = 600;
  for (auto& [k, v] : metadata)
    spec.metadata[k] = v;
  return f.host->provider("os").create(std::move(spec));
}

std::set<std::string> ids_of(const std::vector<sbx::SandboxInfo>& infos) {
  std::set<std::string> out;
  for (const auto& i : infos)
    out.insert(i.id);
  return out;
}

}  // namespace

TEST_CASE("list by metadata: exact pairs, a key with any value, encoded keys; reap only those") {
  Fixture f("[]");
  const auto& provider = f.host->provider("os");
  auto a = create_with(f, {{"example.com/team", "red"}, {"job", "a.1"}});
  auto b = create_with(f, {{"example.com/team", "blue"}, {"job", "a.1"}});
  auto c = create_with(f, {{"job", "c"}});

  const auto red = provider.list({{"example.com/team", "red"}});
  REQUIRE(red.size() == 1);
  CHECK(red[0].id == a.id());
  CHECK(red[0].status == sbx::SandboxStatus::running);
  CHECK(red[0].labels.at("example.com/team") == "red");
  CHECK(red[0].labels.at("job") == "a.1");
  CHECK(red[0].created_unix_ms > 0);
  CHECK(ids_of(provider.list({{"example.com/team", ""}})) == std::set{a.id(), b.id()});
  CHECK(ids_of(provider.list({{"job", "a.1"}, {"example.com/team", ""}})) ==
        std::set{a.id(), b.id()});
  CHECK(ids_of(provider.list({{"job", "a.1"}, {"example.com/team", "blue"}})) == std::set{b.id()});
  CHECK(provider.list({{"job", "nothing"}}).empty());
  CHECK(provider.list({{"no-such-key", ""}}).empty());
  CHECK(ids_of(provider.list({})) == std::set{a.id(), b.id(), c.id()});

  const auto reaped = provider.reap({{"example.com/team", ""}});
  CHECK(ids_of(reaped) == std::set{a.id(), b.id()});
  for (const auto& r : reaped)
    CHECK(r.status == sbx::SandboxStatus::stopped);
  CHECK(f.count("DELETE /v1/sandboxes/" + a.id()) == 1);
  CHECK(f.count("DELETE /v1/sandboxes/" + b.id()) == 1);
  CHECK(f.count("DELETE /v1/sandboxes/" + c.id()) == 0);
  CHECK(f.sandboxes_on_server() == 1);
  CHECK(c.exec("echo still").stdout_text == "still\n");
  CHECK(provider.reap({{"example.com/team", ""}}).empty());  // nothing left to match
  a.detach();
  b.detach();
  c.close();
  CHECK(f.sandboxes_on_server() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("reap: a 404 counts as removed; a delete that keeps failing fails the reap") {
  // operations.retries 0: one DELETE per sandbox. The first DELETE is answered 404 (the sandbox
  // stays: the fault lied), the second 500.
  Fixture f(R"([{"route": "DELETE /sandboxes/{id}",
                 "actions": [{"status": 404, "code": "DOCKER::SANDBOX_NOT_FOUND"},
                             {"status": 500}]}])",
            json::object{{"operations", json::object{{"retries", 0}}}});
  const auto& provider = f.host->provider("os");
  auto a = create_with(f, {{"reap", "one"}});
  const auto reaped = provider.reap({{"reap", "one"}});
  REQUIRE(reaped.size() == 1);
  CHECK(reaped[0].id == a.id());
  CHECK(f.sandboxes_on_server() == 1);  // the 404 was injected: still there
  std::string message;
  try {
    provider.reap({{"reap", "one"}});
  } catch (const sbx::Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("OpenSandbox reap removed 0 sandboxes but 1 could not be removed") !=
        std::string::npos);
  CHECK(message.find("HTTP 500") != std::string::npos);
  // The fault sequence is used up: the third reap removes it.
  CHECK(ids_of(provider.reap({{"reap", "one"}})) == std::set{a.id()});
  CHECK(f.sandboxes_on_server() == 0);
  a.detach();
}
