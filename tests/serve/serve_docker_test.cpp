// `sbx serve` over local_docker on the real daemon: a sandbox created through the server is a
// container with the sbx.serve label (so `sbx reap` finds it), reported Running, and gone after
// DELETE; one still held when the server gets SIGTERM is removed by the stop. The execd API on a
// busybox sandbox: commands (exit code, uid, cwd, timeout), upload, download with Range, info.

#include "support.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

using namespace serve_test;
namespace json = boost::json;

namespace {

// `sbx list --provider docker --label sbx.serve=true --json` with this test's config: the ids.
std::vector<std::string> serve_ids(const fs::path& config) {
  return labelled_ids(config, "docker", "sbx.serve=true");
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// `sbx serve` over local_docker, and one busybox sandbox created through it (sleeping 600 s,
// a 300 s TTL).
struct BusyboxSandbox {
  TempDir dir;
  std::optional<ServeProcess> server;
  std::string id;

  explicit BusyboxSandbox(std::map<std::string, std::string> env = {}) {
    const fs::path config = dir.path / "sbx.json";
    std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker"}}})";
    server.emplace(config, "docker", dir.path / "serve.log", std::vector<std::string>{},
                   std::move(env));
    const auto created =
        request(server->port(), "POST", "/v1/sandboxes",
                R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
                R"("resourceLimits":{},"timeout":300})");
    REQUIRE(created.status == 202);
    id = std::string(created.json().at("id").as_string());
  }
};

}  // namespace

TEST_CASE("create, get and delete a local_docker sandbox through sbx serve") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker"}}})";
  ServeProcess server(config, "docker", dir.path / "serve.log");

  const auto created =
      request(server.port(), "POST", "/v1/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
              R"("resourceLimits":{"cpu":"500m","memory":"256Mi"},"timeout":300,)"
              R"("metadata":{"test":"serve_docker_test"}})");
  REQUIRE(created.status == 202);
  const std::string id(created.json().at("id").as_string());
  CHECK(created.json().at("status").at("state") == "Running");
  CHECK(contains(serve_ids(config), id));

  const auto got = request(server.port(), "GET", "/v1/sandboxes/" + id);
  CHECK(got.status == 200);
  CHECK(got.json().at("status").at("state") == "Running");
  CHECK(got.json().at("image").at("uri") == "sbx-busybox:latest");

  const auto deleted = request(server.port(), "DELETE", "/v1/sandboxes/" + id);
  CHECK(deleted.status == 204);
  CHECK(!contains(serve_ids(config), id));
  CHECK(request(server.port(), "GET", "/v1/sandboxes/" + id).status == 404);

  // One left to the server: SIGTERM removes its container.
  const auto second =
      request(server.port(), "POST", "/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
              R"("resourceLimits":{},"timeout":300})");
  REQUIRE(second.status == 202);
  const std::string second_id(second.json().at("id").as_string());
  CHECK(contains(serve_ids(config), second_id));
  CHECK(server.stop() == 0);
  CHECK(!contains(serve_ids(config), second_id));
}

TEST_CASE(
    "an image that cannot be pulled: the real server's 500 DOCKER::SANDBOX_IMAGE_PULL_FAILED") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker"}}})";
  ServeProcess server(config, "docker", dir.path / "serve.log");
  // Missing from the local registry (the plugin's NOT_FOUND), and a registry that is not there
  // (its CREATE_FAILED): the same answer, from the error's reason (ABI 1.2).
  for (const std::string& image : {"127.0.0.1:5000/sbx/never-pushed-" + server.run_id() + ":latest",
                                   std::string("127.0.0.1:5999/sbx/busybox:latest")}) {
    CAPTURE(image);
    const auto r = request(server.port(), "POST", "/v1/sandboxes",
                           R"({"image":{"uri":")" + image +
                               R"("},"entrypoint":["sleep","600"],"resourceLimits":{},)"
                               R"("extensions":{"imagePullPolicy":"Always"}})");
    CHECK(r.status == 500);
    CHECK(r.json().at("code") == "DOCKER::SANDBOX_IMAGE_PULL_FAILED");
    CHECK(std::string(r.json().at("message").as_string()).find("pulling image " + image) !=
          std::string::npos);
  }
  // Issue 35: a missing image with the policy Never was DOCKER::SANDBOX_START_FAILED; the real
  // server answers as for a failed pull.
  const auto never =
      request(server.port(), "POST", "/v1/sandboxes",
              R"({"image":{"uri":"127.0.0.1:5000/sbx/never-pushed-)" + server.run_id() +
                  R"(:latest"},"entrypoint":["sleep","600"],"resourceLimits":{},)"
                  R"("extensions":{"imagePullPolicy":"Never"}})");
  CHECK(never.status == 500);
  CHECK(never.json().at("code") == "DOCKER::SANDBOX_IMAGE_PULL_FAILED");
  CHECK(std::string(never.json().at("message").as_string()).find("image_pull_policy is Never") !=
        std::string::npos);
  CHECK(labelled_ids(config, "docker", "sbx.run=" + server.run_id()).empty());
  CHECK(server.stop() == 0);
}

TEST_CASE("no client mounts the host: host paths, named volumes and Docker settings refused") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker"}}})";
  ServeProcess server(config, "docker", dir.path / "serve.log");
  const std::string head = R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
                           R"("resourceLimits":{},"timeout":300,)";
  struct Case {
    const char* field;
    int status;
    const char* code;
    const char* names;
  };
  for (const Case& c : {Case{R"("volumes":["/:/host:ro","/etc:/rw"])", 400,
                             "VOLUME::HOST_PATH_NOT_ALLOWED", "create.allowed_host_paths"},
                        Case{R"("volumes":[{"source":"/","target":"/host","read_only":true}])", 400,
                             "VOLUME::HOST_PATH_NOT_ALLOWED", "create.allowed_host_paths"},
                        Case{R"("volumes":["some-volume:/v"])", 403, "SANDBOX::PERMISSION_DENIED",
                             "create.allow_named_volumes"}}) {
    CAPTURE(c.field);
    const auto r = request(server.port(), "POST", "/v1/sandboxes", head + c.field + "}");
    CHECK(r.status == c.status);
    CHECK(r.json().at("code") == c.code);
    CHECK(std::string(r.json().at("message").as_string()).find(c.names) != std::string::npos);
  }
  CHECK(labelled_ids(config, "docker", "sbx.run=" + server.run_id()).empty());
  CHECK(server.stop() == 0);
}

TEST_CASE("the execd API on a local_docker sandbox: commands, upload, download, info") {
  BusyboxSandbox box;
  ServeProcess& server = *box.server;
  const std::string& id = box.id;
  const std::string base = "/sandboxes/" + id + "/proxy/44772";

  auto run = [&](const std::string& body) {
    StreamClient s(server.port(), "POST", base + "/command", body);
    REQUIRE(s.status() == 200);
    return s.rest();
  };
  auto events = run(R"({"command":"echo out; echo err >&2; exit 3"})");
  REQUIRE(events.size() == 5);
  // stdout and stderr come through separate streams: their order between them is not kept.
  std::set<std::pair<std::string, std::string>> lines;
  for (int i : {2, 3})
    lines.emplace(events[i].at("type").as_string(), events[i].at("text").as_string());
  CHECK(lines ==
        std::set<std::pair<std::string, std::string>>{{"stdout", "out"}, {"stderr", "err"}});
  CHECK(events[4].at("error").at("evalue") == "3");
  events = run(R"({"command":"id -u; pwd","cwd":"/tmp","uid":0})");
  REQUIRE(events.size() == 5);
  CHECK(events[2].at("text") == "0");
  CHECK(events[3].at("text") == "/tmp");
  events = run(R"({"command":"echo start; sleep 5; echo end","timeout":1000})");
  REQUIRE(events.size() == 4);
  CHECK(events[2].at("text") == "start");
  CHECK(events[3].at("error").at("evalue") == "-1");

  const std::string boundary = "b0undary";
  std::string big(3 * 1024 * 1024 + 17, 'q');
  big[100] = '\n';
  std::string body;
  for (const auto& [meta, bytes] : std::vector<std::pair<std::string, std::string>>{
           {R"({"path":"/tmp/up/hello.txt","mode":644})", "hello file\n"},
           {R"({"path":"/tmp/up/big.bin","mode":600})", big}}) {
    body += "--" + boundary +
            "\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n" +
            meta + "\r\n--" + boundary +
            "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n" + bytes +
            "\r\n";
  }
  body += "--" + boundary + "--\r\n";
  const auto up = request(server.port(), "POST", base + "/files/upload", body,
                          {{"Content-Type", "multipart/form-data; boundary=" + boundary}});
  CHECK(up.status == 200);
  const auto down = request(server.port(), "GET", base + "/files/download?path=/tmp/up/big.bin");
  CHECK(down.status == 200);
  CHECK(down.body == big);
  const auto part = request(server.port(), "GET", base + "/files/download?path=/tmp/up/hello.txt",
                            std::nullopt, {{"Range", "bytes=6-"}});
  CHECK(part.status == 206);
  CHECK(part.body == "file\n");
  CHECK(part.headers.at("content-range") == "bytes 6-10/11");
  const auto missing = request(server.port(), "GET", base + "/files/download?path=/tmp/nope.txt");
  CHECK(missing.status == 404);
  CHECK(missing.json().at("code") == "FILE_NOT_FOUND");

  const auto info = request(server.port(), "GET",
                            base + "/files/info?path=/tmp/up/hello.txt&path=/tmp/up/big.bin");
  REQUIRE(info.status == 200);
  const auto hello = info.json().at("/tmp/up/hello.txt");
  CHECK(hello.at("type") == "file");
  CHECK(hello.at("size") == 11);
  CHECK(hello.at("mode") == 644);
  CHECK(hello.at("owner") == "0");
  CHECK(info.json().at("/tmp/up/big.bin").at("mode") == 600);
  CHECK(info.json().at("/tmp/up/big.bin").at("size") == static_cast<int64_t>(big.size()));
  CHECK(request(server.port(), "GET", base + "/files/info?path=/tmp/nope").status == 404);

  // A bash session (NeMo Gym's preserve_background_services=True): a service a run starts, its
  // output redirected, outlives the run and the session; `cd` carries to the next run.
  const auto session = request(server.port(), "POST", base + "/session", R"({"cwd":"/tmp"})");
  REQUIRE(session.status == 200);
  const std::string sid(session.json().at("session_id").as_string());
  auto run_in = [&](const std::string& command) {
    StreamClient s(server.port(), "POST", base + "/session/" + sid + "/run",
                   boost::json::serialize(boost::json::object{{"command", command}}));
    REQUIRE(s.status() == 200);
    std::vector<boost::json::object> out;
    for (auto& e : s.rest())
      if (e.at("type") == "stdout" || e.at("type") == "error") out.push_back(std::move(e));
    return out;
  };
  events = run_in(
      "mkdir -p svc && cd svc && (sleep 600 </dev/null >/dev/null 2>&1 &"
      " echo $! > pid) && echo started");
  REQUIRE(events.size() == 1);
  CHECK(events[0].at("text") == "started");
  events = run_in("pwd; kill -0 $(cat pid) && echo running");
  REQUIRE(events.size() == 2);
  CHECK(events[0].at("text") == "/tmp/svc");
  CHECK(events[1].at("text") == "running");
  CHECK(request(server.port(), "DELETE", base + "/session/" + sid).status == 200);
  events = run(R"({"command":"kill -0 $(cat /tmp/svc/pid) && echo still running"})");
  REQUIRE(events.size() == 4);
  CHECK(events[2].at("text") == "still running");

  // A command on a paused sandbox is refused at once, in the stream: an error event whose value
  // is the reason, not an exit code (the SDKs then report no exit code; NeMo Gym maps that to its
  // 125 "sandbox" error). The real server's execd, frozen by the pause, would not answer at all.
  REQUIRE(request(server.port(), "POST", "/v1/sandboxes/" + id + "/pause").status == 202);
  const auto asked = std::chrono::steady_clock::now();
  events = run(R"({"command":"echo never"})");
  CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(5));
  REQUIRE(events.size() == 3);
  CHECK(events[2].at("type") == "error");
  const std::string reason(events[2].at("error").at("evalue").as_string());
  CHECK_MESSAGE(reason.find("paused") != std::string::npos, reason);
  REQUIRE(request(server.port(), "POST", "/v1/sandboxes/" + id + "/resume").status == 202);
  CHECK(run(R"({"command":"echo back"})").at(2).at("text") == "back");
  CHECK(server.stop() == 0);
}

// The file-system routes' scripts under busybox sh and its tools (serve/routes_execd_fs.cpp):
// the same answers as over test_processes (serve_execd_test), with absolute paths in the container.
TEST_CASE("the execd file-system routes on a busybox sandbox: directories, search, mv, replace") {
  BusyboxSandbox box;
  ServeProcess& server = *box.server;
  const std::string& id = box.id;
  const std::string base = "/sandboxes/" + id + "/proxy/44772";
  auto paths_of = [](const Response& r) {
    std::vector<std::string> out;
    const boost::json::value answer = r.json();
    for (const auto& v : answer.as_array())
      out.emplace_back(v.at("path").as_string());
    return out;
  };

  CHECK(request(server.port(), "POST", base + "/directories",
                std::string(R"({"/w/a/b":{"mode":700,"owner":"nobody"},"/w/c":{}})"))
            .status == 200);
  StreamClient setup(server.port(), "POST", base + "/command",
                     R"({"command":"echo x > /w/a/x.txt && echo a.b a.b > /w/a.txt && )"
                     R"(ln -s /w/a /w/link && printf z > '/w/n\nl'"})");
  REQUIRE(setup.status() == 200);
  CHECK(setup.rest().back().at("type") == "execution_complete");

  const auto list = request(server.port(), "GET", base + "/directories/list?path=/w&depth=2");
  REQUIRE(list.status == 200);
  CHECK(paths_of(list) ==
        std::vector<std::string>{"/w/a", "/w/a/b", "/w/a/x.txt", "/w/a.txt", "/w/c", "/w/link"});
  CHECK(list.json().as_array()[1].at("mode") == 700);
  CHECK(list.json().as_array()[1].at("owner") == "65534");  // busybox's nobody
  CHECK(list.json().as_array()[5].at("type") == "symlink");
  CHECK(request(server.port(), "GET", base + "/directories/list?path=/w/link").status == 400);
  const auto search = request(server.port(), "GET", base + "/files/search?path=/w&pattern=*.txt");
  CHECK(paths_of(search) == std::vector<std::string>{"/w/a/x.txt", "/w/a.txt"});
  // {a,b} alternatives through busybox find's \( -name A -o -name B \).
  const auto alts =
      request(server.port(), "GET", base + "/files/search?path=/w&pattern=%7Bx.*,link%7D");
  CHECK(paths_of(alts) == std::vector<std::string>{"/w/a/x.txt", "/w/link"});

  CHECK(request(server.port(), "POST", base + "/files/mv",
                std::string(R"([{"src":"/w/a.txt","dest":"/w/m/a.txt"}])"))
            .status == 200);
  CHECK(request(server.port(), "POST", base + "/files/permissions",
                std::string(R"({"/w/m/a.txt":{"mode":640}})"))
            .status == 200);
  const auto replaced = request(server.port(), "POST", base + "/files/replace?verbose=true",
                                std::string(R"({"/w/m/a.txt":{"old":"a.b","new":"c"}})"));
  CHECK(replaced.body == R"({"/w/m/a.txt":{"replacedCount":2}})");
  CHECK(request(server.port(), "GET", base + "/files/download?path=/w/m/a.txt").body == "c c\n");
  const auto info = request(server.port(), "GET", base + "/files/info?path=/w/m/a.txt");
  CHECK(info.json().at("/w/m/a.txt").at("mode") == 640);
  const auto in_m = request(server.port(), "GET", base + "/directories/list?path=/w/m");
  CHECK(paths_of(in_m) == std::vector<std::string>{"/w/m/a.txt"});  // no temp file left

  CHECK(request(server.port(), "DELETE", base + "/files?path=/w/a").status == 500);
  CHECK(request(server.port(), "DELETE", base + "/files?path=/w/m/a.txt").status == 200);
  CHECK(request(server.port(), "DELETE", base + "/directories?path=/w/a&path=/w/link").status ==
        200);
  const auto after = request(server.port(), "GET", base + "/directories/list?path=/w&depth=3");
  CHECK(paths_of(after) == std::vector<std::string>{"/w/c", "/w/m"});

  const auto metrics = request(server.port(), "GET", base + "/metrics");
  REQUIRE(metrics.status == 200);
  CHECK(metrics.json().at("cpu_count").to_number<double>() >= 1);
  CHECK(metrics.json().at("mem_total_mib").to_number<double>() > 0);
  StreamClient watch(server.port(), "GET", base + "/metrics/watch");
  REQUIRE(watch.status() == 200);
  for (int i = 0; i < 2; ++i) {
    const auto line = watch.next_line();
    REQUIRE(line);
    CHECK(json::parse(*line).at("cpu_count").to_number<double>() >= 1);
  }
  watch.disconnect();
  CHECK(server.stop() == 0);
}

TEST_CASE("a sandbox whose entrypoint died answers 409 SANDBOX_NOT_RUNNING on every route") {
  // Issue 34: after `kill -9 -1` inside (the entrypoint dies, the sandbox ends), a download of an
  // existing file answered 404 FILE_NOT_FOUND. Decision 253.
  BusyboxSandbox box;
  ServeProcess& server = *box.server;
  const std::string& id = box.id;
  const std::string base = "/sandboxes/" + id + "/proxy/44772";
  std::string out;
  // Killing every process ends the container's init, which may take the exec'd shell with it
  // before that shell exits on its own (137): either way the sandbox is gone.
  const int killed =
      run_to_exit({"/usr/bin/env", "docker", "exec", id, "sh", "-c", "kill -9 -1"}, out);
  REQUIRE((killed == 0 || killed == 137));
  // The daemon's word that it ended (with its TTL the container then goes: AutoRemove).
  for (int i = 0; i < 200; ++i) {
    out.clear();
    run_to_exit({"/usr/bin/env", "docker", "inspect", "-f", "{{.State.Running}}", id}, out);
    if (out != "true\n") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The first call to find it gone is a command whose stream had begun: it ends as execd ends a
  // command that could not start (the cause as evalue: the SDKs read no exit code).
  {
    StreamClient s(server.port(), "POST", base + "/command", R"({"command":"echo hi"})");
    REQUIRE(s.status() == 200);
    const auto events = s.rest();
    REQUIRE_FALSE(events.empty());
    const auto& last = events.back();
    CHECK(last.at("type") == "error");
    const std::string evalue(last.at("error").at("evalue").as_string());
    CHECK(evalue.find("sandbox " + id) != std::string::npos);
  }
  // From then on every route answers 409 before anything else.
  auto not_running = [&](const Response& r) {
    CHECK(r.status == 409);
    CHECK(r.json().at("code") == "DOCKER::SANDBOX_NOT_RUNNING");
    CHECK(std::string(r.json().at("message").as_string()).find(id) != std::string::npos);
  };
  not_running(request(server.port(), "GET", base + "/files/download?path=/etc/hostname"));
  not_running(request(server.port(), "GET", base + "/files/info?path=/etc/hostname"));
  not_running(
      request(server.port(), "POST", base + "/command", std::string(R"({"command":"true"})")));
  // Pause answers as the real server does for a sandbox that is not running (its own message).
  const auto paused = request(server.port(), "POST", "/v1/sandboxes/" + id + "/pause");
  CHECK(paused.status == 409);
  CHECK(paused.json().at("code") == "DOCKER::SANDBOX_NOT_RUNNING");
  CHECK(request(server.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK(server.stop() == 0);
}

TEST_CASE("a sandbox the provider reports stopped: its execd routes answer 409 at once") {
  BusyboxSandbox box;
  ServeProcess& server = *box.server;
  const std::string& id = box.id;
  std::string out;
  // Killing every process ends the container's init, which may take the exec'd shell with it
  // before that shell exits on its own (137): either way the sandbox is gone.
  const int killed =
      run_to_exit({"/usr/bin/env", "docker", "exec", id, "sh", "-c", "kill -9 -1"}, out);
  REQUIRE((killed == 0 || killed == 137));
  std::string state;
  for (int i = 0; i < 200 && state != "Terminated"; ++i) {
    const auto got = request(server.port(), "GET", "/v1/sandboxes/" + id);
    REQUIRE(got.status == 200);
    state = std::string(got.json().at("status").at("state").as_string());
    if (state != "Terminated") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(state == "Terminated");
  const auto r = request(server.port(), "POST", "/sandboxes/" + id + "/proxy/44772/command",
                         std::string(R"({"command":"echo never"})"));
  CHECK(r.status == 409);
  CHECK(r.json().at("code") == "DOCKER::SANDBOX_NOT_RUNNING");
  CHECK(request(server.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK(server.stop() == 0);
}

namespace {
// The resident set of process `pid`, in KiB.
long rss_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmRSS:")) return std::stol(line.substr(6));
  }
  return -1;
}
}  // namespace

TEST_CASE("a client that stops reading holds the command, not the server's memory: nothing lost") {
  // Issue 35: a slow client's stream was cut past 4 MiB and its command cancelled. Now the output
  // is held at the provider (sbx.flow/1): the command waits on its pipe while the client does
  // not read, the server keeps about a MiB for it, and every line arrives. (Under ASan a small
  // quarantine: freed blocks it keeps would count as the server's.)
  BusyboxSandbox box(std::map<std::string, std::string>{{"ASAN_OPTIONS", "quarantine_size_mb=4"}});
  ServeProcess& server = *box.server;
  const std::string& id = box.id;
  const std::string base = "/sandboxes/" + id + "/proxy/44772";
  const long before = rss_kib(server.pid());
  // 30,000 lines of 1,006 bytes or so: about 30 MB, more than every buffer on the way holds (the
  // agent's 4 MiB, the sockets', the server's bound).
  const std::string script =
      "awk 'BEGIN{s=sprintf(\\\"%1000s\\\",\\\"\\\");gsub(/ /,\\\"x\\\",s);"
      "for(i=1;i<=30000;i++)print i s}'; touch /tmp/all-written";
  StreamClient s(server.port(), "POST", base + "/command",
                 std::string(R"({"command":")") + script + R"("})", {}, 300);
  REQUIRE(s.status() == 200);
  // The client reads nothing for a while (the point of the test, not a wait for an event).
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::string out;
  CHECK(run_to_exit({"/usr/bin/env", "docker", "exec", id, "test", "-e", "/tmp/all-written"},
                    out) == 1);  // the command waits for its reader
  const long during = rss_kib(server.pid());
  MESSAGE("server RSS before ", before, " KiB, while the client stalls ", during, " KiB");
  CHECK(during - before < 24 * 1024);
  // Every line arrives, in order.
  int64_t expected = 1;
  bool in_order = true;
  std::string last_type;
  while (auto event = s.next_event()) {
    last_type = std::string(event->at("type").as_string());
    if (last_type != "stdout") continue;
    const std::string text(event->at("text").as_string());
    const std::string number = std::to_string(expected);
    in_order = in_order && text.size() == number.size() + 1000 && text.starts_with(number);
    ++expected;
  }
  CHECK(in_order);
  CHECK(expected - 1 == 30000);
  CHECK(last_type == "execution_complete");
  CHECK(run_to_exit({"/usr/bin/env", "docker", "exec", id, "test", "-e", "/tmp/all-written"},
                    out) == 0);
  CHECK(server.stop() == 0);
}

TEST_CASE(
    "a sandbox whose root replaced its shell: the server keeps a bounded part of what the "
    "helper scripts print, stops them, and says so") {
  BusyboxSandbox box;
  ServeProcess& server = *box.server;
  const std::string base = "/sandboxes/" + box.id + "/proxy/44772";
  // busybox's shell runs stat, find and head as its own applets, so the root replaces the shell:
  // a script naming "stat" (the server's /files/info, listings and /metrics read it) prints
  // without end, anything else runs as before. 64 MiB (a listing's bound) takes well under the
  // helper's 60 s.
  StreamClient setup(
      server.port(), "POST", base + "/command",
      R"({"command":"rm /bin/sh && printf '#!/bin/busybox ash\ncase \"$*\" in *stat*) )"
      R"(exec /bin/busybox yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx;; esac\n)"
      R"(exec /bin/busybox ash \"$@\"\n' > /bin/sh && chmod 755 /bin/sh"})");
  REQUIRE(setup.status() == 200);
  REQUIRE(setup.rest().back().at("type") == "execution_complete");

  const auto info = request(server.port(), "GET", base + "/files/info?path=/tmp");
  CHECK(info.status == 500);
  CHECK(info.body.find("printed more than") != std::string::npos);
  const auto list = request(server.port(), "GET", base + "/directories/list?path=/tmp");
  CHECK(list.status == 500);
  CHECK(list.body.find("printed more than") != std::string::npos);
  const auto metrics = request(server.port(), "GET", base + "/metrics");
  CHECK(metrics.status == 500);
  CHECK(metrics.body.find("printed more than") != std::string::npos);
  // The stopped printers are gone: the sandbox runs no `yes`.
  StreamClient ps(server.port(), "POST", base + "/command",
                  R"({"command":"ps -o comm | grep -c '^yes' || true"})");
  REQUIRE(ps.status() == 200);
  std::string count;
  for (const auto& e : ps.rest())
    if (e.at("type") == "stdout") count += std::string(e.at("text").as_string());
  CHECK(count == "0");
  CHECK(server.stop() == 0);
}
