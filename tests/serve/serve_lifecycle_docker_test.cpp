// `sbx serve` lifecycle routes over local_docker on the real daemon: pause and resume freeze the
// container (docker reports it paused), renew moves the expiry (in the answer, in GET and in the
// container's expiry file that local_docker's keep-alive and reaper read), list shows the
// sandbox, and with --state-dir --keep-on-stop a restarted server serves the same id (get, pause,
// delete), which the daemon confirms.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>

using namespace serve_test;
namespace json = boost::json;

namespace {

// `docker inspect -f '{{.State.Status}}' ID`: "running", "paused", or "" when it does not exist.
std::string docker_state(const std::string& id) {
  std::string output;
  if (run_to_exit({"/usr/bin/env", "docker", "inspect", "-f", "{{.State.Status}}", id}, output) !=
      0) {
    return "";
  }
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r'))
    output.pop_back();
  return output;
}

// The ids of the containers, running or not, carrying `label` (k=v).
std::vector<std::string> containers_labelled(const std::string& label) {
  std::string output;
  REQUIRE(run_to_exit({"/usr/bin/env", "docker", "ps", "-a", "-q", "--no-trunc", "--filter",
                       "label=" + label},
                      output) == 0);
  std::vector<std::string> ids;
  std::size_t start = 0;
  while (start < output.size()) {
    const std::size_t end = output.find('\n', start);
    const std::string line = output.substr(start, end - start);
    if (!line.empty()) ids.push_back(line);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return ids;
}

// The files of the state directory that are not sandbox records: create records and temporaries.
std::vector<std::string> stray_state_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    if (name != ".lock" &&
        (name.rfind(".create-", 0) == 0 || name.find(".tmp") != std::string::npos))
      out.push_back(name);
  }
  return out;
}

}  // namespace

TEST_CASE("local_docker: a server killed while a create is in flight; the next one closes it") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  const fs::path state = dir.path / "state";
  // The readiness probe never ends within the test: the create is in flight, its container made,
  // until the server is killed.
  std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker", "config": )"
                           R"({"probe": {"command": "sleep 3600", "timeout_s": 7200}}}}})";
  std::optional<ServeProcess> server;
  server.emplace(config, "docker", dir.path / "serve.log",
                 std::vector<std::string>{"--state-dir", state.string()});
  const std::string run = "sbx.run=" + server->run_id();
  const int port = server->port();
  std::thread client([port] {
    try {  // no timeout: the sandbox lives forever unless someone closes it
      request(port, "POST", "/v1/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","3600"],)"
              R"("resourceLimits":{},"metadata":{"test":"serve_lifecycle_docker_test"}})");
    } catch (const std::exception&) {  // the server was killed: the connection is cut
    }
  });
  // Waits for the event: the container exists (the create's record was written before it).
  const bool made = sbx::testing::eventually([&] { return !containers_labelled(run).empty(); },
                                             std::chrono::seconds(120));
  CHECK(made);
  const std::vector<std::string> before = containers_labelled(run);
  CHECK(before.size() == 1);
  CHECK(stray_state_files(state).size() == 1);  // the create's record
  ::kill(server->pid(), SIGKILL);
  client.join();
  server.reset();
  REQUIRE(containers_labelled(run) == before);  // left by the kill, with no sandbox record

  // The next server on the same state directory reconciles before it listens.
  server.emplace(config, "docker", dir.path / "serve2.log",
                 std::vector<std::string>{"--state-dir", state.string()});
  CHECK(containers_labelled(run).empty());
  CHECK(stray_state_files(state).empty());
  CHECK(request(server->port(), "GET", "/v1/sandboxes").json().at("items").as_array().empty());
  CHECK(server->stop() == 0);
  std::string ignored;  // whatever a failed check left behind
  run_to_exit(
      {SBX_CLI, "reap", "--config", config.string(), "--provider", "docker", "--label", run},
      ignored);
}

TEST_CASE("local_docker: pause, renew, list, and a restarted server serving the same id") {
  TempDir dir;
  const fs::path config = dir.path / "sbx.json";
  const std::string state = (dir.path / "state").string();
  std::ofstream(config) << R"({"providers": {"docker": {"plugin": "local_docker"}}})";
  std::optional<ServeProcess> server;
  server.emplace(config, "docker", dir.path / "serve.log",
                 std::vector<std::string>{"--state-dir", state, "--keep-on-stop"});

  const auto created =
      request(server->port(), "POST", "/v1/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
              R"("resourceLimits":{"memory":"128Mi"},"timeout":300,)"
              R"("metadata":{"test":"serve_lifecycle_docker_test"}})");
  REQUIRE_MESSAGE(created.status == 202, created.body);
  const std::string id(created.json().at("id").as_string());
  CHECK(docker_state(id) == "running");

  REQUIRE(request(server->port(), "POST", "/v1/sandboxes/" + id + "/pause").status == 202);
  CHECK(docker_state(id) == "paused");
  CHECK(request(server->port(), "GET", "/v1/sandboxes/" + id).json().at("status").at("state") ==
        "Paused");
  CHECK(request(server->port(), "POST", "/v1/sandboxes/" + id + "/pause").status == 409);
  REQUIRE(request(server->port(), "POST", "/v1/sandboxes/" + id + "/resume").status == 202);
  CHECK(docker_state(id) == "running");

  // local_docker offers sbx.renew/1 (decisions 126-129): whole seconds, in the container's file.
  const auto later = std::chrono::system_clock::now() + std::chrono::minutes(30);
  const auto later_s = std::chrono::duration_cast<std::chrono::seconds>(later.time_since_epoch());
  const auto renewed = request(server->port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration",
                               R"({"expiresAt":")" + rfc3339(later) + R"("})");
  REQUIRE_MESSAGE(renewed.status == 200, renewed.body);
  const json::value new_expiry = renewed.json().at("expiresAt");
  CHECK(new_expiry == json::value(rfc3339(later)));
  CHECK(new_expiry != created.json().at("expiresAt"));
  CHECK(request(server->port(), "GET", "/v1/sandboxes/" + id).json().at("expiresAt") == new_expiry);
  std::string file;
  REQUIRE(run_to_exit({"/usr/bin/env", "docker", "exec", id, "cat", "/.sbx/ttl/expires_at"},
                      file) == 0);
  CHECK(std::stoll(file) == later_s.count());

  const auto listed =
      request(server->port(), "GET", "/v1/sandboxes?metadata=test%3Dserve_lifecycle_docker_test");
  REQUIRE(listed.status == 200);
  REQUIRE(listed.json().at("items").as_array().size() == 1);
  CHECK(listed.json().at("items").at(0).at("id") == json::value(id));
  const auto before = request(server->port(), "GET", "/v1/sandboxes/" + id);

  // Stopped with --keep-on-stop: the container stays; a new server finds it again.
  CHECK(server->stop() == 0);
  CHECK(docker_state(id) == "running");
  server.emplace(config, "docker", dir.path / "serve2.log",
                 std::vector<std::string>{"--state-dir", state});
  const auto after = request(server->port(), "GET", "/v1/sandboxes/" + id);
  REQUIRE(after.status == 200);
  CHECK(after.json() == before.json());  // image, metadata, times: from the state directory
  REQUIRE(request(server->port(), "POST", "/v1/sandboxes/" + id + "/pause").status == 202);
  CHECK(docker_state(id) == "paused");
  CHECK(request(server->port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK(docker_state(id).empty());
  CHECK(request(server->port(), "GET", "/v1/sandboxes/" + id).status == 404);
  CHECK(server->stop() == 0);
}
