// Hot swap in `sbx serve` (docs/hot-swap.md): the served plugin file replaced under a steady load
// of client sessions, reloaded through POST /admin/reload, `sbx reload` and SIGHUP; refused
// reloads (a corrupt file, a wrong-ABI plugin, a plugin whose init fails) reported while the old
// generation serves on; GET /admin/providers; and after the load, the old generations drained and
// their libraries gone from the server's mappings.
//
// The server runs test_processes (sandboxes are host processes) from a plugin file in the test's
// own directory. The clients are real OpenSandbox clients: the opensandbox plugin through
// sbx::Host, each session a create, commands, a file round trip and a close.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <sbx/core/errors.hpp>
#include <sbx/core/host.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

using namespace serve_test;
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kKey = "reload-test-key-0123456789";
const fs::path kV1 = fs::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so";
const fs::path kV2 = SBX_TEST_PLUGIN_V2;
const fs::path kWrongAbi = fs::path(SBX_BAD_PLUGIN_DIR) / "wrong_abi.so";
const fs::path kInitFails = fs::path(SBX_BAD_PLUGIN_DIR) / "init_fails.so";

// Concurrent client sessions (the sanitizers cost 5-15x).
constexpr int kSessions = sbx::testing::kSanitized ? 24 : 100;

struct Fixture : ProcessesServer {
  fs::path plugin = dir.path / "plugin.so";
  std::optional<sbx::Host> client;
  std::map<std::string, std::string> auth{{"OPEN-SANDBOX-API-KEY", kKey}};

  explicit Fixture(std::vector<std::string> flags = {}) {
    install(kV1);
    write_config(json::object{{"plugin", plugin.string() + "#test_processes"},
                              {"config", json::object{{"root", root.string()}}}});
    flags.insert(flags.end(), {"--api-key-env", "SBX_RELOAD_TEST_KEY", "--max-streams", "0"});
    start(std::move(flags), {{"SBX_RELOAD_TEST_KEY", kKey}});
    json::object connection{{"domain", "127.0.0.1:" + std::to_string(port())},
                            {"api_key", kKey},
                            {"max_connections", 4 * kSessions}};
    json::object config{{"connection", connection},
                        {"probe", json::object{{"command", nullptr}}},
                        {"attribution", json::object{{"enabled", false}}}};
    json::object host_config{
        {"providers",
         json::object{{"os", json::object{{"plugin", "opensandbox"}, {"config", config}}}}}};
    sbx::Host::Options options;
    options.config = sbx::Config::parse(json::serialize(host_config), "reload test client");
    options.plugin_cache = "off";
    client.emplace(std::move(options));
  }

  // An operator's replacement: a copy next to it, renamed over it.
  void install(const fs::path& file) const { sbx::testing::replace_file_with_copy(plugin, file); }
  void install_text(const std::string& text) const { sbx::testing::replace_file(plugin, text); }

  json::object providers() const { return admin_providers(port(), auth); }
  // The current generation's plugin version.
  std::string current_version() {
    const json::object report = providers();
    for (const auto& g : report.at("generations").as_array()) {
      const auto& o = g.as_object();
      if (o.at("current").as_bool()) return std::string(o.at("plugin_version").as_string());
    }
    return "";
  }
  Response reload(std::optional<std::string> body = std::nullopt) {
    return request(port(), "POST", "/admin/reload", std::move(body), auth);
  }
  Response request_json(const std::string& method, const std::string& target,
                        std::optional<std::string> body = std::nullopt) {
    return request(port(), method, target, std::move(body), auth);
  }
  // The generations alive: {plugin_version: sandboxes held}.
  std::map<std::string, int64_t> sandboxes_by_version() {
    std::map<std::string, int64_t> out;
    const json::object report = providers();
    for (const auto& g : report.at("generations").as_array()) {
      const auto& o = g.as_object();
      out[std::string(o.at("plugin_version").as_string())] +=
          o.at("sandboxes").to_number<int64_t>();
    }
    return out;
  }
  std::string metrics() {
    const auto r = request(port(), "GET", "/metrics", std::nullopt, auth);
    REQUIRE(r.status == 200);
    return r.body;
  }

  // Paths of the plugin images mapped in the server, from /proc/PID/maps (the copies a reload
  // loads are unlinked: "... (deleted)").
  std::set<std::string> mapped_plugins() const {
    std::ifstream maps("/proc/" + std::to_string(server->pid()) + "/maps");
    std::set<std::string> out;
    std::string line;
    while (std::getline(maps, line)) {
      const auto slash = line.find('/');
      if (slash == std::string::npos) continue;
      const std::string path = line.substr(slash);
      if (path.find("plugin") != std::string::npos && path.find(".so") != std::string::npos &&
          path.find(dir.path.string()) == std::string::npos) {
        out.insert(path);
      }
      if (path.starts_with(plugin.string())) out.insert(path);
    }
    return out;
  }
};

}  // namespace

TEST_CASE(
    "the served plugin replaced under load: no client request fails, refusals reported, "
    "old generations drain and unload") {
  Fixture f;
  CHECK(f.current_version() == "0.1.0");  // sbx serve loads its provider at start
  std::atomic<bool> stop{false};
  std::atomic<int> sessions{0};
  std::atomic<int> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < kSessions; ++t) {
    threads.emplace_back([&, t] {
      while (!stop) {
        try {
          sbx::SandboxSpec spec;
          spec.image = "local/any:latest";
          spec.ttl_s = 600;
          sbx::Sandbox box = f.client->provider("os").create(std::move(spec));
          const std::string word = "w" + std::to_string(t);
          auto r = box.exec("echo " + word);
          if (r.return_code != 0 || r.stdout_text != word + "\n") {
            throw std::runtime_error("exec: " + r.stdout_text + r.stderr_text);
          }
          box.upload_bytes("data of " + word, "/tmp/f.txt");
          if (box.download_bytes("/tmp/f.txt") != "data of " + word) {
            throw std::runtime_error("the file came back changed");
          }
          std::this_thread::sleep_for(50ms);  // a session spans reloads
          if (box.exec("echo again").stdout_text != "again\n") throw std::runtime_error("again");
          box.close();
          ++sessions;
        } catch (const std::exception& e) {
          std::lock_guard lock(failure_mutex);
          if (failures++ == 0) first_failure = e.what();
        }
      }
    });
  }
  const auto wait_for_sessions = [&](int at_least) {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (sessions < at_least && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
  };
  wait_for_sessions(kSessions / 4);
  CHECK(f.current_version() == "0.1.0");

  // Five replacements by a rebuilt plugin (versions alternating), each through the admin route.
  for (int i = 0; i < 5; ++i) {
    f.install(i % 2 == 0 ? kV2 : kV1);
    const auto r = f.reload();
    CAPTURE(r.body);
    REQUIRE(r.status == 200);
    CHECK(r.json().at("changed").as_array().size() == 1);
    CHECK(f.current_version() == (i % 2 == 0 ? "2.0.0" : "0.1.0"));
    const int before = sessions;
    wait_for_sessions(before + kSessions / 4);
  }
  // Three refusals: each 409 with the reason; the generation in service stays.
  f.install_text("this is not an ELF shared object\n");
  auto refused = f.reload();
  CHECK(refused.status == 409);
  CHECK(refused.json().at("code") == "ADMIN::RELOAD_REFUSED");
  CHECK(std::string(refused.json().at("message").as_string()).find(": load: ") !=
        std::string::npos);
  f.install(kWrongAbi);
  refused = f.reload();
  CHECK(refused.status == 409);
  f.install(kInitFails);
  refused = f.reload();
  CHECK(refused.status == 409);
  CHECK(std::string(refused.json().at("message").as_string())
            .find("backend library missing (injected)") != std::string::npos);
  CHECK(f.current_version() == "2.0.0");  // the fifth replacement's
  wait_for_sessions(sessions + kSessions / 4);

  stop = true;
  for (auto& t : threads)
    t.join();
  CAPTURE(first_failure);
  MESSAGE(sessions.load(), " sessions of ", kSessions, " clients across 5 reloads and 3 refusals");
  CHECK(failures == 0);

  // Drained: one generation left, nothing in flight; the counts and the last reload reported.
  // A client's close is answered before the server lets go of the handle, so the counts are
  // waited on too (a leak still fails, after the deadline).
  const auto drained = [](const json::object& report) {
    const auto& generations = report.at("generations").as_array();
    if (generations.size() != 1) return false;
    const auto& g = generations[0].as_object();
    return g.at("sandboxes").as_int64() == 0 && g.at("operations").as_int64() == 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  json::object report;
  for (;;) {
    report = f.providers();
    if (drained(report) || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  CAPTURE(json::serialize(report));
  REQUIRE(report.at("generations").as_array().size() == 1);
  const auto& only = report.at("generations").as_array()[0].as_object();
  CHECK(only.at("current").as_bool());
  CHECK(only.at("sandboxes").as_int64() == 0);
  CHECK(only.at("operations").as_int64() == 0);
  CHECK(report.at("reloads").as_int64() == 5);
  CHECK(report.at("reloads_refused").as_int64() == 3);
  CHECK(report.at("last_reload").at("ok") == false);
  // The same in the Prometheus text of GET /metrics, with the requests the clients made.
  const auto metrics = request(f.port(), "GET", "/metrics", std::nullopt, f.auth);
  REQUIRE(metrics.status == 200);
  CHECK(metrics.headers.at("content-type").starts_with("text/plain; version=0.0.4"));
  const std::string& text = metrics.body;
  CHECK(text.find("sbx_serve_reloads_total{result=\"ok\"} 5\n") != std::string::npos);
  CHECK(text.find("sbx_serve_reloads_total{result=\"refused\"} 3\n") != std::string::npos);
  CHECK(text.find("sbx_serve_requests_total{route=\"POST /sandboxes\",code=\"202\"} ") !=
        std::string::npos);
  CHECK(
      text.find("sbx_serve_request_duration_seconds_bucket{route=\"POST /command\",le=\"+Inf\"}") !=
      std::string::npos);
  CHECK(text.find("sbx_serve_requests_total{route=\"POST /admin/reload\"") == std::string::npos);
  CHECK(text.find("sbx_serve_requests_total{route=\"other\",code=\"409\"} 3\n") !=
        std::string::npos);  // the admin routes are no route of the fault plan: "other"
  CHECK(text.find("sbx_provider_generation_sandboxes{provider=\"p\",generation=\"") !=
        std::string::npos);
  CHECK(text.find("current=\"true\"} 0\n") != std::string::npos);
  CHECK(text.find("sbx_serve_sandboxes 0\n") != std::string::npos);
#if !defined(__SANITIZE_THREAD__)  // TSan keeps libraries resident (plugin_library.cpp)
  // Of the six images loaded, only the one in service is still mapped (once the last references
  // to the drained ones, released after the counts above, have unloaded them).
  sbx::testing::eventually([&] { return f.mapped_plugins().size() == 1; });
  const auto mapped = f.mapped_plugins();
  CAPTURE(mapped.size());
  for (const auto& m : mapped)
    MESSAGE("mapped: ", m);
  CHECK(mapped.size() == 1);
#endif
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("sbx reload and SIGHUP reload the server; the admin routes need the key") {
  ::setenv("SBX_RELOAD_TEST_KEY", kKey, 1);  // for `sbx reload --api-key-env`
  Fixture f;
  CHECK(f.client->provider("os").create({.image = "local/any:latest"}).exec("true").return_code ==
        0);
  CHECK(f.current_version() == "0.1.0");
  CHECK(request(f.port(), "POST", "/admin/reload").status == 401);
  CHECK(request(f.port(), "GET", "/admin/providers").status == 401);
  CHECK(request(f.port(), "GET", "/admin/reload", std::nullopt, f.auth).status == 405);

  f.install(kV2);
  std::string out;
  const int code =
      run_to_exit({SBX_CLI, "reload", "--url", "http://127.0.0.1:" + std::to_string(f.port()),
                   "--api-key-env", "SBX_RELOAD_TEST_KEY"},
                  out);
  CAPTURE(out);
  CHECK(code == 0);
  CHECK(out.find("changed: p") != std::string::npos);
  CHECK(f.current_version() == "2.0.0");

  // A refusal: exit 1 and the reason.
  f.install_text("corrupt\n");
  const int refused =
      run_to_exit({SBX_CLI, "reload", "--url", "http://127.0.0.1:" + std::to_string(f.port()),
                   "--api-key-env", "SBX_RELOAD_TEST_KEY"},
                  out);
  CAPTURE(out);
  CHECK(refused == 1);
  CHECK(out.find("HTTP 409: reload refused, nothing changed: provider 'p'") != std::string::npos);

  // SIGHUP, as an operator's `kill -HUP`.
  f.install(kV1);
  REQUIRE(::kill(f.server->pid(), SIGHUP) == 0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (f.current_version() != "0.1.0" && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  CHECK(f.current_version() == "0.1.0");
  CHECK(
      f.client->provider("os").create({.image = "local/any:latest"}).exec("echo hup").stdout_text ==
      "hup\n");
}

TEST_CASE(
    "--watch reloads on a replaced file; a reload may move live sandboxes instead of draining") {
  ::setenv("SBX_RELOAD_TEST_KEY", kKey, 1);  // for `sbx reload --api-key-env`
  Fixture f({"--watch"});
  sbx::Provider os = f.client->provider("os");
  sbx::Sandbox a = os.create({.image = "local/any:latest"});
  sbx::Sandbox b = os.create({.image = "local/any:latest"});
  CHECK(a.exec("echo kept > note").return_code == 0);

  // --watch: replacing the file is the whole operation. The sandboxes drain by default.
  f.install(kV2);
  CHECK(sbx::testing::eventually([&] { return f.current_version() == "2.0.0"; }));
  CHECK(f.sandboxes_by_version() == std::map<std::string, int64_t>{{"0.1.0", 2}, {"2.0.0", 0}});

  // What a reload does with them is the request's choice; a body it cannot read is refused.
  const auto bad = f.reload(R"({"sandboxes": "teleport"})");
  CHECK(bad.status == 400);
  CHECK(bad.body.find("ADMIN::INVALID_REQUEST") != std::string::npos);
  const auto moved = f.reload(R"({"sandboxes": "move"})");
  REQUIRE(moved.status == 200);
  const json::object report = moved.json().as_object();
  CHECK(report.at("moved").as_array().size() == 2);
  CHECK(report.at("not_moved").as_array().empty());
  // The old generation held nothing more: it is gone, its image unmapped; both sandboxes work on
  // the new one, as they were.
  CHECK(sbx::testing::eventually([&] {
    return f.sandboxes_by_version() == std::map<std::string, int64_t>{{"2.0.0", 2}};
  }));
  CHECK(a.exec("cat note").stdout_text == "kept\n");
  CHECK(b.exec("echo b").stdout_text == "b\n");
#if !defined(__SANITIZE_THREAD__)  // TSan keeps libraries resident (plugin_library.cpp)
  CHECK(sbx::testing::eventually([&] { return f.mapped_plugins().size() == 1; }));
#endif

  // sbx reload --move, after another replacement the watcher reloads on its own first.
  f.install(kV1);
  CHECK(sbx::testing::eventually([&] { return f.current_version() == "0.1.0"; }));
  std::string out;
  const int code =
      run_to_exit({SBX_CLI, "reload", "--url", "http://127.0.0.1:" + std::to_string(f.port()),
                   "--api-key-env", "SBX_RELOAD_TEST_KEY", "--move"},
                  out);
  CAPTURE(out);
  CHECK(code == 0);
  CHECK(out.find("moved: 2 sandbox(es)") != std::string::npos);
  CHECK(sbx::testing::eventually([&] {
    return f.sandboxes_by_version() == std::map<std::string, int64_t>{{"0.1.0", 2}};
  }));
  CHECK(a.exec("cat note").stdout_text == "kept\n");

  // A corrupt replacement: the watcher's reload is refused, the old generation serves on.
  f.install_text("corrupt\n");
  CHECK(sbx::testing::eventually(
      [&] { return f.providers().at("reloads_refused").to_number<int64_t>() == 1; }));
  CHECK(f.current_version() == "0.1.0");
  CHECK(b.exec("echo still").stdout_text == "still\n");

  // The watches follow the config in force: "p" now names another file (the config's change is
  // itself a reload), and a change to that file reloads.
  const fs::path other = f.dir.path / "other.so";
  fs::copy_file(kV2, other);
  f.write_config(json::object{{"plugin", other.string() + "#test_processes"},
                              {"config", json::object{{"root", f.root.string()}}}});
  CHECK(sbx::testing::eventually([&] { return f.current_version() == "2.0.0"; }));
  sbx::testing::replace_file_with_copy(other, kV1);
  CHECK(sbx::testing::eventually([&] { return f.current_version() == "0.1.0"; }));

  // Errors by type in /metrics: an unknown sandbox, a missing key, the refused admin body.
  CHECK(request(f.port(), "GET", "/v1/sandboxes/no-such-box", std::nullopt, f.auth).status == 404);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/no-such-box").status == 401);
  const std::string text = f.metrics();
  CAPTURE(text);
  CHECK(text.find("sbx_serve_errors_total{route=\"GET /sandboxes/{id}\","
                  "type=\"DOCKER::SANDBOX_NOT_FOUND\"} 1\n") != std::string::npos);
  CHECK(text.find("type=\"MISSING_API_KEY\"} 1\n") != std::string::npos);
  CHECK(text.find("type=\"ADMIN::INVALID_REQUEST\"} 1\n") != std::string::npos);
  CHECK(text.find("sbx_serve_reloads_total{result=\"refused\"} 1\n") != std::string::npos);
  a.close();
  b.close();
}

TEST_CASE("pause and renew ask the sandbox's own generation, not the block's current one") {
  Fixture f;
  const auto create = [&](const std::string& timeout) {
    const auto r = f.request_json(
        "POST", "/v1/sandboxes",
        R"({"image":{"uri":"local/any:latest"},"entrypoint":["tail","-f","/dev/null"],)"
        R"("resourceLimits":{"cpu":"500m","memory":"512Mi"},"timeout":)" +
            timeout + "}");
    REQUIRE_MESSAGE(r.status == 202, r.body);
    return std::string(r.json().at("id").as_string());
  };
  const auto op = [&](const std::string& id, const std::string& what) {
    std::optional<std::string> body;
    if (what == "renew-expiration") {
      body = R"({"expiresAt":")" + rfc3339(std::chrono::system_clock::now() + 1h) + R"("})";
    }
    return f.request_json("POST", "/v1/sandboxes/" + id + "/" + what, body);
  };
  const std::string on_v1 = create("600");  // test_processes: pause and renew

  // Block "p" becomes v1_0_processes (ABI 1.0: neither pause nor renew), another provider kind.
  f.write_config(json::object{{"plugin", std::string(SBX_C_PLUGIN_DIR) + "/v1_0_processes.so"},
                              {"allow_kind_change", true}});
  const auto reloaded = f.reload();
  REQUIRE_MESSAGE(reloaded.status == 200, reloaded.body);
  const std::string on_v10 = create("null");  // ABI 1.0 plugins keep no TTL

  // The sandbox made by test_processes can still be paused, resumed and renewed...
  CHECK(op(on_v1, "pause").status == 202);
  CHECK(op(on_v1, "resume").status == 202);
  CHECK(op(on_v1, "renew-expiration").status == 200);
  // ...and the one made by v1_0_processes is refused, naming the sandbox and the extension.
  for (const char* what : {"pause", "resume", "renew-expiration"}) {
    CAPTURE(what);
    const auto r = op(on_v10, what);
    CHECK(r.status == 501);
    const std::string message(r.json().at("message").as_string());
    CHECK(message.find("sandbox " + on_v10) != std::string::npos);
    CHECK(message.find(std::string(what) == "renew-expiration" ? "sbx.renew/1" : "sbx.pause/1") !=
          std::string::npos);
  }
  CHECK(f.request_json("DELETE", "/v1/sandboxes/" + on_v1).status == 204);
  CHECK(f.request_json("DELETE", "/v1/sandboxes/" + on_v10).status == 204);
}

TEST_CASE(
    "SIGTERM during a reload hung in a plugin's init: the server ends, the reload is refused") {
  Fixture f;  // default deadlines: a load may take 120 s
  sbx::testing::Hang hang(f.dir.path);
  f.write_config(json::object{{"plugin", f.plugin.string() + "#test_processes"},
                              {"config", json::object{{"root", f.root.string()},
                                                      {"hang_in", "init"},
                                                      {"hang_fifo", hang.fifo.string()}}}});
  std::optional<Response> answer;
  std::string failure;
  std::thread reloading([&] {
    try {
      answer = f.reload();
    } catch (const std::exception& e) {  // the server may go before it answers
      failure = e.what();
    }
  });
  CHECK(sbx::testing::eventually([&] { return hang.reached(); }));
  const pid_t pid = f.server->pid();
  REQUIRE(::kill(pid, SIGTERM) == 0);
  // The server does not wait for the plugin: it ends (a zombie until reaped below) well before
  // the load's deadline (120 s).
  const auto exited = [pid] {
    const std::string stat = sbx::testing::read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] == 'Z';
  };
  const bool ended = sbx::testing::eventually(exited, 60s);
  if (!ended) ::kill(pid, SIGKILL);  // today's main: it would wait for the plugin forever
  CHECK(ended);
  CHECK(f.server->stop() == 0);
  reloading.join();
  CAPTURE(failure);
  if (answer) {
    CHECK(answer->status == 409);
    CHECK(answer->body.find("the host is stopping") != std::string::npos);
  }
  CHECK(f.log_text().find("the host is stopping") != std::string::npos);
}

TEST_CASE(
    "a reload reads the serve section: a bad one or a start-only change refuses it, the "
    "limits apply to the next request") {
  Fixture f;  // --max-streams 0 given as a flag
  const json::object block{{"plugin", f.plugin.string() + "#test_processes"},
                           {"config", json::object{{"root", f.root.string()}}}};
  const auto refusal = [&](const json::object& serve) {
    f.write_config(block, json::object{{"serve", serve}});
    const auto r = f.reload();
    CHECK(r.status == 409);
    CHECK(r.json().at("code") == "ADMIN::RELOAD_REFUSED");
    return std::string(r.json().at("message").as_string());
  };
  // Issue 35: these were accepted (a start refuses the first; the second was silently ignored).
  CHECK(refusal(json::object{{"bogus", 1}}).find("$.serve.bogus") != std::string::npos);
  CHECK(refusal(json::object{{"max_commands", 0}}).find("$.serve.max_commands") !=
        std::string::npos);
  const std::string threads = refusal(json::object{{"threads", 7}});
  CHECK(threads.find("$.serve.threads changed (2 to 7)") != std::string::npos);
  CHECK(threads.find("restart") != std::string::npos);
  CHECK(refusal(json::object{{"faults", json::array{}}}).find("$.serve.faults changed") !=
        std::string::npos);

  // Live: one command per sandbox and none waiting.
  f.write_config(
      block,
      json::object{{"serve", json::object{{"max_commands", 1}, {"max_queued_commands", 0}}}});
  REQUIRE(f.reload().status == 200);
  const auto created = f.request_json(
      "POST", "/v1/sandboxes",
      R"({"image":{"uri":"x"},"entrypoint":["sh"],"resourceLimits":{},"timeout":600})");
  REQUIRE(created.status == 202);
  const std::string id(created.json().at("id").as_string());
  const std::string command = "/v1/sandboxes/" + id + "/proxy/44772/command";
  CHECK(f.request_json("POST", command, R"({"command":"sleep 60","background":true})").status ==
        200);
  const auto refused =
      f.request_json("POST", command, R"({"command":"sleep 60","background":true})");
  CHECK(refused.status == 429);
  CHECK(refused.body.find("1 commands running and 0 waiting") != std::string::npos);
  // Back to the defaults (no serve section): the cap is 8 again.
  f.write_config(block);
  REQUIRE(f.reload().status == 200);
  CHECK(f.request_json("POST", command, R"({"command":"sleep 60","background":true})").status ==
        200);
  CHECK(f.request_json("DELETE", "/v1/sandboxes/" + id).status == 204);
}
