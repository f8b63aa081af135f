// opensandbox's pure parts: config validation and its messages, provider_options (volumes,
// platform), metadata sanitising and resource formatting (the reference's examples), the pull
// policy extensions, TTL rounding, the state mapping, the event stream parser and the retry
// classification of create failures.
#include "config.hpp"
#include "diagnosis.hpp"
#include "execd.hpp"
#include "lifecycle.hpp"
#include "provider.hpp"

#include <doctest/doctest.h>

#include <sbx/base/shell_quote.hpp>
#include <boost/json.hpp>

#include <string>

namespace os = sbx::opensandbox;
namespace json = boost::json;

namespace {

json::object obj(std::string_view text) {
  return json::parse(text).as_object();
}

os::Config parse(std::string_view text, const char* domain = nullptr, const char* key = nullptr) {
  return os::Config::parse(obj(text), domain, key);
}

// The message of what `fn` throws ("" when it does not throw).
template <class F>
std::string message_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: the seed's defaults") {
  const auto c = parse("{}");
  CHECK(c.connection.domain == "localhost:8080");
  CHECK(c.connection.protocol == "http");
  CHECK(!c.connection.api_key);
  CHECK(!c.connection.use_server_proxy);
  CHECK(c.connection.keepalive_expiry_s == 3.0);
  CHECK(c.connection.max_connections == 100);
  CHECK(c.connection.connect_retries == 2);
  CHECK(c.create.retries == 2);
  CHECK(c.create.retry_delay_s == 5.0);
  CHECK(c.create.retry_max_delay_s == 60.0);
  CHECK(c.create.image_pull_policy == os::PullPolicy::if_not_present);
  CHECK(!c.create.skip_health_check);
  CHECK(c.create.connect_attempt_timeout_s == 30.0);
  CHECK(c.create.connect_poll_s == 2.0);
  CHECK(c.probe.command == std::optional<std::string>("printf nemo-gym-sandbox-ready"));
  CHECK(c.probe.expected_stdout == std::optional<std::string>("nemo-gym-sandbox-ready"));
  CHECK(c.probe.timeout_s == 30);
  CHECK(c.probe.stable_count == 1);
  CHECK(c.operations.retries == 3);
  CHECK(c.operations.retry_delay_s == 1.0);
  CHECK(c.operations.retry_max_delay_s == 15.0);
  CHECK(c.operations.command_retries == 0);
  CHECK(c.operations.close_timeout_s == 30.0);
  CHECK(c.attribution.enabled);
  CHECK(c.attribution.key_prefix == "nemo-gym.nvidia.com/");
}

TEST_CASE("config: the seed's shipped YAML loads as it is") {
  const auto c = parse(R"({
    "connection": {"domain": "opensandbox-server.example", "api_key": "k", "protocol": "http",
                   "request_timeout_s": 300, "use_server_proxy": true, "keepalive_expiry_s": 3.0,
                   "max_keepalive_connections": 20, "max_connections": null,
                   "connect_retries": 2, "transport_backend": "aiohttp"},
    "create": {"request_timeout_s": 1200, "timeout_s": 1500, "retries": 10, "retry_delay_s": 5.0,
               "retry_max_delay_s": 90.0, "skip_health_check": false,
               "connect_attempt_timeout_s": 1500},
    "probe": {"timeout_s": 60, "deadline_s": 180, "stable_count": 2, "stable_delay_s": 1.0},
    "operations": {"retries": 5, "retry_delay_s": 1.0, "retry_max_delay_s": 45.0,
                   "command_retries": 0, "close_timeout_s": 30, "background_exec": true,
                   "background_poll_initial_s": 0.5, "background_poll_interval_s": 30.0},
    "attribution": {"enabled": true, "key_prefix": "nemo-gym.nvidia.com/"}})");
  CHECK(c.connection.max_keepalive_connections == 20);
  CHECK(c.connection.transport_backend == std::optional<std::string>("aiohttp"));
  CHECK(c.connection.max_connections == 100);  // null: the default cap
  CHECK(c.operations.background_exec);
  CHECK(c.operations.background_poll_initial_s == 0.5);
  CHECK(c.operations.background_poll_interval_s == 30.0);
  CHECK(c.operations.status_poll_timeout_s == std::optional<double>(10.0));
  CHECK(c.create.retries == 10);
  CHECK(c.probe.stable_count == 2);
  const auto options = os::client_options(c.connection, "http://x");
  CHECK(options.max_idle_connections == 20);
  CHECK(options.keepalive_expiry == std::chrono::milliseconds(3000));
  const auto none = parse(R"({"connection": {"max_keepalive_connections": 0}})");
  CHECK(os::client_options(none.connection, "http://x").keepalive_expiry.count() == 0);
}

TEST_CASE("config: OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY are fallbacks") {
  auto c = parse("{}", "os.example:9000/", "k1");
  CHECK(c.connection.domain == "os.example:9000");  // trailing '/' stripped
  CHECK(c.connection.api_key == std::optional<std::string>("k1"));
  CHECK(c.connection.base_url() == "http://os.example:9000");
  c = parse(R"({"connection": {"domain": "https://h", "api_key": "k2"}})", "x", "k1");
  CHECK(c.connection.domain == "https://h");
  CHECK(c.connection.api_key == std::optional<std::string>("k2"));
  CHECK(c.connection.base_url() == "https://h");
  CHECK(c.connection.scheme() == "https");
  // An explicit null api_key means none, whatever the environment says.
  c = parse(R"({"connection": {"api_key": null}})", nullptr, "k1");
  CHECK(!c.connection.api_key);
}

TEST_CASE("config: validation messages name the JSON path") {
  CHECK(message_of([] { parse(R"({"create": {"retries": -1}})"); }) ==
        "$.create.retries: retries must be >= 0");
  CHECK(message_of([] { parse(R"({"create": {"retry_delay_s": -0.5}})"); }) ==
        "$.create.retry_delay_s: retry_delay_s must be >= 0");
  CHECK(message_of([] { parse(R"({"create": {"timeout_s": 0}})"); }) ==
        "$.create.timeout_s: timeout_s must be > 0");
  CHECK(message_of([] { parse(R"({"create": {"connect_poll_s": 0}})"); }) ==
        "$.create.connect_poll_s: connect_poll_s must be > 0");
  CHECK(message_of([] { parse(R"({"create": {"image_pull_policy": "Sometimes"}})"); }) ==
        "$.create.image_pull_policy: image_pull_policy must be one of: Always, IfNotPresent, "
        "Never");
  CHECK(message_of([] { parse(R"({"operations": {"command_retries": -2}})"); }) ==
        "$.operations.command_retries: command_retries must be >= 0");
  CHECK(message_of([] { parse(R"({"operations": {"close_timeout_s": 0}})"); }) ==
        "$.operations.close_timeout_s: close_timeout_s must be > 0");
  CHECK(message_of([] { parse(R"({"connection": {"protocol": "ftp"}})"); }) ==
        "$.connection.protocol: must be 'http' or 'https', got 'ftp'");
  CHECK(message_of([] {
          parse(R"({"probe": {"stable_count": 0}})");
        }).find("$.probe.stable_count") != std::string::npos);
  // Unknown keys are refused with their path, at every level.
  CHECK(message_of([] { parse(R"({"connection": {"bogus": 1}})"); }).find("$.connection.bogus") !=
        std::string::npos);
  CHECK(message_of([] { parse(R"({"nope": {}})"); }).find("$.nope") != std::string::npos);
  CHECK(message_of([] { parse(R"({"create": {"retires": 3}})"); }).find("$.create.retires") !=
        std::string::npos);
  // null switches off what may be switched off.
  const auto c = parse(R"({"create": {"image_pull_policy": null},
                           "connection": {"keepalive_expiry_s": null},
                           "probe": {"command": null}})");
  CHECK(!c.create.image_pull_policy);
  CHECK(!c.connection.keepalive_expiry_s);
  CHECK(!c.probe.command);
}

TEST_CASE("attribution key prefix: normalised and validated as the seed does") {
  CHECK(os::normalize_key_prefix("acme.example.com", "$.p") == "acme.example.com/");
  CHECK(os::normalize_key_prefix(" nemo-gym.nvidia.com/ ", "$.p") == "nemo-gym.nvidia.com/");
  CHECK(os::normalize_key_prefix("", "$.p").empty());
  CHECK(os::normalize_key_prefix("   ", "$.p").empty());
  for (const char* bad : {"Not_A_Valid_Prefix/", "-bad.example.com/", "bad..example.com/"}) {
    CAPTURE(bad);
    CHECK(message_of([&] {
            os::normalize_key_prefix(bad, "$.attribution.key_prefix");
          }).starts_with("$.attribution.key_prefix: attribution key_prefix"));
  }
  const auto c = parse(R"({"attribution": {"key_prefix": "acme.example.com"}})");
  CHECK(c.attribution.key_prefix == "acme.example.com/");
}

TEST_CASE("metadata values are sanitised as the reference's examples") {
  CHECK(os::sanitize_metadata_value("swebench::django__django-10880") ==
        "swebench_django__django-10880");
  CHECK(os::sanitize_metadata_value("bad:" + std::string(80, 'x') + ":") ==
        "bad_" + std::string(59, 'x'));
  CHECK(os::sanitize_metadata_value("gym team") == "gym_team");
  CHECK(os::sanitize_metadata_value("") == "metadata");
  CHECK(os::sanitize_metadata_value("...___---") == "metadata");
  CHECK(os::sanitize_metadata_value("ünï") == "n");  // non-ASCII bytes are one run each side
  CHECK(os::sanitize_metadata_value("a  b\t\nc") == "a_b_c");
}

TEST_CASE("resource quantities and the resource map as the seed formats them") {
  CHECK(os::resource_quantity(2.0) == "2");
  CHECK(os::resource_quantity(2) == "2");
  CHECK(os::resource_quantity(0.5) == "0.5");
  CHECK(os::resource_quantity(0.1) == "0.1");
  CHECK(os::resource_quantity(1e-05) == "1e-05");
  CHECK(os::resource_quantity(1.5e-7) == "1.5e-07");
  CHECK(os::resource_quantity(0.0001) == "0.0001");
  CHECK(os::resource_quantity(123.456) == "123.456");
  CHECK(os::resource_quantity(1e16) == "10000000000000000");  // integral: str(int(v))
  sbx::sdk::Resources r;
  r.cpu = 2;
  r.memory_mib = 8192;
  r.disk_gib = 20;
  r.gpu = 1;
  r.gpu_type = "H100";
  CHECK(json::serialize(os::resource_map(r)) ==
        R"({"cpu":"2","memory":"8192Mi","ephemeral-storage":"20Gi","gpu":"1","gpu_type":"H100"})");
  CHECK(os::resource_map({}).empty());
}

TEST_CASE("image pull policy: both extension keys, user values kept") {
  auto ext = os::resolve_extensions({}, os::PullPolicy::if_not_present);
  CHECK(ext == os::KeyValues{{"imagePullPolicy", "IfNotPresent"},
                             {"opensandbox.extensions.image-pull-policy", "IfNotPresent"}});
  ext = os::resolve_extensions(
      {{"poolRef", "p"}, {"opensandbox.extensions.image-pull-policy", "Never"}},
      os::PullPolicy::always);
  CHECK(ext == os::KeyValues{{"poolRef", "p"},
                             {"imagePullPolicy", "Never"},
                             {"opensandbox.extensions.image-pull-policy", "Never"}});
  CHECK(os::resolve_extensions({{"imagePullPolicy", "bogus"}}, std::nullopt) ==
        os::KeyValues{{"imagePullPolicy", "bogus"}});  // no config policy: untouched
  // The message names the extensions key and the value given (the seed's text in the middle).
  CHECK(message_of([] {
          os::resolve_extensions({{"imagePullPolicy", "bogus"}}, os::PullPolicy::always);
        }) ==
        "provider_options.extensions.imagePullPolicy: image_pull_policy must be one of: Always, "
        "IfNotPresent, Never; got 'bogus'");
  CHECK(message_of([] {
          os::resolve_extensions({{"opensandbox.extensions.image-pull-policy", "always"}},
                                 os::PullPolicy::never);
        }) ==
        "provider_options.extensions.opensandbox.extensions.image-pull-policy: image_pull_policy "
        "must be one of: Always, IfNotPresent, Never; got 'always'");
}

TEST_CASE("provider_options: unknown keys, platform and volumes") {
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"zeta": 1, "alpha": 2})")); }) ==
        "Unknown OpenSandbox provider option(s): alpha, zeta. Supported: extensions, image_auth, "
        "network_policy, platform, resource_requests, skip_health_check, snapshot_id, volumes");
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"skip_health_check": "true"})")); }) ==
        "provider_options.skip_health_check must be a boolean, got string");
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"platform": "linux"})")); }) ==
        "provider_options.platform must be a mapping, got string");
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"platform": {"os": "linux"}})")); }) ==
        "provider_options.platform.arch is required");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"platform": {"os": "mac", "arch": "amd64"}})"));
        }) == "provider_options.platform.os must be 'linux' or 'windows', got 'mac'");
  const auto ok = os::SandboxOptions::parse(obj(R"({"platform": {"os": "linux", "arch": "arm64"},
      "volumes": [{"name": "data", "mountPath": "/data", "readOnly": true, "host": {"path": "/srv"}}],
      "extensions": {"poolRef": "p", "n": 3}})"));
  CHECK(json::serialize(*ok.platform) == R"({"os":"linux","arch":"arm64"})");
  REQUIRE(ok.volumes.size() == 1);
  CHECK(json::serialize(ok.volumes[0]) ==
        R"({"name":"data","mountPath":"/data","readOnly":true,"host":{"path":"/srv"}})");
  CHECK(ok.extensions == os::KeyValues{{"n", "3"}, {"poolRef", "p"}});
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"volumes": {"name": "x"}})")); }) ==
        "provider_options.volumes must be a list of mappings, got object");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"volumes": [{"name": "Bad_Name", "mountPath": "/d",
                                                         "host": {"path": "/srv"}}]})"));
        }).starts_with("provider_options.volumes[0].name 'Bad_Name' must be a DNS label"));
  CHECK(message_of([] {
          os::SandboxOptions::parse(
              obj(R"({"volumes": [{"name": "d", "mountPath": "rel", "host": {"path": "/srv"}}]})"));
        }) == "provider_options.volumes[0].mountPath must be an absolute path, got 'rel'");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"volumes": [{"name": "d", "mountPath": "/d",
              "host": {"path": "/srv"}, "pvc": {"claimName": "c"}}]})"));
        }) == "provider_options.volumes[0] must have exactly one of host, pvc or ossfs, got 2");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"volumes": [{"name": "d", "mountPath": "/d"}]})"));
        }) == "provider_options.volumes[0] must have exactly one of host, pvc or ossfs, got 0");
}

TEST_CASE("create request: image, entrypoint, resources, TTL, metadata, extensions") {
  auto config = parse("{}");
  sbx::sdk::Spec spec;
  spec.image = "busybox";
  spec.ttl = std::chrono::milliseconds(3'000);
  spec.env = {{"A", "1"}};
  spec.metadata = {{"case", "swebench::x"}, {"team", "spec-wins"}};
  spec.labels = {{"sbx.run", "r1"}};
  spec.resources.cpu = 0.5;
  spec.resources.memory_mib = 512;
  const auto body = os::create_request(config, spec, {{"team", "attr"}, {"other", "o"}});
  CHECK(json::serialize(body) ==
        R"({"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],)"
        R"("resourceLimits":{"cpu":"0.5","memory":"512Mi"},"timeout":60,"env":{"A":"1"},)"
        R"("metadata":{"case":"swebench_x","other":"o","sbx.run":"r1","team":"spec-wins"},)"
        R"("extensions":{"imagePullPolicy":"IfNotPresent",)"
        R"("opensandbox.extensions.image-pull-policy":"IfNotPresent"}})");
  config.create.image_pull_policy.reset();
  spec.ttl = std::chrono::milliseconds(90'500);
  CHECK(os::create_request(config, spec, {}).at("timeout") == 91);
  CHECK(!os::create_request(config, spec, {}).contains("extensions"));
  sbx::sdk::Spec none;
  CHECK(message_of([&] { os::create_request(config, none, {}); }) ==
        "OpenSandbox needs spec.image or provider_options.snapshot_id");
  spec.provider_options["snapshot_id"] = "snap-1";  // besides the image: the server's 422
  CHECK(message_of([&] { os::create_request(config, spec, {}); }) ==
        "give spec.image or provider_options.snapshot_id, not both (the server takes exactly one)");
  none.provider_options["snapshot_id"] = "snap-1";
  CHECK(os::create_request(config, none, {}).at("snapshotId") == "snap-1");
  CHECK(!os::create_request(config, none, {}).contains("image"));
  // The workdir (hex) and the ports ride in the metadata, for a connect by bare id; a workdir too
  // long for a label value is not carried.
  none.workdir = "/work";
  none.ports = {8080, 9090};
  const auto carried = os::create_request(config, none, {}).at("metadata").as_object();
  CHECK(carried.at("sbx.workdir") == "2f776f726b");
  CHECK(carried.at("sbx.ports") == "8080.9090");
  CHECK(os::workdir_from_label("2f776f726b") == std::optional<std::string>("/work"));
  CHECK(os::workdir_from_label(*os::workdir_label("/testbed/a_b.c")) ==
        std::optional<std::string>("/testbed/a_b.c"));
  CHECK(!os::workdir_from_label("2f7"));  // odd length
  CHECK(!os::workdir_from_label("zz"));
  none.workdir = "/" + std::string(31, 'w');
  CHECK(!os::create_request(config, none, {}).at("metadata").as_object().contains("sbx.workdir"));
}

TEST_CASE("create request: resource_requests as the seed's example, validated as resources") {
  auto config = parse("{}");
  sbx::sdk::Spec spec;
  spec.image = "busybox";
  spec.resources.cpu = 1;
  spec.resources.memory_mib = 8192;
  spec.resources.disk_gib = 30;
  spec.provider_options["resource_requests"] =
      obj(R"({"cpu": "0.5", "memory_mib": 2048, "disk_gib": "30"})");
  const auto body = os::create_request(config, spec, {});
  CHECK(json::serialize(body.at("resourceLimits")) ==
        R"({"cpu":"1","memory":"8192Mi","ephemeral-storage":"30Gi"})");
  CHECK(json::serialize(body.at("resourceRequests")) ==
        R"({"cpu":"0.5","memory":"2048Mi","ephemeral-storage":"30Gi"})");
  CHECK(message_of([] { os::SandboxOptions::parse(obj(R"({"resource_requests": 2})")); }) ==
        "provider_options.resource_requests must be a mapping, got number");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"resource_requests": {"cpus": 1, "ram": 2}})"));
        }) ==
        "Unknown sandbox resource keys: cpus, ram. Expected keys: cpu, disk_gib, gpu, "
        "gpu_type, memory_mib");
  CHECK(message_of([] {
          os::SandboxOptions::parse(obj(R"({"resource_requests": {"memory_mib": "4096.5"}})"));
        }) ==
        "Invalid sandbox resource memory_mib: \"4096.5\" (provider_options.resource_requests)");
  sbx::sdk::Spec plain;
  plain.image = "busybox";
  CHECK(!os::create_request(config, plain, {}).contains("resourceRequests"));
}

TEST_CASE("TTL: whole seconds, rounded up, at least the server's 60 s") {
  using ms = std::chrono::milliseconds;
  CHECK(os::ttl_seconds(ms(1)) == 60);
  CHECK(os::ttl_seconds(ms(60'000)) == 60);
  CHECK(os::ttl_seconds(ms(60'001)) == 61);
  CHECK(os::ttl_seconds(ms(600'000)) == 600);
}

TEST_CASE("status: the seed's state mapping plus paused") {
  using S = sbx::sdk::SandboxStatus;
  for (const char* s : {"Running", "active", "READY"})
    CHECK(os::to_sandbox_status(s) == S::running);
  for (const char* s : {"Pending", "creating", "initializing", "starting"}) {
    CHECK(os::to_sandbox_status(s) == S::starting);
  }
  for (const char* s : {"Terminated", "completed", "deleted", "exited", "stopped"}) {
    CHECK(os::to_sandbox_status(s) == S::stopped);
  }
  for (const char* s : {"Failed", "crashed", "error", "unhealthy"}) {
    CHECK(os::to_sandbox_status(s) == S::error);
  }
  CHECK(os::to_sandbox_status("Paused") == S::paused);
  CHECK(os::to_sandbox_status("") == S::unknown);
  CHECK(os::to_sandbox_status("Unknown") == S::unknown);
}

TEST_CASE("event stream: execd's framing, SSE's too, split anywhere") {
  const std::string stream =
      "{\"type\":\"init\",\"text\":\"abc\",\"timestamp\":1}\n\n"
      "{\"type\":\"ping\",\"text\":\"pong\",\"timestamp\":1}\n\n"
      "data: {\"type\":\"stdout\",\"text\":\"out \\u00e9\",\"timestamp\":1}\r\n\r\n"
      ": comment\nevent: x\n"
      "{\"type\":\"stderr\",\"text\":\"\\n\",\"timestamp\":1}\n\n"
      "{\"type\":\"error\",\"timestamp\":1,\"error\":{\"ename\":\"CommandExecError\","
      "\"evalue\":\"3\",\"traceback\":[\"exit status 3\"]}}\n\n";
  for (size_t step : {size_t(1), size_t(7), stream.size()}) {
    os::EventStreamParser parser;
    std::vector<os::EventStreamParser::Event> events;
    for (size_t i = 0; i < stream.size(); i += step) {
      parser.feed(std::string_view(stream).substr(i, step),
                  [&](const auto& e) { events.push_back(e); });
    }
    REQUIRE(events.size() == 5);
    CHECK(events[0].text == "abc");
    CHECK(events[2].type == "stdout");
    CHECK(events[2].text == "out \xc3\xa9");
    CHECK(events[3].text == "\n");
    CHECK(events[4].error_value == std::optional<std::string>("3"));
    CHECK(os::exit_status_of(events[4], false).return_code == 3);
  }
  os::EventStreamParser parser;
  CHECK_THROWS(parser.feed("not json\n", [](const auto&) {}));
}

TEST_CASE("exit status of the terminal event: the project's one exec result rule") {
  os::EventStreamParser::Event e;
  e.type = "execution_complete";
  CHECK(os::exit_status_of(e, false).return_code == 0);
  e.type = "error";
  e.error_value = "-1";
  CHECK(os::exit_status_of(e, true).error_type == std::optional<std::string>("timeout"));
  CHECK(os::exit_status_of(e, true).return_code == 125);
  CHECK(os::exit_status_of(e, false).error_type == std::optional<std::string>("sandbox"));
  e.error_value = "fork/exec /bin/sh: no such file";
  CHECK(os::exit_status_of(e, false).error_type == std::optional<std::string>("sandbox"));
  e.error_value = "0";
  CHECK(os::exit_status_of(e, false).return_code == 0);
  e.error_value = "125";
  e.traceback = "exit status 125";
  CHECK(os::exit_status_of(e, false).return_code == 125);
  CHECK(!os::exit_status_of(e, false).error_type);
  e.traceback = "the sandbox could not start the command";  // sbx serve's start failure
  CHECK(os::exit_status_of(e, false).error_type == std::optional<std::string>("sandbox"));
}

TEST_CASE("create retries: classified by type, status and server code") {
  using E = sbx::sdk::Error;
  CHECK(os::is_retryable_create_error(E::create_verification_failed("probe")));
  CHECK(os::is_retryable_create_error(E::unavailable("could not connect")));
  CHECK(os::is_retryable_create_error(
      E(SBX_STATUS_UNAVAILABLE, "lost", {.retryable = false, .may_have_run = true})));
  CHECK(os::is_retryable_create_error(E::timeout("timed out")));
  CHECK(!os::is_retryable_create_error(E::invalid_argument("timeout in a bad option name")));
  CHECK(!os::is_retryable_create_error(E::cancelled()));
  // TLS failures (the SDK's certificate and handshake errors) and configuration errors are final.
  CHECK(
      !os::is_retryable_create_error(E::unavailable("TLS: the certificate did not verify", false)));
  CHECK(!os::is_retryable_create_error(E::internal("unsupported protocol")));
  auto answer = [](long status, std::string code) {
    return os::is_retryable_create_answer({status, std::move(code), "m", ""});
  };
  for (long status : {408L, 409L, 425L, 429L, 500L, 502L, 503L, 504L})
    CHECK(answer(status, ""));
  CHECK(!answer(400, ""));
  CHECK(!answer(404, ""));
  CHECK(!answer(422, ""));
  CHECK(!answer(501, ""));
  CHECK(!answer(500, "SANDBOX::INVALID_PARAMETER"));  // the code says the request is wrong
  CHECK(!answer(400, "SANDBOX::API_NOT_SUPPORTED"));
  CHECK(answer(400, "SANDBOX::TOO_MANY_SANDBOXES"));
  CHECK(answer(503, "DOCKER::SANDBOX_EXECD_START_FAILED"));
  CHECK(!answer(500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED"));  // the real server's missing image
}

TEST_CASE("the server's code is the error's reason; a failed pull its well-known name") {
  const auto pull =
      os::to_error({500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", "m", "rid"}, "create", false);
  CHECK(pull.reason() == SBX_REASON_IMAGE_PULL_FAILED);
  CHECK(pull.request_id() == "rid");
  CHECK(os::to_error({400, "SANDBOX::INVALID_METADATA_LABEL", "m", ""}, "create", false).reason() ==
        "SANDBOX::INVALID_METADATA_LABEL");
  CHECK(os::to_error({502, "", "bad gateway", ""}, "create", true).reason().empty());
}

TEST_CASE("API error bodies: both envelopes") {
  sbx::sdk::http::Response r;
  r.status = 404;
  r.body = R"({"code":"DOCKER::SANDBOX_NOT_FOUND","message":"Sandbox nope not found."})";
  r.headers = {{"x-request-id", "rid"}};
  auto e = os::parse_api_error(r);
  CHECK(e.code == "DOCKER::SANDBOX_NOT_FOUND");
  CHECK(e.message == "Sandbox nope not found.");
  CHECK(e.request_id == "rid");
  CHECK(os::to_error(e, "get", false).status() == SBX_STATUS_NOT_FOUND);
  r.status = 422;
  r.body = R"({"detail":[{"type":"missing","msg":"Field required"},{"msg":"Other"}]})";
  e = os::parse_api_error(r);
  CHECK(e.code.empty());
  CHECK(e.message == "Field required; Other");
  CHECK(os::to_error(e, "create", false).status() == SBX_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("shell quoting for su (sbx/base/shell_quote.hpp)") {
  CHECK(sbx::base::shell_quote("it's") == "'it'\\''s'");
  CHECK(sbx::base::shell_quote("") == "''");
  CHECK(sbx::base::shell_join({"printf", "%s", "a b", "$x"}) == "'printf' '%s' 'a b' '$x'");
}

TEST_CASE("RFC 3339 times for renew") {
  CHECK(os::format_rfc3339(1'796'080'697'507) == "2026-11-30T23:18:17.507Z");
  CHECK(os::parse_rfc3339("2026-11-30T23:18:17.507Z") == std::optional<int64_t>(1'796'080'697'507));
  CHECK(os::parse_rfc3339("2026-12-01T01:00:00Z") == std::optional<int64_t>(1'796'086'800'000));
  CHECK(os::parse_rfc3339("2026-12-01T02:00:00+01:00") ==
        std::optional<int64_t>(1'796'086'800'000));
  CHECK(os::parse_rfc3339("2026-11-30T23:27:59.680153Z") ==
        std::optional<int64_t>(1'796'081'279'680));
  CHECK(!os::parse_rfc3339("yesterday"));
  CHECK(!os::parse_rfc3339("2026-12-01T01:00:00"));
}

TEST_CASE("post-502 diagnosis: an OOM kill in the status's reason or message, any spelling") {
  const auto oom = os::oom_error({"Failed", "FAILED", "container OOMKilled (exit 137)"}, "sb-1");
  REQUIRE(oom);
  CHECK(oom->status() == SBX_STATUS_UNAVAILABLE);
  CHECK_FALSE(oom->retryable());
  CHECK(std::string(oom->what()) ==
        "Sandbox was OOM-killed. OpenSandbox status: state='Failed', reason='FAILED', "
        "message='container OOMKilled (exit 137)'; sandbox_id=sb-1");
  CHECK(os::oom_error({"Failed", "OOM_Killed", ""}, "s"));
  CHECK(os::oom_error({"Failed", "", "Out Of Memory: killed process 12"}, "s"));
  CHECK(os::oom_error({"Failed", "oom-killed", ""}, "s"));
  CHECK_FALSE(os::oom_error({"Failed", "FAILED", "exit code 1"}, "s"));
  CHECK_FALSE(os::oom_error({"Running", "CONTAINER_RUNNING", "zoomkilled"}, "s"));
  const std::string long_message(900, 'm');
  const auto cut = os::oom_error({"Failed", "OOMKilled", long_message}, "s");
  REQUIRE(cut);
  CHECK(std::string(cut->what()).size() < 800);  // the message is cut to 500 characters

  CHECK(os::is_backend_502(sbx::sdk::Error(SBX_STATUS_UNAVAILABLE, "x", {.http_status = 502})));
  CHECK_FALSE(os::is_backend_502(sbx::sdk::Error::unavailable("x")));

  const auto status = os::parse_sandbox_status(
      R"({"id":"a","status":{"state":"Failed","reason":"OOMKilled","message":"m"}})", "get");
  CHECK(status.state == "Failed");
  CHECK(status.reason == "OOMKilled");
  CHECK(status.message == "m");
  CHECK(os::parse_sandbox_status(R"({"id":"a"})", "get").state.empty());
  CHECK(message_of([] { os::parse_sandbox_status("nope", "OpenSandbox get sandbox a"); }) ==
        "OpenSandbox get sandbox a: the answer is not a JSON object");
}

TEST_CASE("list: the metadata filter, the answer's items and pages, the selector rule") {
  // Keys and values encoded in the inner query, which is encoded again as one parameter value.
  CHECK(os::metadata_filter({}).empty());
  CHECK(os::metadata_filter({{"team", "infra"}}) == "team%3Dinfra");
  CHECK(os::metadata_filter({{"example.com/team", "a b"}, {"job", "x&y=z"}}) ==
        "example.com%252Fteam%3Da%2520b%26job%3Dx%2526y%253Dz");

  // The wire transcript's answer (the real server's).
  const auto page = os::parse_list_page(
      R"({"items":[{"id":"22bc0a20-1cb1-49dc-ba46-a6da37a42f22","image":{"uri":"local/busybox:latest"},)"
      R"("status":{"state":"Running","reason":"CONTAINER_RUNNING"},"metadata":{"team":"infra"},)"
      R"("entrypoint":["tail","-f","/dev/null"],"expiresAt":"2026-11-30T23:27:59.680153Z",)"
      R"("createdAt":"2026-11-30T23:17:59.695416Z"}],)"
      R"("pagination":{"page":1,"pageSize":10,"totalItems":1,"totalPages":1,"hasNextPage":false}})");
  REQUIRE(page.items.size() == 1);
  CHECK(page.items[0].id == "22bc0a20-1cb1-49dc-ba46-a6da37a42f22");
  CHECK(page.items[0].state == "Running");
  CHECK(page.items[0].metadata == os::KeyValues{{"team", "infra"}});
  CHECK(page.items[0].created_unix_ms == *os::parse_rfc3339("2026-11-30T23:17:59.695Z"));
  CHECK(!page.has_next_page);
  const auto more = os::parse_list_page(
      R"({"items":[{"id":"a"},{"noid":1},{"id":""},7,{"id":"b","metadata":{"n":3,"s":"v"}}],)"
      R"("pagination":{"hasNextPage":true}})");
  REQUIRE(more.items.size() == 2);
  CHECK(more.items[0].id == "a");
  CHECK(more.items[0].state.empty());
  CHECK(more.items[0].created_unix_ms == 0);
  CHECK(more.items[1].metadata == os::KeyValues{{"s", "v"}});  // string values only
  CHECK(more.has_next_page);
  CHECK(message_of([] { os::parse_list_page(R"({"sandboxes":[]})"); }) ==
        "OpenSandbox list sandboxes: the answer has no items array");

  const os::KeyValues metadata{{"team", "red"}, {"job", ""}};
  CHECK(os::matches_selector({}, metadata));
  CHECK(os::matches_selector({{"team", "red"}}, metadata));
  CHECK(os::matches_selector({{"team", ""}}, metadata));  // any value
  CHECK(os::matches_selector({{"job", ""}}, metadata));
  CHECK(!os::matches_selector({{"team", "blue"}}, metadata));
  CHECK(!os::matches_selector({{"other", ""}}, metadata));
  CHECK(!os::matches_selector({{"team", "red"}, {"other", ""}}, metadata));
}
