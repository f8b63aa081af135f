#include "support.hpp"

#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

namespace ldtest {
namespace {

namespace http = sbx::sdk::http;

constexpr const char* kHostConfig = R"({
  "providers": {
    "docker": {"plugin": "local_docker", "config": {}},
    "docker_bridge": {"plugin": "local_docker", "config": {"create": {"network": "bridge"}}},
    "docker_disk_warn": {"plugin": "local_docker", "config": {"create": {"disk_limit": "warn"}}},
    "docker_no_limits": {"plugin": "local_docker",
                         "config": {"create": {"apply_resource_limits": false}}},
    "docker_small": {"plugin": "local_docker", "config": {"exec": {"concurrency": 2}}},
    "docker_sh": {"plugin": "local_docker", "config": {"exec": {"shell": "sh"}}},
    "docker_noshell": {"plugin": "local_docker",
                       "config": {"exec": {"shell": "/no/such/shell"}, "probe": {"command": null}}},
    "docker_unreachable": {"plugin": "local_docker",
                           "config": {"socket": "/nonexistent/sbx-test/docker.sock"}},
    "docker_slow_probe": {"plugin": "local_docker",
                          "config": {"probe": {"command": "sleep 3; printf ok",
                                               "expected_stdout": "ok", "timeout_s": 20}}},
    "docker_bad_probe": {"plugin": "local_docker",
                         "config": {"probe": {"command": "echo not ready; exit 1",
                                              "timeout_s": 1}}}
  }
})";

}  // namespace

Docker::Docker()
    : client_(http::ClientOptions{.base_url = "http://docker", .unix_socket = kDockerSocket}) {}

http::Response Docker::send(const std::string& method, const std::string& target) {
  http::Request request;
  request.method = method;
  request.target = target;
  request.timeout = std::chrono::seconds(60);
  return client_.send(std::move(request));
}

std::optional<boost::json::object> Docker::inspect(const std::string& container) {
  const auto response = send("GET", "/containers/" + container + "/json");
  if (response.status == 404) return std::nullopt;
  REQUIRE_MESSAGE(response.status == 200, response.body);
  return boost::json::parse(response.body).as_object();
}

std::vector<std::string> Docker::containers_with_label(const std::string& filter) {
  const boost::json::object filters{{"label", boost::json::array{filter}}};
  const auto response = send(
      "GET", "/containers/json?all=1&filters=" + http::url_encode(boost::json::serialize(filters)));
  REQUIRE_MESSAGE(response.status == 200, response.body);
  std::vector<std::string> names;
  const boost::json::value list = boost::json::parse(response.body);
  for (const auto& item : list.as_array()) {
    const auto& name = item.as_object().at("Names").as_array().at(0).as_string();
    names.emplace_back(std::string_view(name).substr(1));
  }
  return names;
}

void Docker::remove(const std::string& container) {
  const auto response = send("DELETE", "/containers/" + container + "?force=1&v=1");
  REQUIRE_MESSAGE((response.status < 300 || response.status == 404 || response.status == 409),
                  response.body);
}

void Docker::kill(const std::string& container) {
  const auto response = send("POST", "/containers/" + container + "/kill?signal=KILL");
  REQUIRE_MESSAGE(response.status < 300, response.body);
}

bool Docker::image_exists(const std::string& image) {
  return send("GET", "/images/" + image + "/json").status == 200;
}

void Docker::untag_image(const std::string& image) {
  const auto response = send("DELETE", "/images/" + image + "?noprune=1");
  REQUIRE_MESSAGE((response.status < 300 || response.status == 404), response.body);
}

bool Docker::wait_gone(const std::string& container, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!exists(container)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return !exists(container);
}

bool Docker::storage_supports_size_limit() {
  const auto response = send("GET", "/info");
  REQUIRE(response.status == 200);
  const auto info = boost::json::parse(response.body).as_object();
  const std::string driver(info.at("Driver").as_string());
  if (driver != "overlay2") return driver == "devicemapper" || driver == "btrfs" || driver == "zfs";
  for (const auto& pair : info.at("DriverStatus").as_array()) {
    const auto& kv = pair.as_array();
    if (kv.at(0).as_string() == "Backing Filesystem" && kv.at(1).as_string() == "xfs") return true;
  }
  return false;
}

Docker& docker() {
  static Docker instance;
  return instance;
}

sbx::Host& host() {
  static sbx::Host instance = [] {
    sbx::Host::Options options;
    options.config = sbx::Config::parse(kHostConfig, "local_docker tests");
    options.labels[kSuiteLabel] = kSuiteValue;
    return sbx::Host(std::move(options));
  }();
  return instance;
}

sbx::Provider provider(const std::string& name) {
  return host().provider(name);
}

sbx::SandboxSpec spec(const std::string& image) {
  sbx::SandboxSpec s;
  s.image = image;
  s.ttl_s = 900;
  s.metadata["sbx.test.owner"] = "local_docker-tests";
  return s;
}

std::string unique() {
  static std::mt19937_64 engine{std::random_device{}()};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(engine()));
  return buffer;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<std::string> leftovers(const std::string& key, const std::string& value) {
  return docker().containers_with_label(key + "=" + value);
}

}  // namespace ldtest
