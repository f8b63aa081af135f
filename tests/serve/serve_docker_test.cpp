// `sbx serve` over local_docker on the real daemon: a sandbox created through the server is a
// container with the sbx.serve label (so `sbx reap` finds it), reported Running, and gone after
// DELETE; one still held when the server gets SIGTERM is removed by the stop.

#include "support.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>

using namespace serve_test;
namespace json = boost::json;

namespace {

// `sbx list --provider docker --label sbx.serve=true --json` with this test's config: the ids.
std::vector<std::string> labelled_ids(const fs::path& config) {
  std::string output;
  const int status = run_to_exit({SBX_CLI, "list", "--config", config.string(), "--provider",
                                  "docker", "--label", "sbx.serve=true", "--json"},
                                 output);
  REQUIRE(status == 0);
  std::vector<std::string> ids;
  const json::value list = json::parse(output);
  for (const auto& s : list.as_array())
    ids.emplace_back(s.at("id").as_string());
  return ids;
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

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
  CHECK(contains(labelled_ids(config), id));

  const auto got = request(server.port(), "GET", "/v1/sandboxes/" + id);
  CHECK(got.status == 200);
  CHECK(got.json().at("status").at("state") == "Running");
  CHECK(got.json().at("image").at("uri") == "sbx-busybox:latest");

  const auto deleted = request(server.port(), "DELETE", "/v1/sandboxes/" + id);
  CHECK(deleted.status == 204);
  CHECK(!contains(labelled_ids(config), id));
  CHECK(request(server.port(), "GET", "/v1/sandboxes/" + id).status == 404);

  // One left to the server: SIGTERM removes its container.
  const auto second =
      request(server.port(), "POST", "/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
              R"("resourceLimits":{},"timeout":300})");
  REQUIRE(second.status == 202);
  const std::string second_id(second.json().at("id").as_string());
  CHECK(contains(labelled_ids(config), second_id));
  CHECK(server.stop() == 0);
  CHECK(!contains(labelled_ids(config), second_id));
}
