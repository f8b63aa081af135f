// `sbx serve` lifecycle routes over local_docker on the real daemon: pause and resume freeze the
// container (docker reports it paused), renew moves the expiry (in the answer, in GET and in the
// container's expiry file that local_docker's keep-alive and reaper read), list shows the
// sandbox, and with --state-dir --keep-on-stop a restarted server serves the same id (get, pause,
// delete), which the daemon confirms.

#include "support.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <ctime>
#include <fstream>

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

}  // namespace

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
  REQUIRE(run_to_exit({"/usr/bin/env", "docker", "exec", id, "cat", "/.sbx/expires_at"}, file) ==
          0);
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
