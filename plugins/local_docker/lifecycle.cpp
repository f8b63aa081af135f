#include "lifecycle.hpp"

#include "agent.hpp"
#include "archive.hpp"
#include "containers.hpp"

#include <sbx/abi/ext/connect.h>

#include <boost/json.hpp>

#include <charconv>

namespace sbx::local_docker {
namespace {

namespace json = boost::json;

constexpr std::string_view kProviderId = "local_docker";

std::string lower(std::string text) {
  for (char& c : text)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

const json::object* object_at(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_object() ? &v->get_object() : nullptr;
}

std::string string_at(const json::object* o, std::string_view key) {
  const auto* v = o ? o->if_contains(key) : nullptr;
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// POST /containers/{name}/{action}: 204 done; 409 with `already` in the message is the state asked
// for (success); 404 gone.
void change_state(DockerApi& api, const std::string& container, const std::string& action,
                  std::string_view already, const std::string& what,
                  const sdk::CancelToken& cancel) {
  http::Request request;
  request.method = "POST";
  request.target = "/containers/" + container + "/" + action;
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status < 300) return;
  // Docker answers "already paused" with 409, and "is not paused" with 409 or 500 depending on its
  // version: the message tells.
  const std::string message = lower(docker_message(response.body));
  if (message.find(already) != std::string::npos) return;
  if (response.status == 404) {
    throw sdk::Error::sandbox_gone(what + " sandbox " + container + ": it no longer exists");
  }
  if (response.status == 409 && message.find("is not running") != std::string::npos) {
    throw sdk::Error::sandbox_gone(what + " sandbox " + container + ": it no longer runs");
  }
  throw api_error(response.status, response.body, what + " sandbox " + container);
}

std::vector<uint16_t> ports_of(const std::string& text) {
  std::vector<uint16_t> ports;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    uint16_t port = 0;
    const auto [ptr, ec] = std::from_chars(text.data() + start, text.data() + end, port);
    if (ec == std::errc() && ptr == text.data() + end && port > 0) ports.push_back(port);
    start = end + 1;
  }
  return ports;
}

}  // namespace

void pause_container(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel) {
  change_state(api, container, "pause", "already paused", "pausing", cancel);
}

void resume_container(DockerApi& api, const std::string& container,
                      const sdk::CancelToken& cancel) {
  change_state(api, container, "unpause", "is not paused", "resuming", cancel);
}

void require_running(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel) {
  http::Request request;
  request.target = "/containers/" + container + "/json";
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status == 404) {
    throw sdk::Error::sandbox_gone("sandbox " + container + " no longer exists");
  }
  if (response.status != 200) {
    throw api_error(response.status, response.body, "inspecting container " + container);
  }
  const json::object inspect = parse_body(response.body, "inspecting container " + container);
  const std::string state = string_at(object_at(inspect, "State"), "Status");
  if (state == "paused") {
    throw sdk::Error::failed_precondition("sandbox " + container + " is paused; resume it first");
  }
  if (state != "running") {
    throw sdk::Error::sandbox_gone("sandbox " + container + " no longer runs (its container is " +
                                   (state.empty() ? std::string("in no known state") : state) +
                                   ")");
  }
}

std::string make_descriptor(const std::string& name, const std::string& container_id) {
  return json::serialize(json::object{{"format", SBX_DESCRIPTOR_FORMAT},
                                      {"provider", kProviderId},
                                      {"sandbox_id", name},
                                      {"container_id", container_id}});
}

FoundSandbox find_sandbox(DockerApi& api, const std::string& descriptor,
                          const sdk::CancelToken& cancel) {
  boost::system::error_code ec;
  const json::value parsed = json::parse(descriptor, ec);
  if (ec || !parsed.is_object()) {
    throw sdk::Error::invalid_argument("the descriptor is not a JSON object");
  }
  const json::object& d = parsed.get_object();
  if (const auto* format = d.if_contains("format");
      format && (!format->is_string() || format->get_string() != SBX_DESCRIPTOR_FORMAT)) {
    throw sdk::Error::invalid_argument("the descriptor's format is not " SBX_DESCRIPTOR_FORMAT);
  }
  if (const auto* provider = d.if_contains("provider");
      provider && (!provider->is_string() || provider->get_string() != kProviderId)) {
    throw sdk::Error::invalid_argument("the descriptor is not of provider local_docker");
  }
  FoundSandbox found;
  found.name = string_at(&d, "sandbox_id");
  const std::string expected_id = string_at(&d, "container_id");
  // A name is what create made: the prefix and hex digits, nothing that could escape a URL path.
  if (found.name.empty() || found.name.find_first_not_of(
                                "abcdefghijklmnopqrstuvwxyz0123456789_.-") != std::string::npos) {
    throw sdk::Error::invalid_argument("the descriptor's sandbox_id '" + found.name +
                                       "' is not a local_docker sandbox name");
  }

  http::Request request;
  request.target = "/containers/" + found.name + "/json";
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status == 404) {
    throw sdk::Error::sandbox_gone("sandbox " + found.name + " no longer exists");
  }
  if (response.status != 200) {
    throw api_error(response.status, response.body, "inspecting container " + found.name);
  }
  const json::object inspect = parse_body(response.body, "inspecting container " + found.name);
  const json::object* config = object_at(inspect, "Config");
  const json::object* labels = config ? object_at(*config, "Labels") : nullptr;
  if (string_at(labels, kSandboxLabel) != "1") {
    throw sdk::Error::invalid_argument("container " + found.name +
                                       " is not a local_docker sandbox (no sbx.sandbox label)");
  }
  found.container_id = string_at(&inspect, "Id");
  if (!expected_id.empty() && expected_id != found.container_id) {
    throw sdk::Error::sandbox_gone("sandbox " + found.name +
                                   " no longer exists (another container has its name now)");
  }
  const std::string state = string_at(object_at(inspect, "State"), "Status");
  if (state != "running" && state != "paused") {
    throw sdk::Error::sandbox_gone("sandbox " + found.name + " has ended (its container is " +
                                   (state.empty() ? std::string("in no known state") : state) +
                                   ")");
  }
  if (const std::string workdir = string_at(labels, kWorkdirLabel); !workdir.empty()) {
    found.workdir = workdir;
  }
  found.ports = ports_of(string_at(labels, kPortsLabel));
  found.agent_run_dir = string_at(labels, kAgentLabel);
  found.agent_user = string_at(labels, kAgentUserLabel);
  found.paused = state == "paused";
  if (const std::string expiry = string_at(labels, kExpiresAtLabel); !expiry.empty()) {
    int64_t value = 0;
    const auto [ptr, err] = std::from_chars(expiry.data(), expiry.data() + expiry.size(), value);
    if (err == std::errc() && ptr == expiry.data() + expiry.size()) found.expires_at = value;
  }
  // Renewable through the host's expiry file (read by the provider: host_dirs.hpp).
  found.has_expiry_file =
      found.expires_at && string_at(labels, expiry::kFileLabel) == expiry::kPath;
  return found;
}

}  // namespace sbx::local_docker
