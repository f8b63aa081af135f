// `sbx serve`'s lifecycle routes beyond create/get/delete, as a process over test_processes (which
// offers sbx.pause/1, sbx.renew/1 and sbx.connect/1) and over v1_0_processes (no extension at all):
// list with its filters and paging, pause/resume, renew-expiration, endpoints, the TTL (404 once
// it passed, the sandbox closed), the cap on sandboxes, and sandboxes found again by a restarted
// server through --state-dir (--keep-on-stop).

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <doctest/doctest.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

using namespace serve_test;
namespace json = boost::json;

namespace {

// A config whose provider "p" is test_processes with sandboxes under `root` (or, with
// `v1_0`, the ABI 1.0 plain-C plugin, whose sandboxes go under $TMPDIR = this directory).
struct Fixture : ProcessesServer {
  bool v1_0 = false;

  explicit Fixture(std::vector<std::string> extra = {}, bool v1_0_plugin = false,
                   std::map<std::string, std::string> env = {})
      : v1_0(v1_0_plugin) {
    write_config(v1_0 ? json::object{{"plugin", "v1_0_processes"}} : processes_block());
    start(std::move(extra), std::move(env));
  }
  void start(std::vector<std::string> extra = {}, std::map<std::string, std::string> env = {}) {
    if (v1_0) {
      extra.push_back("--plugin-dir");
      extra.push_back(SBX_C_PLUGIN_DIR);
      env["TMPDIR"] = root.string();
    }
    ProcessesServer::start(std::move(extra), std::move(env));
  }
};

std::string create_body(const std::string& metadata, const std::string& timeout = "600") {
  return R"({"image":{"uri":"local/busybox:latest"},"entrypoint":["tail","-f","/dev/null"],)"
         R"("resourceLimits":{"cpu":"500m","memory":"512Mi"},"timeout":)" +
         timeout + R"(,"metadata":)" + metadata + "}";
}

std::string create(int port, const std::string& metadata, const std::string& timeout = "600") {
  const auto r = request(port, "POST", "/v1/sandboxes", create_body(metadata, timeout));
  REQUIRE_MESSAGE(r.status == 202, r.body);
  return std::string(r.json().at("id").as_string());
}

json::value error_of(const std::string& code, const std::string& message) {
  return json::object{{"code", code}, {"message", message}};
}

std::vector<std::string> ids_of(const Response& r) {
  std::vector<std::string> out;
  const json::value body = r.json();
  for (const auto& item : body.at("items").as_array())
    out.emplace_back(item.at("id").as_string());
  return out;
}

std::string hmac_hex(const std::string& key, const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest, &size);
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace

TEST_CASE("list: newest first, metadata and state filters, paging, and the real server's errors") {
  Fixture f;
  const std::string a = create(f.port(), R"({"team":"infra","tier":"gold"})");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string b = create(f.port(), R"({"team":"infra","tier":"silver"})");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string c = create(f.port(), R"({"team":"web"})");

  for (const std::string prefix : {"/v1", ""}) {
    CAPTURE(prefix);
    const auto all = request(f.port(), "GET", prefix + "/sandboxes");
    REQUIRE(all.status == 200);
    CHECK(all.headers.at("content-type") == "application/json");
    CHECK(ids_of(all) == std::vector<std::string>{c, b, a});
    CHECK(all.json().at("pagination") == json::parse(R"({"page":1,"pageSize":20,"totalItems":3,)"
                                                     R"("totalPages":1,"hasNextPage":false})"));
    // Items are the Sandbox objects GET answers.
    const auto got = request(f.port(), "GET", "/v1/sandboxes/" + b);
    CHECK(all.json().at("items").at(1) == got.json());
  }

  // metadata=k%3Dv, several pairs ANDed inside the one parameter (as the SDK sends it).
  auto list = [&](const std::string& query) {
    return request(f.port(), "GET", "/v1/sandboxes?" + query);
  };
  CHECK(ids_of(list("metadata=team%3Dinfra")) == std::vector<std::string>{b, a});
  CHECK(ids_of(list("metadata=team%3Dinfra%26tier%3Dgold")) == std::vector<std::string>{a});
  CHECK(ids_of(list("metadata=team%3Dnobody")).empty());
  const auto transcript = list("metadata=team%3Dinfra&pageSize=10");
  CHECK(transcript.json().at("pagination") ==
        json::parse(R"({"page":1,"pageSize":10,"totalItems":2,"totalPages":1,)"
                    R"("hasNextPage":false})"));

  // Paging.
  const auto page1 = list("pageSize=2");
  CHECK(ids_of(page1) == std::vector<std::string>{c, b});
  CHECK(page1.json().at("pagination") ==
        json::parse(R"({"page":1,"pageSize":2,"totalItems":3,"totalPages":2,"hasNextPage":true})"));
  const auto page2 = list("pageSize=2&page=2");
  CHECK(ids_of(page2) == std::vector<std::string>{a});
  CHECK(page2.json().at("pagination").at("hasNextPage") == false);
  const auto beyond = list("pageSize=2&page=5");
  CHECK(beyond.status == 200);
  CHECK(ids_of(beyond).empty());
  CHECK(beyond.json().at("pagination").at("totalItems") == 3);

  // State filters: repeated for OR, case-insensitive, as the real server.
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + b + "/pause").status == 202);
  CHECK(ids_of(list("state=Paused")) == std::vector<std::string>{b});
  CHECK(ids_of(list("state=running")) == std::vector<std::string>{c, a});
  CHECK(ids_of(list("state=Running&state=Paused")) == std::vector<std::string>{c, b, a});
  CHECK(ids_of(list("state=Running&metadata=team%3Dinfra")) == std::vector<std::string>{a});
  const auto running_page = list("state=Running&pageSize=1&page=2");
  CHECK(ids_of(running_page) == std::vector<std::string>{a});
  CHECK(
      running_page.json().at("pagination") ==
      json::parse(R"({"page":2,"pageSize":1,"totalItems":2,"totalPages":2,"hasNextPage":false})"));
  CHECK(ids_of(list("state=Terminated")).empty());

  // FastAPI's 422 items for bad paging values, every one listed.
  const auto bad = list("page=0&pageSize=201");
  CHECK(bad.status == 422);
  CHECK(bad.json() ==
        json::parse(R"({"detail":[{"type":"greater_than_equal","loc":["query","page"],)"
                    R"("msg":"Input should be greater than or equal to 1","input":"0",)"
                    R"("ctx":{"ge":1}},{"type":"less_than_equal","loc":["query","pageSize"],)"
                    R"("msg":"Input should be less than or equal to 200","input":"201",)"
                    R"("ctx":{"le":200}}]})"));
  const auto not_int = list("pageSize=abc");
  CHECK(not_int.status == 422);
  CHECK(not_int.json() ==
        json::parse(R"({"detail":[{"type":"int_parsing","loc":["query","pageSize"],)"
                    R"("msg":"Input should be a valid integer, unable to parse string as an )"
                    R"(integer","input":"abc"}]})"));
  // A metadata value that is not k=v pairs: the real server's 400.
  const auto broken = list("metadata=a%3D1%26broken");
  CHECK(broken.status == 400);
  CHECK(broken.json() ==
        error_of("INVALID_METADATA_FORMAT", "Invalid metadata format: bad query field: 'broken'"));

  CHECK(request(f.port(), "PUT", "/v1/sandboxes").status == 405);
  // A deleted sandbox is no longer listed.
  REQUIRE(request(f.port(), "DELETE", "/v1/sandboxes/" + c).status == 204);
  CHECK(ids_of(list("")) == std::vector<std::string>{b, a});
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("pause and resume: 202 without a body, GET reports Paused, wrong states are 409") {
  Fixture f;
  const std::string id = create(f.port(), R"({"team":"infra"})");
  const auto paused = request(f.port(), "POST", "/v1/sandboxes/" + id + "/pause");
  CHECK(paused.status == 202);
  CHECK(paused.body.empty());
  CHECK(paused.headers.at("content-length") == "0");
  CHECK(!paused.has_header("content-type"));
  CHECK(fs::exists(f.root / id / ".sbx-paused"));  // the provider really paused it
  const auto got = request(f.port(), "GET", "/v1/sandboxes/" + id);
  CHECK(got.json().at("status").at("state") == "Paused");
  CHECK(got.json().at("status").at("reason") == "CONTAINER_PAUSED");
  CHECK(got.json().at("status").at("message") == "Sandbox container is paused.");
  // As the real server's Docker runtime: lastTransitionAt stays the container's creation time
  // (the wire transcript's paused sandbox), it does not move with a pause.
  CHECK(got.json().at("status").at("lastTransitionAt") == got.json().at("createdAt"));

  const auto again = request(f.port(), "POST", "/sandboxes/" + id + "/pause");
  CHECK(again.status == 409);
  CHECK(again.json() ==
        error_of("DOCKER::SANDBOX_NOT_RUNNING", "Sandbox is not in a running state."));

  const auto resumed = request(f.port(), "POST", "/sandboxes/" + id + "/resume");
  CHECK(resumed.status == 202);
  CHECK(resumed.body.empty());
  CHECK(!fs::exists(f.root / id / ".sbx-paused"));
  CHECK(request(f.port(), "GET", "/sandboxes/" + id).json().at("status").at("state") == "Running");
  const auto not_paused = request(f.port(), "POST", "/v1/sandboxes/" + id + "/resume");
  CHECK(not_paused.status == 409);
  CHECK(not_paused.json() ==
        error_of("DOCKER::SANDBOX_NOT_PAUSED", "Sandbox is not in a paused state."));

  for (const char* op : {"pause", "resume"}) {
    CAPTURE(op);
    const auto unknown = request(f.port(), "POST", std::string("/v1/sandboxes/nope/") + op);
    CHECK(unknown.status == 404);
    CHECK(unknown.json() == error_of("DOCKER::SANDBOX_NOT_FOUND", "Sandbox nope not found."));
    CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id + "/" + op).status == 405);
  }
  // A paused sandbox can be deleted.
  REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + id + "/pause").status == 202);
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("renew-expiration: 200 {expiresAt}, GET reflects it, and the real server's errors") {
  Fixture f;
  const std::string id = create(f.port(), R"({"team":"infra"})");
  const std::string target = rfc3339(std::chrono::system_clock::now() + std::chrono::hours(2));
  const auto renewed = request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration",
                               R"({"expiresAt":")" + target + R"("})");
  REQUIRE(renewed.status == 200);
  CHECK(renewed.body == R"({"expiresAt":")" + target + R"("})");  // no fraction, as pydantic
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("expiresAt") ==
        json::value(target));

  // An offset and a fraction are normalised to UTC.
  const auto later = std::chrono::system_clock::now() + std::chrono::hours(3);
  const std::string utc = rfc3339(later);
  std::string shifted = rfc3339(later + std::chrono::hours(2));  // the same instant at +02:00
  shifted = shifted.substr(0, shifted.size() - 1) + ".250000+02:00";
  const auto offset = request(f.port(), "POST", "/sandboxes/" + id + "/renew-expiration",
                              R"({"expiresAt":")" + shifted + R"("})");
  REQUIRE(offset.status == 200);
  CHECK(offset.json().at("expiresAt") == json::value(utc.substr(0, utc.size() - 1) + ".250000Z"));

  // Errors: a time in the past, malformed times and bodies, unknown ids, no expiry at all.
  auto renew = [&](const std::string& sandbox, const std::string& body) {
    return request(f.port(), "POST", "/v1/sandboxes/" + sandbox + "/renew-expiration", body);
  };
  const auto past = renew(id, R"({"expiresAt":"2020-01-01T00:00:00Z"})");
  CHECK(past.status == 400);
  CHECK(past.json() ==
        error_of("DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future."));
  const auto malformed = renew(id, R"({"expiresAt":"soon"})");
  CHECK(malformed.status == 422);
  CHECK(malformed.json() ==
        json::parse(R"({"detail":[{"type":"datetime_from_date_parsing","loc":["body","expiresAt"],)"
                    R"("msg":"Input should be a valid datetime or date, input is too short",)"
                    R"("input":"soon","ctx":{"error":"input is too short"}}]})"));
  const auto bad_month = renew(id, R"({"expiresAt":"2030-13-01T00:00:00Z"})");
  CHECK(bad_month.status == 422);
  CHECK(bad_month.json().at("detail").at(0).at("ctx").at("error") ==
        "month value is outside expected range of 1-12");
  const auto missing = renew(id, R"({"expires":"x"})");
  CHECK(missing.status == 422);
  CHECK(missing.json().at("detail").at(0).at("type") == "missing");
  CHECK(missing.json().at("detail").at(0).at("loc") == json::array{"body", "expiresAt"});
  const auto wrong_type = renew(id, R"({"expiresAt":true})");
  CHECK(wrong_type.status == 422);
  CHECK(wrong_type.json().at("detail").at(0).at("type") == "datetime_type");
  const auto empty = request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration");
  CHECK(empty.status == 422);
  CHECK(empty.json().at("detail").at(0).at("loc") == json::array{"body"});
  const auto unknown = renew("nope", R"({"expiresAt":")" + target + R"("})");
  CHECK(unknown.status == 404);
  CHECK(unknown.json() == error_of("DOCKER::SANDBOX_NOT_FOUND", "Sandbox nope not found."));
  const std::string forever = create(f.port(), R"({})", "null");
  const auto manual = renew(forever, R"({"expiresAt":")" + target + R"("})");
  CHECK(manual.status == 409);
  CHECK(manual.json() ==
        error_of("DOCKER::INVALID_EXPIRATION",
                 "Sandbox " + forever + " does not have automatic expiration enabled."));
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id + "/renew-expiration").status == 405);
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("numbers out of range are refused with the real server's 4xx, nothing overflows") {
  Fixture f;
  auto post = [&](const std::string& body) {
    return request(f.port(), "POST", "/v1/sandboxes", body);
  };
  const std::string memory_512 = R"("memory":"512Mi")";
  auto body_with = [&](const std::string& limits, const std::string& timeout) {
    return R"({"image":{"uri":"local/busybox:latest"},"entrypoint":["tail","-f","/dev/null"],)"
           R"("resourceLimits":{)" +
           limits + R"(},"timeout":)" + timeout + "}";
  };
  // timeout: 1e10 s used to give an expiry in 1759 (and the sandbox was swept at once).
  for (const std::string timeout : {"1e10", "10000000000", "1000000001", "18446744073709551615"}) {
    CAPTURE(timeout);
    const auto r = post(body_with(memory_512, timeout));
    CHECK(r.status == 400);
    CHECK(r.json().at("code") == "SANDBOX::INVALID_PARAMETER");
    CHECK(std::string(r.json().at("message").as_string()).find("timeout must be at most") == 0);
  }
  // The longest accepted timeout gives the expiry it says.
  const auto longest = post(body_with(memory_512, "1000000000"));
  REQUIRE(longest.status == 202);
  const json::value l = longest.json();
  CHECK(parse_time_us(std::string(l.at("expiresAt").as_string())) -
            parse_time_us(std::string(l.at("createdAt").as_string())) ==
        1'000'000'000LL * 1'000'000);
  const std::string id(l.at("id").as_string());

  // Resource limits past what any provider's arithmetic holds.
  for (const std::string limit :
       {R"("memory":"99999999999Gi")", R"("memory":"infMi")", R"("memory":"1e30")",
        R"("cpu":"1e300")", R"("cpu":"inf")", R"("cpu":"99999999m")"}) {
    CAPTURE(limit);
    const auto r = post(body_with(limit, "600"));
    CHECK(r.status == 400);
    CHECK(r.json().at("code") == "SANDBOX::INVALID_PARAMETER");
    CHECK(std::string(r.json().at("message").as_string()).find("is out of range") !=
          std::string::npos);
  }
  CHECK(post(body_with(R"("memory":"1024Ti","cpu":"65536")", "600")).status == 202);  // the caps

  // renew-expiration: far future, long past, absurd; the expiry stays as it was.
  const json::value before = request(f.port(), "GET", "/v1/sandboxes/" + id).json();
  auto renew = [&](const std::string& expires) {
    return request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration",
                   R"({"expiresAt":)" + expires + "}");
  };
  const std::string too_far = rfc3339(std::chrono::system_clock::now() +
                                      std::chrono::seconds(1'000'000'000) + std::chrono::hours(1));
  for (const std::string& expires :
       {std::string(R"("9999-12-31T23:59:59Z")"), std::string(R"("2300-01-01")"),
        "\"" + too_far + "\"", std::string("1e300"), std::string("99999999999999999999")}) {
    CAPTURE(expires);
    const auto r = renew(expires);
    CHECK(r.status == 400);
    CHECK(r.json() == error_of("DOCKER::INVALID_EXPIRATION",
                               "New expiration time must be at most 1000000000 seconds (about 31 "
                               "years) from now."));
  }
  for (const std::string expires : {R"("0001-01-01T00:00:00Z")", R"("1600-01-01")", "-1e300"}) {
    CAPTURE(expires);
    const auto r = renew(expires);
    CHECK(r.status == 400);
    CHECK(r.json() ==
          error_of("DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future."));
  }
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("expiresAt") ==
        before.at("expiresAt"));

  // list: (page - 1) * pageSize wrapped to 0 for this page, which then showed the first page.
  const auto far_page =
      request(f.port(), "GET", "/v1/sandboxes?page=144115188075855873&pageSize=128");
  REQUIRE(far_page.status == 200);
  CHECK(far_page.json().at("items").as_array().empty());
  CHECK(far_page.json().at("pagination").at("totalItems") == 2);
  CHECK(far_page.json().at("pagination").at("hasNextPage") == false);
  const auto last_digits = request(f.port(), "GET", "/v1/sandboxes?page=999999999999999999");
  REQUIRE(last_digits.status == 200);
  CHECK(last_digits.json().at("items").as_array().empty());
}

// The real server holds metadata to Kubernetes label rules and reserves the opensandbox.io/
// prefix: 400 SANDBOX::INVALID_METADATA_LABEL, nothing created.
TEST_CASE("metadata that breaks the label rules is refused with INVALID_METADATA_LABEL") {
  Fixture f;
  auto post = [&](const std::string& metadata) {
    return request(
        f.port(), "POST", "/v1/sandboxes",
        R"({"image":{"uri":"local/busybox:latest"},"entrypoint":["tail","-f","/dev/null"],)"
        R"("resourceLimits":{},"metadata":)" +
            metadata + "}");
  };
  for (const std::string& bad : std::vector<std::string>{
           R"({"opensandbox.io/owner":"x"})", R"({"team":"has space"})", R"({"team":"-lead"})",
           R"({"Bad_Prefix.io/k":"v"})", R"({"k":")" + std::string(64, 'v') + R"("})",
           R"({"":"v"})", R"({"a/b/c":"v"})"}) {
    CAPTURE(bad);
    const auto r = post(bad);
    CHECK(r.status == 400);
    CHECK(r.json().at("code") == "SANDBOX::INVALID_METADATA_LABEL");
  }
  CHECK(f.sandboxes_on_disk() == 0);
  for (const std::string& good : std::vector<std::string>{
           R"({"team":"infra","example.com/run":"r-1.2_x","empty":""})",
           R"({"nemo-gym.nvidia.com/team":"t","k":")" + std::string(63, 'v') + R"("})"}) {
    CAPTURE(good);
    CHECK(post(good).status == 202);
  }
}

TEST_CASE("PATCH /sandboxes/{id}/metadata: a JSON Merge Patch; GET and list follow; errors") {
  Fixture f;
  const std::string id = create(f.port(), R"({"a":"1","b":"2"})");
  const std::string path = "/v1/sandboxes/" + id + "/metadata";
  const auto patched =
      request(f.port(), "PATCH", path, std::string(R"({"b":null,"c":"3","a":"9","gone":null})"));
  REQUIRE(patched.status == 200);
  const json::object expected{{"a", "9"}, {"c", "3"}};
  CHECK(patched.json().at("id") == json::value(id));
  CHECK(patched.json().at("metadata") == expected);
  CHECK(patched.json().at("status").at("state") == "Running");
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("metadata") == expected);
  CHECK(ids_of(request(f.port(), "GET", "/v1/sandboxes?metadata=c%3D3")) ==
        std::vector<std::string>{id});
  CHECK(ids_of(request(f.port(), "GET", "/sandboxes?metadata=b%3D2")).empty());
  // {} changes nothing and answers the sandbox; the root path serves it too.
  const auto same = request(f.port(), "PATCH", "/sandboxes/" + id + "/metadata", std::string("{}"));
  REQUIRE(same.status == 200);
  CHECK(same.json().at("metadata") == expected);

  for (const char* bad :
       {R"({"opensandbox.io/owner":"x"})", R"({"team":"has space"})", R"({"":"v"})"}) {
    CAPTURE(bad);
    const auto r = request(f.port(), "PATCH", path, bad);
    CHECK(r.status == 400);
    CHECK(r.json().at("code") == "SANDBOX::INVALID_METADATA_LABEL");
  }
  for (const std::string& bad : {std::string(R"({"k":5})"), std::string("[]")}) {
    CAPTURE(bad);
    const auto r = request(f.port(), "PATCH", path, bad);
    CHECK(r.status == 422);
    CHECK(r.json().at("detail").is_array());
  }
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("metadata") == expected);
  const auto unknown =
      request(f.port(), "PATCH", "/v1/sandboxes/nope/metadata", std::string(R"({"a":"1"})"));
  CHECK(unknown.status == 404);
  CHECK(unknown.json().at("code") == "DOCKER::SANDBOX_NOT_FOUND");
  // A sandbox created without metadata gets some.
  const std::string bare = create(f.port(), "{}", "null");
  const auto added = request(f.port(), "PATCH", "/v1/sandboxes/" + bare + "/metadata",
                             std::string(R"({"k":"v"})"));
  REQUIRE(added.status == 200);
  CHECK(added.json().at("metadata") == json::object{{"k", "v"}});
}

TEST_CASE("sbx serve's duration flags out of range are refused before anything starts") {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--grace", "1e300"},
                                                        {"--grace", "86401"},
                                                        {"--grace", "-1"},
                                                        {"--read-timeout", "1e20"},
                                                        {"--read-timeout", "0"},
                                                        {"--read-timeout", "inf"}}) {
    CAPTURE(flag);
    CAPTURE(value);
    std::string output;
    // No --listen: a value let through would fail on that instead, naming something else.
    CHECK(run_to_exit({SBX_CLI, "serve", flag, value}, output) == 2);
    CHECK(output.find(flag + " must be") != std::string::npos);
  }
}

TEST_CASE(
    "--state-dir: concurrent renews write whole records; a renew after a delete writes none") {
  ProcessesServer f;
  const fs::path gate = f.dir.path / "renew-gate";
  const fs::path state = f.dir.path / "state";
  f.write_config(f.processes_block(json::object{{"renew_gate", gate.string()}}));
  f.start({"--state-dir", state.string()});
  const std::string id = create(f.port(), R"({"team":"infra"})");
  const fs::path record = state / (id + ".json");
  REQUIRE(fs::exists(record));
  auto waiting = [&](int n) { return fs::exists(gate.string() + ".waiting-" + std::to_string(n)); };
  auto renew_body = [](int minutes) {
    return R"({"expiresAt":")" +
           rfc3339(std::chrono::system_clock::now() + std::chrono::minutes(minutes)) + R"("})";
  };
  auto strays = [&] {
    int n = 0;
    for (const auto& item : fs::directory_iterator(state)) {
      const std::string name = item.path().filename().string();
      n += name.find(".tmp") != std::string::npos || name.rfind(".create-", 0) == 0;
    }
    return n;
  };

  // Eight renews held in the provider, then let go at once: their records are written one at a
  // time, and the record ends up whole and equal to what GET answers.
  std::vector<std::thread> renews;
  std::vector<int> statuses(8);
  for (int i = 0; i < 8; ++i) {
    renews.emplace_back([&, i] {
      statuses[static_cast<size_t>(i)] =
          request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration", renew_body(60 + i))
              .status;
    });
  }
  for (int i = 1; i <= 8; ++i)
    REQUIRE(sbx::testing::eventually([&] { return waiting(i); }));
  std::ofstream{gate};
  for (auto& t : renews)
    t.join();
  CHECK(statuses == std::vector<int>(8, 200));
  std::ifstream in(record);
  const json::value saved = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  const long long got_us = parse_time_us(std::string(
      request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("expiresAt").as_string()));
  CHECK(saved.at("expiresAtUs").to_number<long long>() == got_us);
  CHECK(strays() == 0);

  // A renew held in the provider while the sandbox is deleted: once it completes, the record
  // stays gone (it used to be written back, and a restarted server served a closed sandbox).
  fs::remove(gate);
  int late_status = 0;
  std::thread late([&] {
    late_status =
        request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration", renew_body(90))
            .status;
  });
  REQUIRE(sbx::testing::eventually([&] { return waiting(9); }));
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + id).status == 204);
  CHECK_FALSE(fs::exists(record));
  std::ofstream{gate};
  late.join();
  CHECK(late_status == 404);
  CHECK_FALSE(fs::exists(record));
  CHECK(strays() == 0);
  CHECK(f.server->stop() == 0);
  CHECK_FALSE(fs::exists(record));
}

TEST_CASE("past its TTL a sandbox is 404 everywhere and closed, also when nobody asks") {
  Fixture f({"--log-level", "info"});
  const std::string touched = create(f.port(), R"({"ttl":"short"})");
  const std::string untouched = create(f.port(), R"({"ttl":"short"})");
  const std::string kept = create(f.port(), R"({"ttl":"long"})");
  // Shorten both to three seconds from now (the create's minimum timeout is 60 s).
  const std::string soon = rfc3339(std::chrono::system_clock::now() + std::chrono::seconds(3));
  for (const auto& id : {touched, untouched}) {
    REQUIRE(request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration",
                    R"({"expiresAt":")" + soon + R"("})")
                .status == 200);
  }
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + touched).status == 200);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  // Closed by the server's sweep, with no request about them.
  CHECK(sbx::testing::eventually([&] { return f.sandboxes_on_disk() == 1; }));
  CHECK(fs::exists(f.root / kept));
  CHECK(f.log_text().find("closing sandbox " + untouched + " (its TTL passed)") !=
        std::string::npos);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/sandboxes/" + touched},
           {"GET", "/v1/sandboxes/" + touched + "/endpoints/44772"},
           {"POST", "/v1/sandboxes/" + touched + "/pause"},
           {"DELETE", "/v1/sandboxes/" + touched}}) {
    CAPTURE(method);
    CAPTURE(path);
    const auto r = request(f.port(), method, path);
    CHECK(r.status == 404);
    CHECK(r.json() == error_of("DOCKER::SANDBOX_NOT_FOUND", "Sandbox " + touched + " not found."));
  }
  CHECK(ids_of(request(f.port(), "GET", "/v1/sandboxes")) == std::vector<std::string>{kept});
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("endpoints: the gateway's direct and server-proxy paths, and their errors") {
  Fixture f;
  const std::string id = create(f.port(), R"({})");
  const std::string host = "127.0.0.1:" + std::to_string(f.port());
  const auto direct = request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/44772");
  REQUIRE(direct.status == 200);
  CHECK(direct.body == R"({"endpoint":")" + host + "/sandboxes/" + id + R"(/proxy/44772"})");
  const auto proxied =
      request(f.port(), "GET", "/sandboxes/" + id + "/endpoints/44772?use_server_proxy=true");
  REQUIRE(proxied.status == 200);
  CHECK(proxied.body == R"({"endpoint":")" + host + "/v1/sandboxes/" + id + R"(/proxy/44772"})");
  // Every port has an endpoint (the SDKs ask for the egress port 18080 on every create).
  const auto egress = request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/18080");
  CHECK(egress.status == 200);
  CHECK(egress.json().at("endpoint") == json::value(host + "/sandboxes/" + id + "/proxy/18080"));
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/44772?use_server_proxy=false")
            .json() == direct.json());

  for (const char* port : {"0", "65536", "-1"}) {
    CAPTURE(port);
    const auto r = request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/" + port);
    CHECK(r.status == 400);
    CHECK(r.json() == error_of("DOCKER::INVALID_PORT", "Port must be between 1 and 65535."));
  }
  const auto not_int = request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/http");
  CHECK(not_int.status == 422);
  CHECK(not_int.json() ==
        json::parse(R"({"detail":[{"type":"int_parsing","loc":["path","port"],)"
                    R"("msg":"Input should be a valid integer, unable to parse string as an )"
                    R"(integer","input":"http"}]})"));
  const auto bad_bool =
      request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/44772?use_server_proxy=maybe");
  CHECK(bad_bool.status == 422);
  CHECK(bad_bool.json().at("detail").at(0).at("type") == "bool_parsing");
  const auto both =
      request(f.port(), "GET",
              "/v1/sandboxes/" + id + "/endpoints/44772?use_server_proxy=true&expires=1900000000");
  CHECK(both.status == 400);
  CHECK(both.json().at("code") == "SANDBOX::INVALID_PARAMETER");
  const auto signed_route =
      request(f.port(), "GET", "/v1/sandboxes/" + id + "/endpoints/44772?expires=1900000000");
  CHECK(signed_route.status == 400);
  CHECK(signed_route.json().at("code") == "SANDBOX::API_NOT_SUPPORTED");
  const auto unknown = request(f.port(), "GET", "/v1/sandboxes/nope/endpoints/44772");
  CHECK(unknown.status == 404);
  CHECK(unknown.json() == error_of("DOCKER::SANDBOX_NOT_FOUND", "Sandbox nope not found."));
  CHECK(request(f.port(), "POST", "/v1/sandboxes/" + id + "/endpoints/44772").status == 405);
}

TEST_CASE("endpoints with an API key: direct mode hands out the sandbox's execd token") {
  const std::string key = "lifecycle-test-key";
  Fixture f({"--api-key-env", "SBX_SERVE_TEST_KEY"}, false, {{"SBX_SERVE_TEST_KEY", key}});
  const std::map<std::string, std::string> auth{{"OPEN-SANDBOX-API-KEY", key}};
  auto post = [&](const std::string& body) {
    return request(f.port(), "POST", "/v1/sandboxes", body, auth);
  };
  const auto a = post(create_body("{}"));
  const auto b = post(create_body("{}"));
  REQUIRE(a.status == 202);
  REQUIRE(b.status == 202);
  const std::string id_a(a.json().at("id").as_string()), id_b(b.json().at("id").as_string());
  const auto direct =
      request(f.port(), "GET", "/v1/sandboxes/" + id_a + "/endpoints/44772", std::nullopt, auth);
  REQUIRE(direct.status == 200);
  CHECK(direct.json().at("headers") == json::object{{"X-EXECD-ACCESS-TOKEN", hmac_hex(key, id_a)}});
  const auto other =
      request(f.port(), "GET", "/v1/sandboxes/" + id_b + "/endpoints/44772", std::nullopt, auth);
  CHECK(other.json().at("headers").at("X-EXECD-ACCESS-TOKEN") == json::value(hmac_hex(key, id_b)));
  CHECK(hmac_hex(key, id_a) != hmac_hex(key, id_b));
  const auto proxied =
      request(f.port(), "GET", "/v1/sandboxes/" + id_a + "/endpoints/44772?use_server_proxy=true",
              std::nullopt, auth);
  CHECK(proxied.json().at("headers") ==
        json::object{{"X-EXECD-ACCESS-TOKEN", hmac_hex(key, id_a)}});
  // The list and the other new routes need the key too.
  CHECK(request(f.port(), "GET", "/v1/sandboxes").status == 401);
  CHECK(request(f.port(), "POST", "/v1/sandboxes/" + id_a + "/pause").status == 401);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id_a + "/endpoints/44772").status == 401);
  CHECK(f.log_text().find(key) == std::string::npos);
}

TEST_CASE("--max-sandboxes: a create beyond the cap answers 429 and creates nothing") {
  Fixture f({"--max-sandboxes", "2"});
  const std::string a = create(f.port(), "{}");
  create(f.port(), "{}");
  const auto refused = request(f.port(), "POST", "/v1/sandboxes", create_body("{}"));
  CHECK(refused.status == 429);
  CHECK(refused.json() == error_of("SANDBOX::TOO_MANY_SANDBOXES",
                                   "The server holds its maximum of 2 sandboxes; delete one "
                                   "first."));
  CHECK(f.sandboxes_on_disk() == 2);
  REQUIRE(request(f.port(), "DELETE", "/v1/sandboxes/" + a).status == 204);
  create(f.port(), "{}");  // room again
  CHECK(f.sandboxes_on_disk() == 2);
  std::string output;
  CHECK(run_to_exit({SBX_CLI, "serve", "--provider", "x", "--listen", "127.0.0.1:0",
                     "--max-sandboxes", "-1"},
                    output) == 2);
  CHECK(output.find("--max-sandboxes must be >= 0") != std::string::npos);
}

TEST_CASE("a provider without pause and renew: 501 SANDBOX::API_NOT_SUPPORTED, no hang") {
  Fixture f({}, /*v1_0_plugin=*/true);
  const std::string id = create(f.port(), "{}", "null");  // ABI 1.0 plugins keep no TTL
  // platform, volumes, networkPolicy and extensions go to the provider as provider_options; one
  // that takes none refuses them, in the envelope of an invalid parameter, with its own words.
  for (const char* field : {R"("platform":{"os":"linux","arch":"amd64"})",
                            R"("volumes":[{"name":"v","host":{"path":"/tmp"},"mountPath":"/v"}])",
                            R"("networkPolicy":{"defaultAction":"deny"})",
                            R"("extensions":{"imagePullPolicy":"IfNotPresent"})"}) {
    CAPTURE(field);
    std::string body = create_body("{}", "null");
    body.back() = ',';
    const auto r = request(f.port(), "POST", "/v1/sandboxes", body + field + "}");
    CHECK(r.status == 400);
    CHECK(r.json().at("code") == "SANDBOX::INVALID_PARAMETER");
    CHECK(std::string(r.json().at("message").as_string()).find("v1_0_processes takes no options") !=
          std::string::npos);
  }
  CHECK(ids_of(request(f.port(), "GET", "/v1/sandboxes")) == std::vector<std::string>{id});
  for (const char* op : {"pause", "resume"}) {
    CAPTURE(op);
    const auto r = request(f.port(), "POST", "/v1/sandboxes/" + id + "/" + op);
    CHECK(r.status == 501);
    CHECK(r.json().at("code") == "SANDBOX::API_NOT_SUPPORTED");
    CHECK(std::string(r.json().at("message").as_string()).find("sbx.pause/1") != std::string::npos);
  }
  const auto renew =
      request(f.port(), "POST", "/v1/sandboxes/" + id + "/renew-expiration",
              R"({"expiresAt":")" +
                  rfc3339(std::chrono::system_clock::now() + std::chrono::hours(1)) + R"("})");
  CHECK(renew.status == 501);
  CHECK(std::string(renew.json().at("message").as_string()).find("sbx.renew/1") !=
        std::string::npos);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + id).json().at("status").at("state") ==
        "Running");
  CHECK(ids_of(request(f.port(), "GET", "/v1/sandboxes")) == std::vector<std::string>{id});
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);

  // A state directory needs sbx.connect/1: refused at start.
  std::string output;
  CHECK(run_to_exit({SBX_CLI, "serve", "--config", f.config.string(), "--plugin-dir",
                     SBX_C_PLUGIN_DIR, "--provider", "p", "--listen", "127.0.0.1:0", "--state-dir",
                     (f.dir.path / "state").string()},
                    output) == 2);
  CHECK(output.find("cannot connect to existing sandboxes (sbx.connect/1)") != std::string::npos);
  CHECK(run_to_exit(
            {SBX_CLI, "serve", "--provider", "x", "--listen", "127.0.0.1:0", "--keep-on-stop"},
            output) == 2);
  CHECK(output.find("--keep-on-stop needs --state-dir") != std::string::npos);
}

TEST_CASE("--state-dir with --keep-on-stop: a restarted server serves the same ids") {
  TempDir state_holder;
  const std::string state = (state_holder.path / "state").string();
  Fixture f({"--state-dir", state, "--keep-on-stop"});
  const std::string a = create(f.port(), R"({"team":"infra"})");
  const std::string b = create(f.port(), "{}", "null");
  // A patched metadata is what the state directory keeps.
  REQUIRE(request(f.port(), "PATCH", "/v1/sandboxes/" + a + "/metadata",
                  std::string(R"({"team":null,"owner":"me"})"))
              .status == 200);
  const auto before = request(f.port(), "GET", "/v1/sandboxes/" + a);
  CHECK(before.json().at("metadata") == json::object{{"owner", "me"}});
  REQUIRE(before.status == 200);
  // One server per state directory.
  std::string output;
  CHECK(run_to_exit(
            {SBX_CLI, "serve", "--config", f.config.string(), "--plugin-dir", SBX_TEST_PLUGIN_DIR,
             "--provider", "p", "--listen", "127.0.0.1:0", "--state-dir", state},
            output) == 125);  // sbx: error: ...
  CHECK(output.find("is in use by another sbx serve") != std::string::npos);

  CHECK(f.server->stop() == 0);  // keeps them: they still exist
  CHECK(f.sandboxes_on_disk() == 2);
  CHECK(fs::exists(f.root / a));

  f.start({"--state-dir", state, "--keep-on-stop"});
  const auto after = request(f.port(), "GET", "/v1/sandboxes/" + a);
  REQUIRE(after.status == 200);
  CHECK(after.json() == before.json());  // image, metadata, entrypoint, times: all kept
  CHECK(ids_of(request(f.port(), "GET", "/v1/sandboxes")) == std::vector<std::string>{b, a});
  CHECK(request(f.port(), "POST", "/v1/sandboxes/" + a + "/pause").status == 202);
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + a).json().at("status").at("state") == "Paused");
  CHECK(request(f.port(), "DELETE", "/v1/sandboxes/" + b).status == 204);
  CHECK(!fs::exists(f.root / b));
  CHECK(f.server->stop() == 0);

  // A third server, now closing what it holds at its stop (no --keep-on-stop): a paused
  // sandbox found again is closed, and the state directory keeps no record.
  f.start({"--state-dir", state});
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + a).json().at("status").at("state") == "Paused");
  CHECK(request(f.port(), "GET", "/v1/sandboxes/" + b).status == 404);
  CHECK(f.server->stop() == 0);
  CHECK(f.sandboxes_on_disk() == 0);
  size_t records = 0;
  for (const auto& item : fs::directory_iterator(state))
    records += item.path().extension() == ".json" ? 1 : 0;
  CHECK(records == 0);
}
